"""A profiler of compiled routines: the time of each top-level loop nest.

`instrument` wraps every top-level loop nest of optimized code between two reads of the
monotonic clock and adds the difference to one cell of a hosted `profile` node (one cell per
nest, and a last one counting calls). The nests themselves are unchanged, so the variant
computes the same values; the clock costs about 50 ns a nest, which matters only for nests
of a few hundred operations. `ProfileReport` turns the counters into a table: per nest, the
tensors it writes, its time per call, its share of the routine's time, and its arithmetic
and memory rates from operation and byte counts taken from the code (a nest's arithmetic:
the operations of each assignment times its loops' trip counts, a fused multiply-add
counting two; its bytes: each array it touches outside its own registers, once).

`train.to_routine` hands out the variant when `EINJIT_PROFILE=1` (the table of all calls
is printed when the process exits), and `Routine.profile(runs)` compiles it on demand.
"""

from __future__ import annotations

import atexit
import dataclasses
import difflib
import functools
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from einjit.backends import parallel_loops
from einjit.backends.c_syntax import CSyntax
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import FixedIdx, IntRef, StaticSymbol
from einjit.ir.passes.local_storage import is_routine_local
from einjit.ir.tnode import Tnode, hosted

__all__ = ["NestInfo", "ProfileReport", "ThreadScaling", "instrument", "profiled", "profiling_syntax", "report"]

_NOW = """\
static inline double einjit_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
"""


def profiling_syntax(syntax: CSyntax) -> CSyntax:
    """`syntax` with the clock the instrumented code reads."""
    return dataclasses.replace(syntax, includes=(*syntax.includes, "time.h"), prelude=syntax.prelude + _NOW)


@dataclass(frozen=True)
class NestInfo:
    """What the table says about a nest besides its time."""

    index: int
    writes: tuple[str, ...]
    flops: int
    bytes: int


@dataclass(frozen=True)
class ProfileReport:
    """Seconds per nest summed over `calls` calls of the routine; `routine_seconds`: the whole
    routine's, so that what no nest accounts for (fork-joins outside nests, statements between
    nests) shows too."""

    routine: str
    nests: tuple[NestInfo, ...]
    seconds: tuple[float, ...]
    calls: int
    routine_seconds: float = 0.0

    def rows(self) -> list[dict]:
        total = sum(self.seconds) or 1.0
        out = []
        for nest, sec in zip(self.nests, self.seconds, strict=True):
            per_call = sec / max(self.calls, 1)
            out.append({"nest": nest.index, "writes": nest.writes, "seconds": per_call, "share": sec / total,
                        "gflops": nest.flops / per_call / 1e9 if per_call > 0 and nest.flops else None,
                        "gbytes": nest.bytes / per_call / 1e9 if per_call > 0 and nest.bytes else None})
        return out

    def outside(self) -> float:
        """Seconds per call of the routine outside its timed nests."""
        return max(0.0, self.routine_seconds - sum(self.seconds)) / max(self.calls, 1)

    def __str__(self) -> str:
        rows = self.rows()
        total = sum(r["seconds"] for r in rows)
        lines = [f"profile of {self.routine}: {len(rows)} nests, {total * 1e3:.3f} ms per call "
                 f"over {self.calls} calls, {self.outside() * 1e3:.3f} ms outside them",
                 f"{'nest':>5}  {'writes':<32} {'ms/call':>9} {'share':>6} {'GFLOP/s':>8} {'GB/s':>7}"]
        for r in sorted(rows, key=lambda r: -r["seconds"]):
            rate = "" if r["gflops"] is None else f"{r['gflops']:8.2f}"
            bw = "" if r["gbytes"] is None else f"{r['gbytes']:7.2f}"
            lines.append(f"{r['nest']:>5}  {_label(r['writes']):<32} {r['seconds'] * 1e3:9.4f} "
                         f"{r['share'] * 100:5.1f}% {rate:>8} {bw:>7}")
        return "\n".join(lines)


def _label(writes: tuple[str, ...]) -> str:
    text = ", ".join(writes) or "-"
    return text if len(text) <= 32 else text[:29] + "..."


