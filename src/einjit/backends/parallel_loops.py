"""Which loops of low-level code can run their iterations in parallel.

A loop is parallel when its iterations are independent: every shared node its body writes
is sliced by the loop's index at one axis in all its accesses (the index itself, or blocks
of it: `16*p + l` with `l` < 16), and the private nodes (given by the caller: per-thread or
per-iteration scratch) are written before they are read. The CUDA backend spreads such loops
over a grid; the C backend, at more than one thread, runs one such loop of every top-level
nest big enough to pay on OpenMP threads (`thread_nests`): pointwise and reduction nests,
convolutions and their gradients, attention's batch × heads. The loop moves outside serial
loops above it (one fork-join per nest), is chosen so threads do not write one cache line,
and takes the parallel loops right inside it along where its iterations split unevenly.
A nest whose rows are summed (a bias gradient fused with a backward) shares out chunks of its
column loops instead (`_split_columns`); a nest the scheduler threads inside (a weight
gradient's panels) gets the packs beside its threaded loops on threads too (`_team_parts`).
Consecutive threaded nests share one parallel region (`shared_regions`).

Only loops over output cells are threaded: a loop summed into one cell is never parallel
(its cell is not sliced by the loop's index), so each cell is computed by one thread in the
order of the 1-thread code and results are bit-identical at any thread count.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator as PyIterator
from dataclasses import dataclass

from einjit.backends import sum_fission
from einjit.ir import low_level as ll
from einjit.ir import provenance
from einjit.ir.indexing import Affine, AxisIndex, Iterator, Symbol, gather_indices, get_symbol, make_affine, subst_index
from einjit.ir.passes.local_storage import is_routine_local
from einjit.ir.sched import nests
from einjit.ir.tnode import Tnode

__all__ = ["BLOCKED_WORK_FACTOR", "CHUNK_WORK", "ROUTINE_WORK_FACTOR", "SHARED_RUN_BYTES", "SHARED_ZERO_BYTES",
           "THREAD_MIN_WORK", "ZERO_PIECE_BYTES", "Access", "Region", "Unit", "accesses", "chunk", "collapsed",
           "is_parallel", "opaque", "parallel_chain", "reads", "run_bytes", "scheduler_locals", "shared_regions",
           "sliced_nodes", "slicing", "thread_nests", "work"]

THREAD_MIN_WORK = 1 << 15
"""Assignments a loop must run (one execution of it) to be put on threads: about 10 µs of
pointwise work, several times a fork-join (1-2 µs with libgomp's spinning threads)."""

BLOCKED_WORK_FACTOR = 16
"""A register-blocked contraction's assignments are lanes of vector multiply-adds, a small
fraction of a pointwise assignment's time each: its nest goes on threads from 16 times the
work (512K multiply-adds, about 10 µs). The scheduler threads contractions from a
millisecond (`Blocking.parallel_min_work`); between the two, a convolution threads here.
A reduction's partial sums (a register block of one row: `lanes`) are not such a block: each
of its lanes adds a value read once, streamed like a pointwise assignment's (a convolution's
bias gradient reads 1.4 MB for 346K lanes of adds), so it goes on threads like one."""

SHARED_RUN_BYTES = 1024
"""Below this many contiguous bytes written per iteration (`run_bytes`), a threaded loop's
neighbouring iterations share many cache lines: a convolution threaded over its output rows
(26 floats each) writes lines another thread writes too, where its batch blocks (16 images)
do not. Another parallel loop of the nest is taken instead, if there is one that splits evenly."""

SHARED_ZERO_BYTES = 1 << 17
"""A zero fill (`ZeroOut`) of at least this many bytes in a parallel region is shared by the
threads in pieces of `ZERO_PIECE_BYTES` (a convnet's gradient arrays are 1.4 MB, 100 µs or
so of one core's stores), not left to one thread while the others wait."""

ZERO_PIECE_BYTES = 1 << 16

ROUTINE_WORK_FACTOR = 4
"""A routine goes on threads only where its threaded nests run at least this many times
`THREAD_MIN_WORK` each on average (128K assignments, a register-blocked contraction's counted
at 1/`BLOCKED_WORK_FACTOR`): each call may have to wake threads that slept between calls
(`cc/team.c`, or libgomp's `openmp_env.SPIN_COUNT`), and each threaded nest ends at a barrier
whose next nest reads rows the other thread wrote. The MLP 2-32-32-1 step at B=1024 (6 threaded nests, 0.47M
together) was slower at 2 threads than at 1; bias + GELU forward and backward at 1024 x 512
(2 nests, 0.52M) and a convnet step (13 nests, 4.7M) are not small. A nest the scheduler
threads (a contraction of a millisecond or more) is enough alone."""

CHUNK_WORK = 2048
"""Assignments a thread takes at once from a threaded loop with light iterations (a loop over
single cells): each hand-out is an atomic operation, and a loop split into single iterations
would not be vectorized."""


@dataclass(frozen=True, slots=True)
class Access:
    tn: Tnode
    idcs: tuple[AxisIndex, ...] | None
    write: bool
    vector: bool = False


def accesses(stmt: ll.LLStmt) -> PyIterator[Access]:
    """Array accesses in execution order (a statement's reads before its write). Merge
    buffers are read-only during a routine and are left out. The ids array of a run-time
    index is read where the index is used."""
    for s in ll.flatten(stmt):
        match s:
            case ll.ForLoop(body=body):
                yield from accesses(body)
            case ll.Set(tn, idcs, sc, _):
                yield from reads(sc)
                yield from _index_reads(idcs)
                yield Access(tn, idcs, True)
            case ll.SetFromVec(tn, idcs, _, _, arg, _):
                yield from reads(arg)
                yield Access(tn, idcs, True, vector=True)
            case ll.SetLocal(_, sc):
                yield from reads(sc)
            case ll.ZeroOut(tn):
                yield Access(tn, None, True)


def reads(sc: ll.LLScalar) -> PyIterator[Access]:
    for x in ll.iter_scalars(sc):
        match x:
            case ll.Get(tn, idcs):
                yield from _index_reads(idcs)
                yield Access(tn, idcs, False)
            case ll.LocalScope(body=body):
                yield from accesses(body)


def _index_reads(idcs: tuple[AxisIndex, ...]) -> PyIterator[Access]:
    for g in gather_indices(idcs):
        yield Access(g.ids, g.idcs, False)


def is_parallel(loop: ll.ForLoop, private: set[Tnode]) -> bool:
    """Iterations of `loop` are independent: each shared node the body writes is sliced by
    the loop's index at one axis in all its accesses (`_blocks`); private nodes are written
    before they are read."""
    return slicing(loop, private) is not None


def slicing(loop: ll.ForLoop, private: set[Tnode]) -> dict[Tnode, set[tuple[int, int]]] | None:
    """For a parallel `loop` (`is_parallel`), the (axis, block size) pairs at which it slices
    each shared node its body writes; None when the loop is not parallel."""
    if loop.to_ < loop.from_ or loop.start or loop.stop or opaque(loop.body):
        return None
    found = list(accesses(loop.body))
    inner = {s.index: (s.from_, s.to_) for s in ll.iter_stmts(loop.body) if isinstance(s, ll.ForLoop)}
    axes: dict[Tnode, set[tuple[int, int]]] = {}
    written = {a.tn for a in found if a.write and a.tn not in private}
    first_private: dict[Tnode, Access] = {}
    for a in found:
        if a.tn in private:
            first_private.setdefault(a.tn, a)
            continue
        if a.tn not in written:
            continue
        if a.idcs is None:
            return None
        cand = _blocks(a, loop.index, inner)
        axes[a.tn] = axes[a.tn] & cand if a.tn in axes else cand
        if not axes[a.tn]:
            return None
    return axes if all(a.write for a in first_private.values()) else None


def sliced_nodes(loop: ll.ForLoop) -> set[Tnode]:
    """The nodes the body of a parallel `loop` writes in the iteration's own block of one axis
    in all their accesses (`_blocks`): threads sharing one copy write disjoint cells. Only for
    a loop shared out alone: in a collapsed group (`collapsed`) threads split its iterations."""
    if len(collapsed(loop)) > 1:
        return set()
    found = list(accesses(loop.body))
    written = {a.tn for a in found if a.write}
    inner = {s.index: (s.from_, s.to_) for s in ll.iter_stmts(loop.body) if isinstance(s, ll.ForLoop)}
    axes: dict[Tnode, set[tuple[int, int]]] = {}
    for a in found:
        if a.tn not in written:
            continue
        cand = set() if a.idcs is None else _blocks(a, loop.index, inner)
        axes[a.tn] = axes[a.tn] & cand if a.tn in axes else cand
    return {tn for tn, blocks in axes.items() if blocks}


def run_bytes(axes: dict[Tnode, set[tuple[int, int]]]) -> int:
    """The shortest run of contiguous bytes one iteration writes of a node (`slicing`'s
    `axes`): where it is shorter than a few cache lines, threads taking neighbouring
    iterations write the same lines (false sharing)."""
    runs = [max(c * math.prod(tn.dims[p + 1:]) for p, c in blocks) * tn.prec.itemsize for tn, blocks in axes.items()]
    return min(runs, default=1 << 62)


def _blocks(a: Access, here: Symbol, inner: dict[Symbol, tuple[int, int]]) -> set[tuple[int, int]]:
    """The (axis, block size `c`) pairs at which access `a` stays in block `i` of the loop
    over `here` (cells `c*i` to `c*i + c - 1` of the axis): the index is `c*i + rest`, where
    `rest`, over loops inside (`inner`: their ranges), stays in `[0, c)`. A plain `i` is a
    block of 1; a channel-blocked convolution writes batch `16*jp + 8*jv + jl`, blocks of 16.
    Accesses of a node that agree on an (axis, c) pair touch disjoint cells in different
    iterations. A vector write's last axis is not a candidate (it covers more cells)."""
    found: set[tuple[int, int]] = set()
    assert a.idcs is not None
    last = len(a.idcs) - 1
    for p, idx in enumerate(a.idcs):
        if a.vector and p == last:
            continue
        if idx == Iterator(here):
            found.add((p, 1))
        elif isinstance(idx, Affine):
            c = next((k for k, sym in idx.symbols if sym == here), 0)
            rest = [(k, sym) for k, sym in idx.symbols if sym != here]
            if c <= 0 or any(sym not in inner for _, sym in rest):
                continue
            lo = idx.offset + sum(min(k * inner[sym][0], k * inner[sym][1]) for k, sym in rest)
            hi = idx.offset + sum(max(k * inner[sym][0], k * inner[sym][1]) for k, sym in rest)
            if 0 <= lo and hi < c:
                found.add((p, c))
    return found


COMPILER_BARRIER = '__asm__ __volatile__("" ::: "memory");'
"""How a compiler barrier starts: the scratch planner's (`scratch_plan.BARRIER`), where an
array starts to live in bytes another used."""


def is_compiler_barrier(stmt: ll.LLStmt) -> bool:
    """`stmt` is backend-staged code that is only a compiler barrier: it touches no array, but
    in a parallel region every thread must be done with the arrays before it (their bytes may
    change arrays there), so it is rendered after an `omp barrier`."""
    return isinstance(stmt, ll.StagedCompilation) and stmt.render().startswith(COMPILER_BARRIER)


NEST_TIMER = "/* einjit: nest timer */"
"""How the profiler's clock reads end (`backends.profile`): in a shared region each is run by
the master thread after a barrier of the threads, so a nest's time is that of all threads
being done with it, not of the master's share of an `omp for nowait`."""


def is_timer(stmt: ll.LLStmt) -> bool:
    """`stmt` is one of the profiler's clock reads (`NEST_TIMER`)."""
    return isinstance(stmt, ll.StagedCompilation) and stmt.render().endswith(NEST_TIMER)


def opaque(stmt: ll.LLStmt) -> bool:
    """Backend-staged code: what it touches is unknown."""
    return any(isinstance(s, ll.StagedCompilation) for s in ll.iter_stmts(stmt))


def parallel_chain(stmt: ll.LLStmt, private: set[Tnode]) -> tuple[ll.ForLoop, ...]:
    chain: list[ll.ForLoop] = []
    cur = stmt
    while isinstance(cur, ll.ForLoop) and is_parallel(cur, private):
        chain.append(cur)
        inner = list(ll.flatten(cur.body))
        if len(inner) != 1:
            break
        cur = inner[0]
    return tuple(chain)


def scheduler_locals(stmt: ll.LLStmt) -> set[Tnode]:
    """The scheduler's locals `stmt` writes (register blocks, packed panels, partial sums):
    per-iteration scratch, which each thread gets its own copy of. Routine-local nodes
    (`ir.local_storage`) are shared like context arrays."""
    return {s.tn for s in ll.iter_stmts(stmt) if isinstance(s, (ll.Set, ll.SetFromVec, ll.ZeroOut))
            and s.tn.is_local() and not is_routine_local(s.tn)}


def work(stmt: ll.LLStmt) -> int:
    """How many assignments one execution of `stmt` runs (statements in local scopes
    included): the size measure threads are judged by."""
    total = 0
    for s in ll.flatten(stmt):
        match s:
            case ll.ForLoop(_, from_, to_, body):
                total += max(0, to_ - from_ + 1) * work(body)
            case ll.Set(llsc=sc) | ll.SetLocal(value=sc) | ll.SetFromVec(arg=sc):
                total += 1 + sum(work(x.body) for x in ll.iter_scalars(sc) if isinstance(x, ll.LocalScope))
            case ll.ZeroOut(tn):
                total += tn.size
    return total


def collapsed(loop: ll.ForLoop) -> list[ll.ForLoop]:
    """The loops a threaded `loop` shares out as one (`omp for collapse`): it and the loops
    marked `parallel` nested right inside it, each the only statement of the one above."""
    group = [loop]
    while True:
        inner = list(ll.flatten(group[-1].body))
        if len(inner) != 1 or not isinstance(inner[0], ll.ForLoop) or not inner[0].parallel:
            return group
        group.append(inner[0])


def chunk(loop: ll.ForLoop, threads: int) -> int:
    """How many iterations of a threaded `loop` (of its `collapsed` loops together) a thread
    takes at once: 1 for heavy iterations, else about `CHUNK_WORK` assignments' worth, at most
    an even share per thread, and a multiple of 8 (whole vectors) when the body has no loop
    left to vectorize."""
    group = collapsed(loop)
    per = max(1, work(group[-1].body))
    if per >= CHUNK_WORK:
        return 1
    count = 1
    for lp in group:
        count *= lp.to_ - lp.from_ + 1
    k = min(-(-CHUNK_WORK // per), -(-count // threads))
    innermost = not any(isinstance(s, ll.ForLoop) for s in ll.iter_stmts(group[-1].body))
    return -(-k // 8) * 8 if innermost else k


def thread_nests(llc: ll.LLStmt, threads: int, min_work: int = THREAD_MIN_WORK,
                 routine_min_work: int | None = None) -> ll.LLStmt:
    """`llc` with one parallel loop of each top-level nest marked `parallel` where one
    execution of the nest runs at least `min_work` assignments and the loop has at least
    `threads` iterations (`_thread_nest`). Nests the scheduler already threads (a loop marked
    `parallel`) keep their threads, outermost where they can (`_threads_outside`); a nest
    writing a scheduler local that another top-level statement also touches goes on threads
    only where each iteration writes its own block of it (`sliced_nodes`: a panel pack the
    contraction after it reads whole, 256 KiB in a GPT block's MLP backward, was one thread's
    while the other waited), since threads would each keep their own copy of per-iteration
    scratch. A routine whose threaded nests run fewer than `routine_min_work` assignments each
    on average (`ROUTINE_WORK_FACTOR` times `min_work` when None) runs on one thread, unless
    the scheduler put a nest on threads (a contraction of a millisecond or more:
    `Blocking.parallel_min_work`)."""
    top = list(ll.flatten(llc))
    touched: dict[Tnode, int] = {}
    for s in top:
        for tn in ll.nodes_of(s):
            touched[tn] = touched.get(tn, 0) + 1
    out: list[ll.LLStmt] = []
    done: dict[int, tuple[ll.LLStmt, tuple[int, int], ll.LLStmt]] = {}
    for s in top:
        shared = {tn for tn in scheduler_locals(s) if touched[tn] > 1}
        if isinstance(s, ll.ForLoop) and (not shared or not _threads(s)):
            known = _LAST_THREADED.get(id(s))
            if known is not None and known[0] is s and known[1] == (threads, min_work):
                threaded = known[2]
            elif shared:
                threaded = _thread_nest(s, threads, min_work)
                threaded = threaded if threaded.parallel and shared <= sliced_nodes(threaded) else s
            elif not _threads(s):
                threaded = _thread_nest(s, threads, min_work)
                threaded = threaded if threaded.parallel else _fissioned(s, threads, min_work, threaded)
            elif s.parallel:
                threaded = s
            else:
                threaded = _threads_outside(s, threads, min_work)
                threaded = threaded if threaded is not s else _team_parts(s, threads, min_work)
            done[id(s)] = (s, (threads, min_work), threaded)
            s = threaded
        out.append(s)
    _LAST_THREADED.clear()
    _LAST_THREADED.update(done)
    sizes = [_weighted_work(s) for s in out if _threads(s)]
    least = ROUTINE_WORK_FACTOR * min_work if routine_min_work is None else routine_min_work
    if sizes and not any(_threads(s) for s in top) and sum(sizes) < least * len(sizes):
        return ll.seq(*(_serial(s) for s in top))
    return ll.seq(*out)


def _weighted_work(stmt: ll.LLStmt) -> int:
    """`work` of a top-level statement, a register-blocked contraction's at
    1/`BLOCKED_WORK_FACTOR` (its assignments are lanes of vector multiply-adds)."""
    return work(stmt) // (BLOCKED_WORK_FACTOR if _blocked(stmt) else 1)


def _blocked(stmt: ll.LLStmt) -> bool:
    return any(tn.provenance == provenance.REGISTER_BLOCK and tn.dims[0] > 1 for tn in scheduler_locals(stmt))


_LAST_THREADED: dict[int, tuple[ll.LLStmt, tuple[int, int], ll.LLStmt]] = {}
"""The nests of the last `thread_nests` call (by identity, kept alive here so an id is not
reused), with the thread count and threshold and what they became: the scratch planner and
the renderer thread the same nests of a routine (the planner's code gains only compiler
barriers and moved zero fills), and a large routine's nests take a good part of a second."""


def _threads_outside(nest: ll.ForLoop, threads: int, min_work: int) -> ll.ForLoop:
    """A nest the scheduler threads inside (a contraction's panel loop, 2 panels, under a
    loop over 4 heads) with its outermost loop on threads instead, where that loop is
    parallel and splits evenly: one fork-join instead of one per head, and the nest can share
    a parallel region with its neighbours. Only where the scheduler's threaded loops are
    all the loop holds: threads sharing a panel packed before them stay as they are."""
    inside = [s for s in ll.flatten(nest.body) if not isinstance(s, ll.Comment)]
    if (not all(isinstance(s, ll.ForLoop) and s.parallel for s in inside)
            or _share(_extent(nest), threads) < 0.9 or work(nest) < min_work
            or not is_parallel(nest, scheduler_locals(nest))):
        return nest
    return dataclasses.replace(nest, body=_serial(nest.body), parallel=True)


def _team_parts(nest: ll.ForLoop, threads: int, min_work: int) -> ll.ForLoop:
    """A nest the scheduler threads inside, under serial loops that every thread of its region
    runs (a weight gradient: k chunks, each packing a panel of the summed operand that all
    threads read, then the threaded column panels), with the other nests beside the threaded
    loops on threads too (`_thread_nest`), where they run at least `min_work` assignments: the
    pack was one thread's (`omp single`) while the other waited. A pack the threads fill block
    by block is one shared copy (`sliced_nodes`), not each thread's own; an `omp for`'s
    barrier orders it before the panels that read it."""
    body = list(ll.flatten(nest.body))
    if not any(isinstance(s, ll.ForLoop) and s.parallel for s in body):
        inner = [s for s in body if isinstance(s, ll.ForLoop) and _threads(s)]
        if len(inner) != 1:
            return nest
        return dataclasses.replace(nest, body=ll.seq(*(
            _team_parts(s, threads, min_work) if s is inner[0] else s for s in body)))
    out: list[ll.LLStmt] = []
    for s in body:
        if isinstance(s, ll.ForLoop) and not _threads(s):
            part = _thread_nest(s, threads, min_work)
            s = part if part.parallel and scheduler_locals(part) <= sliced_nodes(part) else s
        out.append(s)
    return dataclasses.replace(nest, body=ll.seq(*out))


def _threads(stmt: ll.LLStmt) -> bool:
    return any(isinstance(x, ll.ForLoop) and x.parallel for x in ll.iter_stmts(stmt))


def _serial(stmt: ll.LLStmt) -> ll.LLStmt:
    """`stmt` with no loop marked `parallel`."""
    match stmt:
        case ll.ForLoop():
            return dataclasses.replace(stmt, body=_serial(stmt.body), parallel=False)
        case ll.Seq():
            return ll.seq(*(_serial(s) for s in ll.flatten(stmt)))
    return stmt


def _fissioned(nest: ll.ForLoop, threads: int, min_work: int, otherwise: ll.LLStmt) -> ll.LLStmt:
    """`nest` with its column sums moved after it (`sum_fission.split`) when that puts its
    outermost loop on threads (the sums then go on threads over their columns, or stay on
    one); `otherwise` when it does not. Only a nest big enough for threads is split."""
    if work(nest) < min_work:
        return otherwise
    parts = sum_fission.split(nest)
    if parts is None:
        return otherwise
    rest = _thread_nest(parts[0], threads, min_work)
    if not rest.parallel:
        return otherwise
    return ll.seq(rest, *(_thread_nest(s, threads, min_work) for s in parts[1]))


def _thread_nest(nest: ll.ForLoop, threads: int, min_work: int) -> ll.ForLoop:
    """`nest` with a parallel loop of its perfect chain (the loops down to the first whose
    body is not one loop) on threads: the outermost with `2 * threads` iterations or more
    (for balance), else the outermost with `threads`. A parallel loop below serial ones moves
    outermost, so one fork-join runs the nest: its iterations touch disjoint cells (`_blocks`)
    whatever the outer loops' values, and each cell's updates keep their order, so results
    are bit-identical. An innermost loop is left to `_hoisted` (it moves in vector chunks).
    Loops nested right inside the threaded one that are parallel too are marked as well while
    the threads' shares are uneven (3 rows on 2 threads): the renderer collapses them.
    Without a parallel loop in the chain, the statements of the chain's last body are
    threaded one by one (`_thread_body`). A register-blocked contraction needs
    `BLOCKED_WORK_FACTOR` times the work."""
    if work(nest) < min_work * (BLOCKED_WORK_FACTOR if _blocked(nest) else 1):
        return nest
    chain: list[ll.ForLoop] = []
    cur: ll.LLStmt = nest
    while isinstance(cur, ll.ForLoop):
        chain.append(cur)
        inner = list(ll.flatten(cur.body))
        cur = inner[0] if len(inner) == 1 else ll.Noop()
    last_innermost = not any(isinstance(x, ll.ForLoop) for x in ll.iter_stmts(chain[-1].body))
    runs = {k: run_bytes(axes) for k, loop in enumerate(chain)
            if _extent(loop) >= threads and not (k == len(chain) - 1 > 0 and last_innermost)
            and (axes := slicing(loop, scheduler_locals(loop))) is not None}
    candidates = sorted(runs)
    if not candidates or candidates[0] > 0:
        hoisted = _hoisted(chain, threads)
        if hoisted is not nest:
            return hoisted
    if not candidates:
        split = _split_columns(chain, threads)
        return split if split is not nest else _thread_body(chain, threads, min_work)
    pick = next((k for k in candidates if _extent(chain[k]) >= 2 * threads), candidates[0])
    if runs[pick] < SHARED_RUN_BYTES:
        even = [k for k in candidates if _share(_extent(chain[k]), threads) >= 0.9]
        pick = next((k for k in even if runs[k] >= SHARED_RUN_BYTES), pick)
    group = _collapsed(chain, pick, threads)
    below = _rewrap(chain[:pick], chain[pick + len(group) - 1].body)
    threaded = _rewrap([dataclasses.replace(loop, parallel=True) for loop in group], below)
    assert isinstance(threaded, ll.ForLoop)
    return threaded


def _extent(loop: ll.ForLoop) -> int:
    return loop.to_ - loop.from_ + 1


def _share(n: int, threads: int) -> float:
    """How busy `threads` threads are on `n` equal iterations."""
    return n / (threads * -(-n // threads))


def _collapsed(chain: list[ll.ForLoop], pick: int, threads: int) -> list[ll.ForLoop]:
    """The loops from `chain[pick]` that go on threads as one (`omp for collapse`): the next
    loop joins while the iterations so far split unevenly over `threads` (less than 95% of
    the threads' time busy: 3 of 4 for 3 rows on 2 threads), it is parallel, and it evens the split. A loop with no loop
    inside (left to vectorize) or one to unroll stays out."""
    group = [chain[pick]]
    n = _extent(chain[pick])
    for loop in chain[pick + 1:]:
        if (_share(n, threads) >= 0.95 or _share(n * _extent(loop), threads) <= _share(n, threads) or loop.unroll
                or not any(isinstance(x, ll.ForLoop) for x in ll.iter_stmts(loop.body))
                or not is_parallel(loop, scheduler_locals(loop))):
            break
        group.append(loop)
        n *= _extent(loop)
    return group


def _thread_body(chain: list[ll.ForLoop], threads: int, min_work: int) -> ll.ForLoop:
    """The nest with each loop nest in the last body of its chain threaded on its own (an
    `omp parallel for` each time the chain's loops run it), where one execution of it runs
    at least `min_work` assignments and no other statement there touches its per-iteration
    scratch: a weight gradient packs a panel, then sums into the weight's cells (the kernel
    offsets, the channel blocks) reading it."""
    body = list(ll.flatten(chain[-1].body))
    if len(body) < 2:
        return chain[0]
    touched: dict[Tnode, int] = {}
    for s in body:
        for tn in ll.nodes_of(s):
            touched[tn] = touched.get(tn, 0) + 1
    out = [_thread_nest(s, threads, min_work)
           if isinstance(s, ll.ForLoop) and all(touched[tn] == 1 for tn in scheduler_locals(s)) else s for s in body]
    if all(a is b for a, b in zip(out, body, strict=True)):
        return chain[0]
    threaded = _rewrap(chain, ll.seq(*out))
    assert isinstance(threaded, ll.ForLoop)
    return threaded


@dataclass(frozen=True, slots=True)
class Unit:
    """Statements `first` to `stop` (exclusive, numbered within their region) that run as one
    construct: "for" (one nest whose outermost loop the threads share), "single" (statements
    one thread runs), "plain" (comments: no code), "sync" (a compiler barrier, after a
    barrier of the threads: `is_compiler_barrier`), "zero" (a large array's zero fill, its
    pieces shared by the threads: `SHARED_ZERO_BYTES`), "timer" (a clock read of the
    profiler, by the master thread after a barrier: `is_timer`). `nowait`: no barrier after it, since
    nothing up to the next barrier touches what it writes or writes what it reads."""

    role: str
    first: int
    stop: int
    nowait: bool


@dataclass(frozen=True, slots=True)
class Region:
    """Consecutive top-level statements `start` to `stop` (exclusive) that run in one
    parallel region (one fork-join instead of one per nest), as `units`."""

    start: int
    stop: int
    units: tuple[Unit, ...]

    def unit_of(self, k: int) -> Unit:
        """The unit of statement `start + k`."""
        return next(u for u in self.units if u.first <= k < u.stop)


def shared_regions(top: list[ll.LLStmt]) -> list[Region]:
    """The parallel regions of a routine's top-level statements `top` (`ll.flatten` of it).

    A nest whose outermost loop is `parallel` becomes an orphaned `omp for` in a region, if
    its per-iteration scratch (`scheduler_locals` but `sliced_nodes`) is its own; statements
    between such nests run on one thread (one `omp single` for each run of them), so small
    serial nests or a `memset` between two threaded nests cost a barrier, not a fork-join.
    Large zero fills right before a region's first nest join it, shared in pieces (a convnet's
    first convolution output, 1.4 MB, was one thread's `memset` before the region). A statement that
    threads an inner loop (its own region), or backend-staged code, ends a region. Regions of
    fewer than two threaded nests are left out: they would gain nothing. A compiler barrier
    of the scratch planner stays in the region, after a barrier of the threads, and so does a
    clock read of the profiler (`is_timer`)."""
    last = _LAST_REGIONS.get("top")
    if last is not None and len(last[0]) == len(top) and all(a is b for a, b in zip(last[0], top, strict=True)):
        return list(last[1])
    regions = _shared_regions(top)
    _LAST_REGIONS["top"] = (tuple(top), tuple(regions))
    return regions


_LAST_REGIONS: dict[str, tuple[tuple[ll.LLStmt, ...], tuple[Region, ...]]] = {}
"""The statements of the last `shared_regions` call and their regions: the layout and the
renderer ask for the regions of the same statements."""


def _shared_regions(top: list[ll.LLStmt]) -> list[Region]:
    touched: dict[Tnode, int] = {}
    for s in top:
        for tn in ll.nodes_of(s):
            touched[tn] = touched.get(tn, 0) + 1
    kinds = [_role(s, touched) for s in top]
    regions: list[Region] = []
    k = floor = 0
    while k < len(top):
        if kinds[k] != "for":
            k += 1
            continue
        stop = k
        while stop < len(top) and kinds[stop] != "end":
            stop += 1
        while kinds[stop - 1] != "for":
            stop -= 1
        start = k
        while start > floor and kinds[start - 1] in ("zero", "plain"):
            start -= 1
        while kinds[start] == "plain":
            start += 1
        if kinds[k:stop].count("for") >= 2:
            regions.append(Region(start, stop, _units(top[start:stop], kinds[start:stop])))
        k = floor = stop
    return regions


def _role(s: ll.LLStmt, touched: dict[Tnode, int]) -> str:
    if isinstance(s, ll.Comment):
        return "plain"
    if is_compiler_barrier(s):
        return "sync"
    if is_timer(s):
        return "timer"
    if opaque(s):
        return "end"
    if isinstance(s, ll.ZeroOut) and s.tn.size * s.tn.prec.itemsize >= SHARED_ZERO_BYTES:
        return "zero"
    threaded = [x for x in ll.iter_stmts(s) if isinstance(x, ll.ForLoop) and x.parallel]
    if not threaded:
        return "single"
    if isinstance(s, ll.ForLoop) and s.parallel and all(touched[tn] == 1 for tn in scheduler_locals(s)
                                                        - sliced_nodes(s)):
        return "for"
    return "end"


_ALONE = ("for", "sync", "zero", "timer")
"""The roles of statements that are units by themselves."""


_BARRIERS = ("sync", "timer")
"""The roles of units that start with a barrier of the threads."""


def _units(stmts: list[ll.LLStmt], kinds: list[str]) -> tuple[Unit, ...]:
    """`stmts` as units: each "for", "zero", "sync" and "timer" alone, each run of other statements one
    "single" (or "plain" if they are all comments); then whether each may skip its barrier:
    the next unit is a "sync" or a "timer" (a barrier itself), or it touches nothing that a unit since the
    last barrier writes, and writes nothing they read. The last one always may (the region
    ends with a barrier)."""
    spans: list[tuple[str, int, int]] = []
    for k, kind in enumerate(kinds):
        if kind in _ALONE or not spans or spans[-1][0] in _ALONE:
            spans.append((kind, k, k + 1))
        else:
            role = "single" if "single" in (kind, spans[-1][0]) else "plain"
            spans[-1] = (role, spans[-1][1], k + 1)
    shared = []
    for _, first, stop in spans:
        reads: set[Tnode] = set()
        writes: set[Tnode] = set()
        for s in stmts[first:stop]:
            r, w = _shared_access(s)
            reads |= r
            writes |= w
        shared.append((reads, writes))
    units: list[Unit] = []
    reads, writes = set(), set()
    for n, (role, first, stop) in enumerate(spans):
        reads |= shared[n][0]
        writes |= shared[n][1]
        later = [m for m in range(n + 1, len(spans)) if spans[m][0] != "plain"]
        nowait = True
        if role in _BARRIERS or later and spans[later[0]][0] in _BARRIERS:
            reads, writes = set(), set()
        elif later:
            nr, nw = shared[later[0]]
            if writes & (nr | nw) or reads & nw:
                nowait = False
                reads, writes = set(), set()
        units.append(Unit(role, first, stop, nowait))
    return tuple(units)


def _shared_access(s: ll.LLStmt) -> tuple[set[Tnode], set[Tnode]]:
    """The nodes `s` reads and writes, but per-iteration scratch (a local the threads fill
    block by block, `sliced_nodes`, is shared)."""
    private = scheduler_locals(s) - sliced_nodes(s) if isinstance(s, ll.ForLoop) and s.parallel else set()
    found = [a for a in accesses(s) if a.tn not in private]
    return {a.tn for a in found if not a.write}, {a.tn for a in found if a.write}


def _hoisted(chain: list[ll.ForLoop], threads: int) -> ll.ForLoop:
    """A perfect nest around one assignment whose outer loops are summed (a bias gradient:
    `db[j] += g[b, t, j]`, an embedding's scatter `dw[ids[b, t], j] += g[b, t, j]`) with its
    outermost parallel loop moved outermost and put on threads;
    the nest as it is when there is none. Moving a loop whose iterations are independent
    outermost keeps each cell's updates in their order, so results are bit-identical. An
    innermost loop moves in chunks of whole vectors (`db[16*j0 + j1]`): the inner part stays
    innermost, unit-stride and vectorized."""
    inner = list(ll.flatten(chain[-1].body))
    if len(inner) != 1 or not isinstance(inner[0], ll.Set) or scheduler_locals(chain[0]):
        return chain[0]
    st = inner[0]
    if any(isinstance(x, ll.LocalScope) for x in ll.iter_scalars(st.llsc)):
        return chain[0]
    for k in range(1, len(chain)):
        loop = chain[k]
        extent = loop.to_ - loop.from_ + 1
        if loop.from_ != 0 or extent < threads or not is_parallel(loop, set()):
            continue
        rest = chain[:k] + chain[k + 1:]
        if k < len(chain) - 1:
            return dataclasses.replace(loop, body=_rewrap(rest, st), parallel=True)
        pieces = next((n for n in (4 * threads, 2 * threads, threads) if extent % n == 0 and extent // n % 8 == 0), 0)
        if not pieces:
            continue
        size = extent // pieces
        outer, lane = get_symbol(loop.index.name), get_symbol(loop.index.name)
        env: dict[Symbol, AxisIndex] = {loop.index: make_affine([(size, outer), (1, lane)])}
        moved = ll.Set(st.tn, tuple(subst_index(env, i) for i in st.idcs), nests.subst(st.llsc, env), st.debug)
        body = _rewrap(rest, ll.ForLoop(lane, 0, size - 1, moved))
        return ll.ForLoop(outer, 0, pieces - 1, body, parallel=True)
    return chain[0]


def _split_columns(chain: list[ll.ForLoop], threads: int) -> ll.ForLoop:
    """A nest whose summed loops (`chain`) run several innermost loops over one range of
    columns, a LayerNorm's or a linear layer's backward fused with its bias gradient
    (`g[b, t, j] = ...; db[j] += g[b, t, j]; dx[b, t, j] += g[b, t, j]`), with that range cut
    in chunks of whole vectors that go to threads: a chunk runs every statement on its
    columns over all the summed loops' iterations. Each column's cells are updated by one
    thread in the order of the nest, so results are bit-identical; the nest as it is when a
    statement reads or writes another chunk's cells of a node the nest writes (a sum over the
    columns: `is_parallel` of the result) or the statements are not all such loops."""
    body = list(ll.flatten(chain[-1].body))
    loops = [s for s in body if isinstance(s, ll.ForLoop)]
    if (len(loops) < 2 or len(loops) + sum(isinstance(s, ll.Comment) for s in body) < len(body)
            or scheduler_locals(chain[0]) or not all(_column_loop(s, loops[0]) for s in loops)):
        return chain[0]
    extent = loops[0].to_ + 1
    pieces = next((n for n in (4 * threads, 2 * threads, threads) if extent % n == 0 and extent // n % 8 == 0), 0)
    if not pieces:
        return chain[0]
    size = extent // pieces
    outer = get_symbol(loops[0].index.name)
    moved: list[ll.LLStmt] = []
    for s in body:
        if isinstance(s, ll.ForLoop):
            lane = get_symbol(s.index.name)
            env: dict[Symbol, AxisIndex] = {s.index: make_affine([(size, outer), (1, lane)])}
            sets = [ll.Set(st.tn, tuple(subst_index(env, i) for i in st.idcs), nests.subst(st.llsc, env), st.debug)
                    for st in ll.flatten(s.body) if isinstance(st, ll.Set)]
            s = ll.ForLoop(lane, 0, size - 1, ll.seq(*sets))
        moved.append(s)
    split = ll.ForLoop(outer, 0, pieces - 1, _rewrap(chain, ll.seq(*moved)), parallel=True)
    return split if is_parallel(split, set()) else chain[0]


def _column_loop(s: ll.ForLoop, first: ll.ForLoop) -> bool:
    """`s` is a plain loop over `first`'s range from 0 whose body is assignments only, none with
    a local scope (which `nests.subst` does not enter)."""
    return (s.from_ == 0 and s.to_ == first.to_ and not s.start and not s.stop
            and not s.parallel and not s.unroll
            and all(isinstance(st, ll.Set) and not any(isinstance(x, ll.LocalScope) for x in ll.iter_scalars(st.llsc))
                    for st in ll.flatten(s.body)))


def _rewrap(loops: list[ll.ForLoop], body: ll.LLStmt) -> ll.LLStmt:
    for loop in reversed(loops):
        body = dataclasses.replace(loop, body=body)
    return body
