"""The gcc toolchain: render low-level code to C, compile it into a shared object, load the
functions with ctypes. `cc_backend.CcBackend` links them into contexts and runs them.

Compiled objects are cached on disk by `cache.py`, keyed by a content hash of (source, flags,
compiler identity, CPU), so compiling a program that was compiled before — in this process or
an earlier one — loads the cached object without calling the compiler.

Calling convention of a routine (see `c_syntax.render_routine`): one pointer per non-local
array in node-id order, one pointer per merge buffer in node-id order, one `int` per static
binding in the order given at compilation. Linking prepares the pointer arguments once; a
routine call makes one ctypes call, which releases the GIL while the C code runs.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from einjit import config
from einjit.backends import cache
from einjit.backends.c_syntax import (
    C_SYNTAX,
    UNIT_MARK,
    CSyntax,
    MemClass,
    Param,
    ParamKind,
    render_program,
)
from einjit.backends.cc import elf_needed, openmp_env, thread_team
from einjit.backends.cc.compiler_identity import CompileError
from einjit.backends.cc.compiler_identity import identity as _compiler_identity
from einjit.backends.cc.compiler_identity import missing_compiler as _missing_compiler
from einjit.ir import low_level as ll
from einjit.ir.indexing import StaticSymbol
from einjit.ir.tnode import Tnode

_ABI_VERSION = "einjit-cc-2"
"""Changed when objects built from the same source and flags differ: 2, the translation units
of a split program are compiled with `-fopenmp` (objects of 1 ran their threads on one)."""
_MAX_DIAGNOSTICS = 8000


def _default_compiler() -> str:
    return os.environ.get("CC") or "gcc"


_VECTOR_MATH_PRELUDE = """\
#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__FAST_MATH__)
/* Let gcc vectorize math calls through glibc's libmvec (as -ffast-math would, without it). */
#define EINJIT_SIMD __attribute__((__simd__("notinbranch")))
EINJIT_SIMD float expf(float); EINJIT_SIMD double exp(double);
EINJIT_SIMD float logf(float); EINJIT_SIMD double log(double);
EINJIT_SIMD float sinf(float); EINJIT_SIMD double sin(double);
EINJIT_SIMD float cosf(float); EINJIT_SIMD double cos(double);
EINJIT_SIMD float powf(float, float); EINJIT_SIMD double pow(double, double);
#if __GLIBC_PREREQ(2, 35)
EINJIT_SIMD float exp2f(float); EINJIT_SIMD double exp2(double);
EINJIT_SIMD float log2f(float); EINJIT_SIMD double log2(double);
EINJIT_SIMD float tanhf(float); EINJIT_SIMD double tanh(double);
#endif
#endif
"""


def _has_libmvec() -> bool:
    return sys.platform.startswith("linux") and platform.machine() == "x86_64" and platform.libc_ver()[0] == "glibc"


@dataclass(frozen=True)
class CcOptions:
    """How to compile. `flags` and `libs` replace the defaults entirely when given.

    `-ffp-contract=off`: gcc does not fuse `a * b + c` on its own, because where it fuses
    depends on its vectorization choices, so results would change with loop order and differ
    from the interpreter. Fused multiply-adds are explicit in the IR (`Ternop.FMA`, which the
    simplifier introduces) and compile to FMA instructions under `-march=native`.

    `threads`: how many OpenMP threads the loops marked `parallel` run on (the outer loops of
    large contractions, marked by the scheduler; the outermost loop over output cells of every
    other nest big enough to pay, marked when rendering: `parallel_loops.thread_nests`); 1
    compiles without `-fopenmp` and renders no pragma.
    Default: `EINJIT_NUM_THREADS`, else the machine's core count. Idle threads spin for
    about 28 µs before they sleep (`openmp_env`: libgomp's default spins for milliseconds,
    and on a machine other processes keep busy a 2-thread GPT step then ran 10x slower than
    at 1 thread), unless the user sets `OMP_WAIT_POLICY` or `GOMP_SPINCOUNT`.

    `vector_math` lets gcc vectorize loops calling exp/log/sin/cos/pow/exp2/log2/tanh with
    glibc's libmvec (x86-64 glibc only; elsewhere it has no effect). Those vector variants
    are accurate to a few ulps rather than glibc's scalar < 1 ulp, and a scalar call in a
    loop gcc leaves unvectorized can differ from them in the last bit; turn it off for results
    that match the scalar math library exactly. `exp` in single precision is not among them:
    it is einjit's own inline function (`c_math`), the same bits vectorized or not.

    `-O2`, not `-O3`: gcc 12.2 at `-O3` miscompiles small vectorized reduction nests (a
    reduction into one cell after store motion, with if-converted conditionals: sums came out
    missing terms). At `-O2` gcc 12 still vectorizes with its cheap cost model, and the
    benchmarks (`benchmarks/bench_core.py`) lose little.

    `-fno-tree-pre -fno-code-hoisting` switch off gcc's partial-redundancy elimination pass
    (it runs while either is on). Its alias-chain walks grow faster than the function: a
    training step is one function of dozens of nests, and in the MNIST-size convnet step the
    pass took a third of gcc's time (0.94 -> 0.72 s). It finds nothing left to do in the
    scheduled nests (loop-invariant motion still runs): matmuls, the MLP and convnet steps ran
    at the same speed side by side with and without it.

    `-fno-thread-jumps`: where a loop computes `exp(where(mask, x, 0))` (the masked softmax
    of a causal attention), jump threading gave the masked path its own copy of the loop body,
    in which einjit's inline `exp` of the constant 0 folds to 1: the store then had two
    addresses, and gcc vectorized neither path. The softmax nest of the GPT step ran 3x
    faster without it (0.96 -> 0.31 ms compiled alone), and it was the only function of the
    2-block step whose code changed.

    `outline_min_nests`: a routine of at least this many top-level loop nests is rendered as
    one function per nest, nests that differ only in their arrays as one function
    (`c_outline`), spread over `jobs` translation units that gcc compiles at once (default:
    one per core). gcc's time on one function grows faster than the function; the MLP and
    convnet steps (55 and 66 nests) stay one function, a transformer step (a hundred nests
    or more per block) is outlined. 0 never outlines.

    No lower `-O` level for large routines: outlined, the largest function is one nest
    (at most ~0.5 s of gcc), and what costs is the number of distinct nests. Measured on the
    outlined 4-block GPT step (63 functions, 3 units), gcc CPU: `-O2` 3.2 s, `-O1` 2.6 s,
    `-O2 -fno-tree-slp-vectorize` 2.9 s, `-O2 -fno-ivopts` 3.2 s; and `-O1` on the 2-block
    step saved a third of gcc's time (3.5 -> 2.3 s) but the step ran 4.7x slower (611 vs
    130 ms: no vectorization). Even the routine's own unit (the nests' calls and the
    statements outside nests) keeps `-O2`: at `-O1` its loss reduction called the scalar
    `logf` instead of libmvec's vector one, and the loss changed in the last bit. The one
    routine that would need a lower level, a GPT step as a single function (4 blocks: 124 s
    of gcc), is outlined past `outline_min_nests` instead.

    `routine_unit_flags` are added for the routine's own unit of an outlined program: one
    function of a call per nest, a `memset` per zeroed array, the compiler barriers of the
    scratch plan and a few statements outside nests. It grows with depth, and gcc's
    points-to analysis and dead-store elimination grow faster than it: in the 12-block
    GPT-2-small step that unit took 4.2 s of gcc against 1.25 s for each nest unit, and the
    other cores waited for it. Without the two passes it took 2.6 s, and the instructions
    were the same (compared with objdump for the 1-, 4- and 12-block steps): there is
    nothing in it for them to find, the nests' own code keeps them. Nor for the RTL
    dead-store elimination (`-fno-dse`), the largest of its late passes: the 12-block step's
    unit 2.3-3.2 -> 1.7-2.1 s, the same instructions (objdump, the 4- and 12-block steps, the
    AdamW step, a `models.GPT` step and the 4-block step at 2 threads).
    """

    compiler: str = field(default_factory=_default_compiler)
    flags: tuple[str, ...] = ("-O2", "-march=native", "-fPIC", "-shared", "-fno-math-errno",
                              "-fno-trapping-math", "-ffp-contract=off", "-fno-tree-pre", "-fno-code-hoisting",
                              "-fno-thread-jumps")
    libs: tuple[str, ...] = ("-lm",)
    keep_source: bool = False
    vector_math: bool = True
    syntax: CSyntax = C_SYNTAX
    threads: int = field(default_factory=lambda: default_threads())
    outline_min_nests: int = 96
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)
    routine_unit_flags: tuple[str, ...] = ("-fno-tree-pta", "-fno-tree-dse", "-fno-dse")

    def effective_syntax(self) -> CSyntax:
        syntax = dataclasses.replace(self.syntax, num_threads=self.threads) if self.threads > 1 else self.syntax
        if self.outline_min_nests and not syntax.outline_min_nests:
            syntax = dataclasses.replace(syntax, outline_min_nests=self.outline_min_nests, units=self.jobs)
        if self.vector_math and _has_libmvec():
            return dataclasses.replace(syntax, prelude=syntax.prelude + _VECTOR_MATH_PRELUDE)
        return syntax

    def openmp_flags(self) -> tuple[str, ...]:
        """`-fopenmp` when compiling for several threads: gcc needs it when it compiles a unit
        (without it the pragmas are ignored and the code runs on one thread) and when it links."""
        return ("-fopenmp",) if self.threads > 1 else ()

    def effective_libs(self) -> tuple[str, ...]:
        """The libraries, with `openmp_flags` (gcc takes them at any position of its one
        compile-and-link command)."""
        return self.openmp_flags() + (("-lmvec",) if self.vector_math and _has_libmvec() else ()) + self.libs


def default_threads() -> int:
    """`EINJIT_NUM_THREADS` if set, else the machine's core count."""
    value = os.environ.get("EINJIT_NUM_THREADS", "").strip()
    if not value:
        return os.cpu_count() or 1
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise CompileError(f"einjit: EINJIT_NUM_THREADS must be a positive integer, got {value!r}")
    return threads