@dataclass(frozen=True)
class ThreadScaling:
    """One routine profiled at one thread (`one`) and at `threads` (`many`), nest by nest: the
    same optimized code, so nest `k` is the same nest in both. `str()` is the table, nests by
    the time they take at `threads`, each with its speed-up; a nest slower than at one thread,
    or serial, is where the threads' time goes."""

    one: ProfileReport
    many: ProfileReport
    threads: int

    def rows(self) -> list[dict]:
        """Nests paired in order, by what they write where the counts differ: threads may
        split a nest in two (a bias gradient's column sums moved after its nest), and the
        nests' names of intermediate tensors may differ. Between two nests that match, the
        nests are paired in order, and those left over (a split's second part) have no
        partner (their time at the other count is 0)."""
        one, many = self.one.rows(), self.many.rows()
        if len(one) == len(many):
            return [_pair(a, b) for a, b in zip(one, many, strict=True)]
        label = [r["writes"] for r in one], [r["writes"] for r in many]
        out = []
        for _, i0, i1, j0, j1 in difflib.SequenceMatcher(None, *label, autojunk=False).get_opcodes():
            n = min(i1 - i0, j1 - j0)
            out += [_pair(a, b) for a, b in zip(one[i0:i0 + n], many[j0:j0 + n], strict=True)]
            out += [_pair(a, None) for a in one[i0 + n:i1]] + [_pair(None, b) for b in many[j0 + n:j1]]
        return out

    def __str__(self) -> str:
        rows = self.rows()
        one = sum(r["one"] for r in rows) + self.one.outside()
        many = sum(r["many"] for r in rows) + self.many.outside()
        lines = [f"{self.many.routine}: {one * 1e3:.3f} ms at 1 thread, {many * 1e3:.3f} ms at {self.threads} "
                 f"({one / many if many else 0:.2f}x)",
                 f"{'nest':>5}  {'writes':<32} {'ms 1t':>8} {f'ms {self.threads}t':>8} {'speed-up':>8}"]
        for r in sorted(rows, key=lambda r: -r["many"]):
            speedup = "" if r["speedup"] is None else f"{r['speedup']:7.2f}x"
            lines.append(f"{r['nest']:>5}  {_label(r['writes']):<32} {r['one'] * 1e3:8.4f} {r['many'] * 1e3:8.4f} "
                         f"{speedup:>8}")
        o1, om = self.one.outside(), self.many.outside()
        lines.append(f"{'':>5}  {'(outside nests)':<32} {o1 * 1e3:8.4f} {om * 1e3:8.4f}")
        return "\n".join(lines)


def _pair(a: dict | None, b: dict | None) -> dict:
    one, many = (a or {}).get("seconds", 0.0), (b or {}).get("seconds", 0.0)
    first = a or b
    assert first is not None
    return {"nest": first["nest"] if a else f"+{first['nest']}", "writes": first["writes"], "one": one,
            "many": many, "speedup": one / many if a and b and many > 0 else None}


def instrument(llc: ll.LLStmt, routine: str) -> tuple[ll.LLStmt, Tnode, tuple[NestInfo, ...]]:
    """The instrumented code, its `profile` node (seconds per nest, then seconds per call of
    the whole routine, then the call count: hosted, so it keeps adding up across calls) and
    what is known of each nest. The clock reads are `parallel_loops.NEST_TIMER` statements:
    inside a region that threads share, each is read by one thread after a barrier, so a nest
    run as an `omp for nowait` is charged with the time until every thread is done with it."""
    top = list(ll.flatten(llc))
    loops = [s for s in top if isinstance(s, ll.ForLoop)]
    prof = Tnode(f"{routine}_profile", (len(loops) + 2,), ops.double)
    prof.update_memory_mode(hosted(), 0)
    out: list[ll.LLStmt] = [ll.StagedCompilation(lambda: "double einjit_t0, einjit_start = einjit_now();")]
    infos: list[NestInfo] = []
    for s in top:
        if not isinstance(s, ll.ForLoop):
            out.append(s)
            continue
        k = len(infos)
        infos.append(NestInfo(k, _writes(s), _flops(s, 1), _bytes(s)))
        out += [ll.StagedCompilation(_start_time), s, ll.StagedCompilation(functools.partial(_add_time, prof, k))]
    last = (FixedIdx(len(loops) + 1),)
    out.append(ll.StagedCompilation(functools.partial(_add_time, prof, len(loops), "einjit_start")))
    out.append(ll.Set(prof, last, ll.Binop(ops.Binop.ADD, ll.Get(prof, last), ll.Constant(1.0)), "calls"))
    return ll.seq(*out), prof, tuple(infos)


