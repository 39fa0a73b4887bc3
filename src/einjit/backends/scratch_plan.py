"""The scratch planner: a routine's scratch arrays placed in one arena, sharing bytes when their
lifetimes do not meet.

Routine-local arrays too large for the stack are scratch parameters of the generated routine
(`c_syntax.local_placement`, memory class `LOCAL_ONLY`, seed 001's `Local` mode). Their values
live from the top-level statement that first writes them to the one that last reads them; a
training step's activations and gradients mostly die within a few nests, and given one array
each, a GPT step kept three times the bytes PyTorch keeps. This module decides *where* such an
array lives, nothing else: which nodes are routine-local stays the decision of
`ir/passes/local_storage.py`, and parameters, gradients, optimizer state, hosted values, merge
buffers and anything another routine reads are context arrays, never scratch, so never planned.

The plan (`plan_routine`):

- a scratch node's live interval is `[first, last]` over the routine's top-level statements
  (`ll.flatten`: loop nests, and the statements between them), the first and the last that
  touch it. Intervals are closed: two arrays touched by one nest never share bytes, whatever
  the order of their reads and writes inside it;
- a top-level `ZeroOut` of a scratch node is moved down to just before the next top-level
  statement touching the node (`sink_zero_outs`; nothing between reads or writes it, so the
  values are the same): the backprop code zeroes every gradient before the first backprop
  nest, which would make each gradient live from there;
- the first statement touching a planned node must write it (local storage already refuses
  a node read before it is written); a node whose first touch is only a read keeps bytes of
  its own for the whole routine (`_whole`), so no value of another array can reach it;
- `assign` places the arrays greedily, largest first, each at the lowest-waste gap (best fit)
  among the arrays already placed whose intervals meet its own, at `ALIGN`-byte offsets.

Why sharing bytes is safe in the generated C, where every scratch node stays its own
`restrict` pointer parameter (only the addresses the backend passes change): arrays sharing
bytes are never touched by one top-level statement, and every access of the earlier one comes
before every access of the later one in program order. What could still reorder them is the
compiler trusting `restrict` across statements, so `with_barriers` puts an empty
`asm volatile` with a memory clobber (`BARRIER`: no instruction) before each statement where
bytes pass from a dead array to a new one; gcc moves no load or store across it. An outlined
nest (`c_outline`) is its own `noinline` function, called in program order; an OpenMP region
lies inside one nest, and the threads' private copies of the scheduler's locals are allocated
inside the region, never planned (`scratch_nodes`). The differential tests
(`tests/backends/test_scratch_plan.py`) compare MLP, convnet and GPT steps with the planner on
and off bit for bit, at 1 and 2 threads.

`EINJIT_SCRATCH_PLAN=0` turns sharing off: when routines are linked every scratch node then
gets an array of its own, as before the planner, and `place` plans every node live through
the whole routine, so an exported library's arena (`export/c_library.py`) holds the arrays
side by side too.

The CUDA backend stays on its own path (`gpu/plan.py`): a routine-local node used by one
segment is a per-thread local array, and one living across segments is a `GLOBAL` device
array of the context, like any kernel parameter. Sharing those would take a device arena
and offsets into it for the kernel's pointers, with the grid synchronizations between
segments as the lifetimes' boundaries; the planner's intervals would carry over, but the
device side is not built here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from einjit.backends.c_syntax import CSyntax, region_only_nodes, routine_layout
from einjit.ir import low_level as ll
from einjit.ir.tnode import Tnode

__all__ = ["ALIGN", "BARRIER", "Interval", "ScratchPlan", "assign", "enabled", "live_intervals", "place",
           "plan_routine", "scratch_nodes", "sink_zero_outs", "with_barriers"]

ALIGN = 64
"""Every planned array starts at a multiple of a cache line (and of any vector width)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """A buffer to place: it is live from top-level statement `first` to `last` (inclusive)."""

    first: int
    last: int
    nbytes: int

    def meets(self, other: Interval) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True, slots=True)