stats = cache.CacheStats()
"""The gcc toolchain's cache counters (tests check that a cached program runs no compiler)."""


@dataclass(frozen=True, eq=False)
class Procedure:
    """A compiled routine: its source (the whole translation unit it was compiled in), its
    parameters in calling order, the shared object and the loaded C function."""

    name: str
    source: str
    params: tuple[Param, ...]
    bindings: tuple[StaticSymbol, ...]
    so_path: Path
    function: Callable = field(repr=False)
    source_path: Path | None = None

    def mem_class(self, tn: Tnode) -> MemClass | None:
        """How this procedure stores `tn` (None if it does not touch it or it is Local_only)."""
        for p in self.params:
            if p.kind is ParamKind.ARRAY and p.tn is tn:
                return p.mem
        return None


# ---------------------------------------------------------------- compiling


@functools.lru_cache(maxsize=None)
def _host_identity() -> str:
    """The CPU the objects are built for: `-march=native` output must not be reused on a
    machine with other instruction-set extensions sharing the cache directory."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()} {flags.strip()}"


def target_identity(options: CcOptions) -> str:
    """What decides the speed of compiled code besides its source: the compiler, its flags
    and libraries, and the host CPU (the key of measured choices, such as `ir/sched/search.py`'s)."""
    return "\n".join((_compiler_identity(options.compiler), _command_flags(options), str(options.threads),
                      _host_identity()))


def _command_flags(options: CcOptions) -> str:
    """Every flag that decides the object, as the compiled-object and program caches key it."""
    team = (thread_team.key(),) if _links_team(options) else ()
    return " ".join(options.flags + options.effective_libs() + options.routine_unit_flags + team)


def _links_team(options: CcOptions) -> bool:
    """Whether the object links einjit's thread team (`thread_team`) for its OpenMP calls."""
    return options.threads > 1 and thread_team.enabled()


def compile_source(source: str, *, label: str, options: CcOptions | None = None) -> cache.CompiledObject:
    """The gcc toolchain's `compile(source, options)`: the shared object for C `source`, from
    the cache or freshly compiled (`label` names it in messages)."""
    options = options or CcOptions()
    identity = _compiler_identity(options.compiler)
    cmd_flags = _command_flags(options)
    config.debug(3, f"cc: generated C for {label}:\n{source}")
    return cache.get_or_build("cc", [_ABI_VERSION, identity, _host_identity(), cmd_flags, source],
                              suffix=".so", source=source, source_suffix=".c", stats=stats, label=label,
                              keep_source=options.keep_source or config.debug_level() >= 3,
                              build=lambda out, src, kept: _compile(out, src, kept, label, options))


_loaded: dict[Path, ctypes.CDLL] = {}
_loaded_lock = threading.Lock()


@functools.cache
def _private_dir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="einjit-load-")


