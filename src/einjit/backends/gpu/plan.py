"""Kernel-grid planning shared by every GPU backend: how one routine's work is spread over a
grid of threads, independent of the language the kernel is written in.

Grid mapping. A routine body is a sequence of top-level statements ("segments"). For each
segment, the leading perfectly nested loops whose iterations touch disjoint cells of every
node the body writes — each such node is sliced by the loop's index, at the same axis, in
every read and write — are *parallel*: they are collapsed into one index space that the
grid's threads cover with a grid-stride loop, one iteration per thread at a time. The first
loop that is not parallel (a reduction: its iterations accumulate into the same cells) and
everything inside it run sequentially within the thread, so reductions never race. Parallel
loops of a perfect nest below summed ones first move outermost (`_parallel_outermost`): a
weight gradient `dw[i, j] += x[b, i] * g[b, j]` summed over the batch `b` outermost would
otherwise run on one thread. A segment without a parallel loop runs on thread 0. Between
two segments where the later one touches what the earlier wrote (or writes what it read),
all threads of the grid synchronize (`cooperative_groups::this_grid().sync()`, so such
kernels are launched cooperatively).

Memory classes (`CudaMemClass`). A `Local` node used by only one segment, small enough, and
written before it is read in each parallel iteration becomes a per-thread local array
(`LOCAL_ONLY`): every thread recomputes its own copy. Every other node — including `Local`
nodes that live across segments — is `GLOBAL`: a kernel parameter pointing to device memory.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from einjit.backends.parallel_loops import accesses, is_parallel, opaque, parallel_chain
from einjit.backends.params import CudaMemClass
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.passes.local_storage import is_routine_local
from einjit.ir.tnode import Tnode

__all__ = ["MAX_BLOCK", "PRIVATE_LIMIT_BYTES", "KernelPlan", "Segment", "plan_kernel"]

MAX_BLOCK = 256
PRIVATE_LIMIT_BYTES = 16 * 1024
"""The largest `Local` node kept as a per-thread array; larger ones live in global memory."""


@dataclass(frozen=True, eq=False)
class Segment:
    """A top-level statement and its leading loops that the grid's threads share."""

    stmt: ll.LLStmt
    parallel: tuple[ll.ForLoop, ...] = ()

    @property
    def size(self) -> int:
        """How many threads can work on the segment at once."""
        return math.prod(lp.to_ - lp.from_ + 1 for lp in self.parallel)

    @property
    def is_work(self) -> bool:
        return not isinstance(self.stmt, (ll.Comment, ll.Noop))


@dataclass(frozen=True, eq=False)
class KernelPlan:
    name: str
    segments: tuple[Segment, ...]
    barriers: frozenset[int]
    """Indices of the segments preceded by a grid-wide synchronization."""
    mem_classes: Mapping[Tnode, CudaMemClass] = field(repr=False)

    @property
    def grid_sync(self) -> bool:
        return bool(self.barriers)

    @property
    def work_items(self) -> int:
        """The most threads any segment can use."""
        return max((s.size for s in self.segments if s.is_work), default=1)

    def launch_shape(self) -> tuple[int, int]:
        """(blocks wanted, threads per block): whole warps, at most `MAX_BLOCK` threads."""
        n = self.work_items
        block = MAX_BLOCK if n >= MAX_BLOCK else 32 * max(1, -(-n // 32))
        return -(-n // block), block


def _expand_zero_out(stmt: ll.LLStmt) -> ll.LLStmt:
    """A top-level `ZeroOut` becomes a loop nest of stores, which the grid can share."""
    if not isinstance(stmt, ll.ZeroOut):
        return stmt
    tn = stmt.tn
    syms = [get_symbol() for _ in tn.dims]
    body: ll.LLStmt = ll.Set(tn, tuple(Iterator(s) for s in syms), ll.Constant(0.0), f"{tn.name} := 0")
    for s, d in reversed(list(zip(syms, tn.dims, strict=True))):
        body = ll.ForLoop(s, 0, d - 1, body)
    return body


def _parallel_outermost(stmt: ll.LLStmt, private: set[Tnode]) -> ll.LLStmt:
    """`stmt` with the parallel loops of its perfect nest (the loops down to the first whose
    body is not one loop) moved outermost, in their order, the summed ones inside them in
    theirs. A parallel loop's iterations touch disjoint cells whatever the values of the loops
    around it, so they are independent there too, and each cell's updates keep their order:
    results are bit-identical. Nests with bounds that depend on outer indices stay as they are."""
    chain: list[ll.ForLoop] = []
    cur = stmt
    while isinstance(cur, ll.ForLoop):
        chain.append(cur)
        inner = list(ll.flatten(cur.body))
        if len(inner) != 1:
            break
        cur = inner[0]
    if any(lp.start or lp.stop for lp in chain):
        return stmt
    parallel = [is_parallel(lp, private) for lp in chain]
    if parallel == sorted(parallel, reverse=True):
        return stmt
    order = [lp for lp, p in zip(chain, parallel, strict=True) if p] + \
        [lp for lp, p in zip(chain, parallel, strict=True) if not p]
    body = chain[-1].body
    for lp in reversed(order):
        body = dataclasses.replace(lp, body=body)
    return body


def _private_nodes(stmts: Sequence[ll.LLStmt]) -> set[Tnode]:
    """`Local` nodes that one segment alone uses and that fit a thread's local memory.
    Routine-local nodes (`ir.local_storage`) stay global: a segment may read cells of them
    that another thread's iterations wrote."""
    users: dict[Tnode, set[int]] = {}
    for k, s in enumerate(stmts):
        for a in accesses(s):
            users.setdefault(a.tn, set()).add(k)
    return {tn for tn, ks in users.items()
            if tn.is_local() and not is_routine_local(tn) and len(ks) == 1
            and tn.size * tn.prec.itemsize <= PRIVATE_LIMIT_BYTES}


def _touched(stmt: ll.LLStmt, private: set[Tnode]) -> tuple[set[Tnode], set[Tnode]]:
    reads: set[Tnode] = set()
    writes: set[Tnode] = set()
    for a in accesses(stmt):
        if a.tn not in private:
            (writes if a.write else reads).add(a.tn)
    return reads, writes


def plan_kernel(name: str, llc: ll.LLStmt) -> KernelPlan:
    """Split `llc` into segments, find each one's parallel loops, place grid barriers where a
    segment depends on an earlier one since the last barrier, and classify the nodes."""
    stmts = [_expand_zero_out(s) for s in ll.flatten(llc)]
    private = _private_nodes(stmts)
    stmts = [_parallel_outermost(s, private) for s in stmts]
    segments: list[Segment] = []
    barriers: set[int] = set()
    reads: set[Tnode] = set()
    writes: set[Tnode] = set()
    opaque_before, started = False, False
    for s in stmts:
        seg = Segment(s, parallel_chain(s, private))
        if seg.is_work:
            r, w = _touched(s, private)
            staged = opaque(s)
            if started and (writes & (r | w) or reads & w or staged or opaque_before):
                barriers.add(len(segments))
                reads, writes = set(), set()
            reads |= r
            writes |= w
            opaque_before, started = staged, True
        segments.append(seg)
    classes: dict[Tnode, CudaMemClass] = {}
    for s in stmts:
        for a in accesses(s):
            classes[a.tn] = CudaMemClass.LOCAL_ONLY if a.tn in private else CudaMemClass.GLOBAL
    return KernelPlan(name, tuple(segments), frozenset(barriers), classes)