class ScratchPlan:
    """Where a routine's scratch arrays live in its arena: `offsets[k]` (bytes) for the routine's
    k-th scratch parameter, `nbytes[k]` its size; `size` the arena's bytes. `parts_bytes` is what
    the arrays would take one array each."""

    offsets: tuple[int, ...]
    nbytes: tuple[int, ...]
    size: int
    intervals: tuple[Interval, ...] = ()
    """The live intervals the plan was made from (the top-level statements before barriers)."""

    @property
    def parts_bytes(self) -> int:
        return sum(self.nbytes)


def enabled() -> bool:
    """Whether routines linked now share scratch bytes (`EINJIT_SCRATCH_PLAN`, default on)."""
    return os.environ.get("EINJIT_SCRATCH_PLAN", "1").strip().lower() not in ("0", "off", "false", "no")


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def live_intervals(llc: ll.LLStmt, nodes: Sequence[Tnode]) -> list[Interval]:
    """The live interval of each of `nodes` over `llc`'s top-level statements (see the module)."""
    wanted = set(nodes)
    first: dict[Tnode, int] = {}
    last: dict[Tnode, int] = {}
    written_first: set[Tnode] = set()
    top = list(ll.flatten(llc))
    for k, stmt in enumerate(top):
        touched = [tn for tn in ll.nodes_of(stmt) if tn in wanted]
        if not touched:
            continue
        writes = {x.tn for x in ll.iter_stmts(stmt) if isinstance(x, (ll.Set, ll.SetFromVec, ll.ZeroOut))}
        for tn in touched:
            if tn not in first:
                first[tn] = k
                if tn in writes:
                    written_first.add(tn)
            last[tn] = k
    end = max(len(top) - 1, 0)
    out = []
    for tn in nodes:
        nbytes = int(tn.size) * int(tn.prec.itemsize)
        if tn in written_first:
            out.append(Interval(first[tn], last[tn], nbytes))
        else:
            out.append(_whole(end, nbytes))
    return out


def _whole(end: int, nbytes: int) -> Interval:
    """Live through the whole routine: shares bytes with nothing."""
    return Interval(0, end, nbytes)


def assign(buffers: Sequence[Interval]) -> tuple[tuple[int, ...], int]:
    """Offsets (multiples of `ALIGN`) for `buffers` such that two whose intervals meet never
    overlap in memory, and the arena size they need. Largest first (ties: earlier first, then
    by position, so the plan is a function of the routine alone), each in the smallest gap left
    between the placed buffers it meets (the first such gap from below), else above them all.
    Vectorized over the placed buffers: a deep model has a thousand scratch arrays, and the
    pairs were most of the planner's time."""
    order = sorted(range(len(buffers)), key=lambda k: (-buffers[k].nbytes, buffers[k].first, k))
    first = np.array([b.first for b in buffers], np.int64)
    last = np.array([b.last for b in buffers], np.int64)
    need = np.array([_aligned(b.nbytes) for b in buffers], np.int64)
    offsets = np.zeros(len(buffers), np.int64)
    placed = np.zeros(len(buffers), bool)
    size = 0
    for k in order:
        meets = placed & (first <= last[k]) & (first[k] <= last)
        lo = offsets[meets]
        hi = lo + need[meets]
        by_start = np.lexsort((hi, lo))
        lo, hi = lo[by_start], hi[by_start]
        reach = np.maximum.accumulate(np.concatenate(([0], hi)))
        gaps = lo - reach[:-1]
        fits = gaps >= need[k]
        offset = int(reach[:-1][np.argmin(np.where(fits, gaps, np.iinfo(np.int64).max))]) if fits.any() else int(
            reach[-1])
        offsets[k] = offset
        placed[k] = True
        size = max(size, offset + int(need[k]))
    return tuple(int(o) for o in offsets), size


def plan_routine(llc: ll.LLStmt, scratch: Sequence[Tnode], shared: bool = True) -> ScratchPlan:
    """The plan of a routine's scratch nodes (in parameter order) over its code `llc`; with
    `shared` off every node is live throughout, so no two share a byte."""
    buffers = live_intervals(llc, scratch)
    if not shared:
        end = max(len(list(ll.flatten(llc))) - 1, 0)
        buffers = [_whole(end, b.nbytes) for b in buffers]
    offsets, size = assign(buffers)
    return ScratchPlan(offsets, tuple(b.nbytes for b in buffers), size, tuple(buffers))