def load_library(built: cache.CompiledObject) -> ctypes.CDLL:
    """The shared object `built` as the cache validated it. The dynamic loader opens by path,
    and a shared cache directory's file can be replaced after it was checked, so the checked
    bytes are copied into this process's private (0700) directory and loaded from there; the
    copy is removed once mapped. One load per cached object and process."""
    with _loaded_lock:
        lib = _loaded.get(built.path)
        if lib is None:
            _prepare_runtime(built.data)
            private = Path(_private_dir().name) / built.path.name
            private.write_bytes(built.data)
            try:
                lib = ctypes.CDLL(str(private))
            finally:
                private.unlink()
            _loaded[built.path] = lib
        return lib


def _prepare_runtime(data: bytes) -> None:
    """Before a program loads, what its threads run on: libgomp with einjit's wait setting
    (`openmp_env.prepare`) if it needs libgomp, einjit's thread team (`thread_team.load`) if
    it needs the team; both where its needs cannot be read."""
    needs = elf_needed.needed(data)
    if needs is None or openmp_env.LIBGOMP in needs:
        openmp_env.prepare()
    if thread_team.soname() in (needs or ()) or needs is None and thread_team.enabled():
        thread_team.load(CcOptions().compiler)


def library(so_path: Path) -> ctypes.CDLL:
    """The library `load_library` loaded for the cached object at `so_path`."""
    with _loaded_lock:
        return _loaded[so_path]