def _start_time() -> str:
    return f"einjit_t0 = einjit_now(); {parallel_loops.NEST_TIMER}"


def _add_time(prof: Tnode, k: int, since: str = "einjit_t0") -> str:
    return f"{prof.name}[{k}] += einjit_now() - {since}; {parallel_loops.NEST_TIMER}"


def report(routine: str, prof_values, nests: tuple[NestInfo, ...]) -> ProfileReport:
    return ProfileReport(routine, nests, tuple(float(v) for v in prof_values[:-2]), int(prof_values[-1]),
                         float(prof_values[-2]))


def _writes(loop: ll.ForLoop) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for s in ll.iter_stmts(loop):
        if isinstance(s, (ll.Set, ll.SetFromVec, ll.ZeroOut)) and _in_memory(s.tn):
            seen.setdefault(".".join(s.tn.label) or s.tn.name)
    return tuple(seen)


def _in_memory(tn: Tnode) -> bool:
    """Arrays in memory, as opposed to the scheduler's register blocks and panels."""
    return not tn.is_local() or is_routine_local(tn)


def _bytes(loop: ll.ForLoop) -> int:
    nodes = {tn for tn in ll.nodes_of(loop) if _in_memory(tn)}
    return sum(tn.size * tn.prec.itemsize for tn in nodes)


def _flops(stmt: ll.LLStmt, trips: int) -> int:
    total = 0
    for s in ll.flatten(stmt):
        match s:
            case ll.ForLoop(_, from_, to_, body, _):
                total += _flops(body, trips * max(to_ - from_ + 1, 0))
            case ll.Set(_, _, value, _) | ll.SetLocal(_, value):
                total += _scalar_flops(value, trips)
    return total


def _scalar_flops(sc: ll.LLScalar, trips: int) -> int:
    total = 0
    for x in ll.iter_scalars(sc):
        match x:
            case ll.Ternop(ops.Ternop.FMA, _, _, _):
                total += 2 * trips
            case ll.Binop() | ll.Unop() | ll.Ternop():
                total += trips
            case ll.LocalScope(_, body, _):
                total += _flops(body, trips)
    return total


def profiled(routine: Any, backend: Any, refs: Mapping[StaticSymbol, IntRef], lowered: Callable[[], Any], name: str,
             *, instrumented_now: bool) -> Any:
    """`routine` with a profiler (`Routine.profile`); with `instrumented_now`, the routine
    returned is the instrumented variant itself, and the table of its calls is printed when
    the process exits (`EINJIT_PROFILE=1`). `lowered()` gives the routine's optimized code
    (a routine from the program cache has none until asked)."""
    from einjit import backends
    from einjit.backends.cc.backend import CcBackend
    from einjit.backends.interface import load_inputs, low_level_of

    if not isinstance(backend, CcBackend):
        return routine
    options = backend.simple.options  # type: ignore[attr-defined]  # a CcBackend's simple backend is CcSimpleBackend
    variant: list[Any] = []
    context = routine.context
    instrumented: list[tuple[ll.LLStmt, Tnode, tuple[NestInfo, ...]]] = []

    def parts() -> tuple[ll.LLStmt, Tnode, tuple[NestInfo, ...]]:
        if not instrumented:
            instrumented.append(instrument(low_level_of(lowered()), name))
        return instrumented[0]

    def build() -> Any:
        code = parts()[0]
        if not variant:
            compiler = backends.with_options(backend, dataclasses.replace(
                options, syntax=profiling_syntax(options.syntax)))
            compiled = compiler.compile(tuple(refs), code, shared=True, name=name)
            load_inputs(context, compiled.inputs)
            variant.append(compiler.link(context, compiled, refs))
        return variant[0]

    def counters() -> ProfileReport:
        _, prof, nests = parts()
        context.to_host(prof)
        return report(name, prof.host_array(), nests)

    def profile(runs: int) -> ProfileReport:
        run = build()
        prof = parts()[1]
        if not instrumented_now:
            prof.host_array()[...] = 0.0
            context.from_host(prof)
        for _ in range(runs):
            run()
        return counters()

    if not instrumented_now:
        return dataclasses.replace(routine, profiler=profile)
    atexit.register(lambda: print(counters(), file=sys.stderr))
    return dataclasses.replace(build(), profiler=profile)