def scratch_nodes(llc: ll.LLStmt, syntax: CSyntax) -> list[Tnode]:
    """The nodes `c_syntax.render_routine` makes scratch parameters, in their order (by id):
    the local nodes it does not put on the stack, except those only parallel regions use
    (each thread allocates its own copy of those inside the region)."""
    layout = routine_layout(llc, syntax)
    local = [tn for tn in ll.nodes_of(layout.llc) if tn.is_local()]
    heap = set(local) - layout.placement.on_stack
    if syntax.num_threads > 1:
        heap -= region_only_nodes(layout.llc)
    return sorted(heap, key=lambda tn: tn.id)


BARRIER = '__asm__ __volatile__("" ::: "memory"); /* einjit: scratch bytes change arrays here */'
"""A compiler barrier (no instruction): gcc moves no memory access across it, `restrict` or not."""


def with_barriers(llc: ll.LLStmt, plan: ScratchPlan) -> ll.LLStmt:
    """`llc` with a `BARRIER` before each top-level statement where an array starts to live in
    bytes that another array, dead by then, used: every access of the dead array stays before
    it, every access of the new one after it, whatever gcc concludes from `restrict`."""
    top = list(ll.flatten(llc))
    last = np.array([a.last for a in plan.intervals], np.int64)
    lo = np.array(plan.offsets, np.int64)
    hi = lo + np.array(plan.nbytes, np.int64)
    starts = sorted({b.first for b, blo, bhi in zip(plan.intervals, lo, hi, strict=True)
                     if ((last < b.first) & (blo < hi) & (lo < bhi)).any()})
    if not starts:
        return llc
    out: list[ll.LLStmt] = []
    for k, stmt in enumerate(top):
        if starts and k == starts[0]:
            out.append(ll.StagedCompilation(_barrier))
            starts.pop(0)
        out.append(stmt)
    return ll.seq(*out)


def _barrier() -> str:
    return BARRIER


def place(llc: ll.LLStmt, syntax: CSyntax) -> tuple[ll.LLStmt, ScratchPlan | None]:
    """The code to render and its scratch plan: zeroing of scratch arrays sunk to first use
    (`sink_zero_outs`), the plan of its scratch nodes (None without any; sharing no bytes when
    `enabled()` is off), and `BARRIER`s where bytes change arrays (`with_barriers`)."""
    nodes = scratch_nodes(llc, syntax)
    if not nodes:
        return llc, None
    llc = sink_zero_outs(llc, set(nodes))
    plan = plan_routine(llc, nodes, shared=enabled())
    return with_barriers(llc, plan), plan


def sink_zero_outs(llc: ll.LLStmt, nodes: set[Tnode]) -> ll.LLStmt:
    """`llc` with each top-level `ZeroOut` of one of `nodes` moved to just before the next
    top-level statement that touches the node (kept where it is when none does); statements
    moved before the same one keep their order. `llc` itself when nothing moves."""
    top = list(ll.flatten(llc))
    target: dict[int, int] = {}
    seen: dict[Tnode, int] = {}
    for k in range(len(top) - 1, -1, -1):
        stmt = top[k]
        if isinstance(stmt, ll.ZeroOut) and stmt.tn in nodes and stmt.tn in seen:
            if seen[stmt.tn] > k + 1:
                target[k] = seen[stmt.tn]
            continue
        for tn in ll.nodes_of(stmt):
            seen[tn] = k
    if not target:
        return llc
    before: dict[int, list[ll.LLStmt]] = {}
    for k in sorted(target):
        before.setdefault(target[k], []).append(top[k])
    out: list[ll.LLStmt] = []
    for k, stmt in enumerate(top):
        if k not in target:
            out += before.get(k, [])
            out.append(stmt)
    return ll.seq(*out)