def _compile(so_path: Path, c_path: Path, kept: Path, label: str, options: CcOptions) -> None:
    """Run the compiler on the source at `c_path` into `so_path`; on failure raise with the
    diagnostics, naming `kept`, where the cache keeps the source. A source of several
    translation units (separated by `c_syntax.UNIT_MARK`) is compiled unit by unit, all at
    once (gcc is one process per unit: the jobs run on as many cores as there are units),
    then linked."""
    start = time.perf_counter()
    units = c_path.read_text(encoding="utf-8").split(UNIT_MARK)
    team = thread_team.link_inputs(options.compiler) if _links_team(options) else ()
    if len(units) == 1:
        _link_on_one_runtime(lambda team: _run([[options.compiler, *options.flags, "-o", str(so_path), str(c_path),
                                                 *team, *options.effective_libs()]], kept, label, options),
                             team, so_path, label)
    else:
        with tempfile.TemporaryDirectory(dir=c_path.parent, prefix=".units-") as tmp:
            paths = [Path(tmp) / f"unit{k}.c" for k in range(len(units))]
            for path, text in zip(paths, units, strict=True):
                path.write_text(text, encoding="utf-8")
            flags = [f for f in options.flags if f != "-shared"]
            _run([[options.compiler, *flags, *options.openmp_flags(), *(options.routine_unit_flags if k == 0 else ()),
                   "-c", "-o",
                   str(p.with_suffix(".o")), str(p)] for k, p in enumerate(paths)], kept, label, options)
            objects = [str(p.with_suffix(".o")) for p in paths]
            _link_on_one_runtime(lambda team: _run([[options.compiler, *options.flags, "-o", str(so_path), *objects,
                                                     *team, *options.effective_libs()]], kept, label, options),
                                 team, so_path, label)
    if not so_path.exists():
        raise CompileError(f"einjit: {options.compiler} produced no shared object compiling {label}; the generated "
                           f"source is kept at {kept}")
    config.debug(1, f"cc: {label}: compiled in {(time.perf_counter() - start) * 1000:.1f} ms")


def _link_on_one_runtime(link: Callable[[tuple[str, ...]], None], team: tuple[str, ...], so_path: Path,
                         label: str) -> None:
    """Link with einjit's thread team (`team`, its link inputs) where asked, and keep the result only
    if every OpenMP call of the program binds to it: a construct the team does not define (a new
    pragma, another gcc's lowering) would bind to libgomp, and the two runtimes must never share
    a program (libgomp's `omp_get_thread_num` inside the team's region answers 0 to every
    thread, so both would compute the same rows). Such a program is linked on libgomp alone."""
    link(team)
    missing = thread_team.unbound_calls(so_path) if team else ()
    if missing:
        config.debug(1, f"cc: {label}: einjit's thread team lacks {', '.join(missing)}; linked on libgomp instead")
        link(())


def _run(cmds: list[list[str]], kept: Path, label: str, options: CcOptions) -> None:
    """Run the compiler commands concurrently; on a failure raise with its diagnostics."""
    for cmd in cmds:
        config.debug(3, f"cc: {' '.join(cmd)}")
    try:
        running = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for cmd in cmds]
    except OSError as e:
        _compiler_identity.cache_clear()
        raise _missing_compiler(options.compiler, e) from e
    results = [(cmd, proc.returncode, out + err) for cmd, proc in zip(cmds, running, strict=True)
               for out, err in [proc.communicate()]]
    for cmd, code, output in results:
        if code != 0:
            diagnostics = output.strip()
            if len(diagnostics) > _MAX_DIAGNOSTICS:
                diagnostics = diagnostics[:_MAX_DIAGNOSTICS] + "\n... (diagnostics truncated)"
            raise CompileError(
                f"einjit: {options.compiler} failed (exit {code}) compiling {label}; the generated "
                f"source is kept at {kept}\ncommand: {' '.join(cmd)}\n{diagnostics}")


def _unwrap(llc) -> ll.LLStmt:
    """Accept the optimizer's result (anything with `.llc`) as well as bare low-level code."""
    return getattr(llc, "llc", llc)


def compile_batch(routines: Sequence[tuple[str, ll.LLStmt]], *, bindings: Sequence[StaticSymbol] = (),
                  options: CcOptions | None = None) -> list[Procedure]:
    """Compile several routines into one shared object with one compiler call; every routine
    takes all of `bindings` as its trailing `int` parameters."""
    options = options or CcOptions()
    if not routines:
        return []
    start = time.perf_counter()
    program = render_program([(n, _unwrap(c)) for n, c in routines], tuple(bindings),
                             options.effective_syntax())
    rendered_at = time.perf_counter()
    label = ", ".join(n for n, _ in routines)
    built = compile_source(program.source, label=label, options=options)
    so_path, c_path = built.path, built.source_path
    lib = load_library(built)
    for r in program.routines:
        config.dump(r.name, "", "c", program.source)
    procs = []
    for r in program.routines:
        fn = lib[r.name]
        fn.restype = None
        procs.append(Procedure(r.name, program.source, r.params, tuple(bindings), so_path, fn, c_path))
    config.debug(1, f"cc: {label}: render {1000 * (rendered_at - start):.1f} ms, "
                    f"total {1000 * (time.perf_counter() - start):.1f} ms")
    return procs


def compile_proc(llc: ll.LLStmt, *, name: str, bindings: Sequence[StaticSymbol] = (),
                 options: CcOptions | None = None) -> Procedure:
    """Compile one routine (its own shared object, shared by all contexts that link it)."""
    return compile_batch([(name, llc)], bindings=bindings, options=options)[0]
