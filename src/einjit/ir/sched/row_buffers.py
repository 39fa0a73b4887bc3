"""Row buffers: an array that one fused nest writes and reads within each row's iteration,
and no other statement touches, shrinks to one row (`optimize_proc`'s "rows" stage, CPU,
after fusion).

Fusion (`fusion.py`) runs LayerNorm's backward, softmax or a bias gradient as one pass over
each block of rows, but every intermediate node of the pass is still a whole array: the GPT
step's LayerNorm backward stored three 512 KiB gradients that only its own row iteration
reads back (`grad_58 := grad_59 * gamma`, then `grad_54 := grad_58 * rsqrt`, then the mean's
broadcast), and softmax two 1 MiB ones (the masked scores and the masked exponentials). Each
is a store stream to the last-level cache or memory for values already in L1. Here such a
node becomes a scheduler local holding one iteration's slice — array contraction:

- the node may be routine-local (`causal.may_be_local`: no host, no other routine reads it)
  and no other top-level statement accesses it (nor a merge buffer, a whole-array write, or a
  register block): its cells matter only inside the nest;
- going down from the nest's outer loop, each loop taken (while one statement of its body
  holds every access) is a slicing loop: every access indexes the loop's own iterator at one
  axis, the same one in all of them, and no other axis depends on it, so iterations touch
  disjoint cells;
- in the innermost loop taken, the first statement touching the node writes its whole slice
  (a perfect nest of unclipped loops, one per remaining axis over all of it, around a store
  that does not read the node; or a loop over one remaining axis, slicing the node there,
  whose body does so for the rest), so every read in an iteration reads that iteration's
  values;
- the last statement touching the node there reads it last (it only reads it, or it is a
  loop slicing the node whose body's last statement touching it does): the iteration
  consumes what it wrote. A node whose last write nothing reads is a result (`local_storage`: kept in the
  context for whoever reads it next), even if no other statement of this routine touches it.

LayerNorm's backward reads its input gradient in two passes over a block of rows (the row
sums, then the gradient): that node keeps the block's rows, 32 KiB instead of 512 KiB.

The sliced axes are dropped from the node's indices; the local keeps the other axes, but one
cell of an axis its first write stores one value along (the loop over it appears nowhere else
in the store: LayerNorm's backward broadcast the mean's gradient over a row of 128 cells, then
read the row twice): that write stores its one cell once, and the reads read it. Values are
unchanged, so results are bit-identical. At several threads the local is each thread's
own (`parallel_loops.scheduler_locals`): it is written before it is read in every iteration.
"""

from __future__ import annotations

import dataclasses

from einjit.ir import low_level as ll
from einjit.ir import provenance
from einjit.ir.indexing import FixedIdx, Iterator, Symbol, index_symbols
from einjit.ir.sched.causal import may_be_local
from einjit.ir.sched.fusion import Access, accesses, slice_axis
from einjit.ir.sched.nests import retarget, scheduler_local, symbols, whole_loops
from einjit.ir.tnode import Tnode

__all__ = ["row_buffers"]


def row_buffers(llc: ll.LLStmt, *, local_storage: bool = True) -> ll.LLStmt:
    """`llc` with the nodes that qualify (see the module) shrunk to one iteration's slice."""
    items = list(ll.flatten(llc))
    if not local_storage:
        return llc
    touched: list[list[Access]] = []
    seen: dict[Tnode, int] = {}
    excluded: set[Tnode] = set()
    for s in items:
        for x in ll.deep_parts(s):
            match x:
                case ll.StagedCompilation():
                    return llc
                case ll.GetMergeBuffer(tn, _):
                    excluded.add(tn)
        acc = accesses(s)
        touched.append(acc)
        for tn in {tn for tn, _, _ in acc}:
            seen[tn] = seen.get(tn, 0) + 1
    out: list[ll.LLStmt] = []
    for s, acc in zip(items, touched, strict=True):
        written = {tn for tn, _, w in acc if w and seen[tn] == 1 and tn not in excluded}
        for tn in sorted((tn for tn in written if _candidate(tn, acc)), key=lambda t: t.id):
            axes, first = _sliced_axes(s, tn) if isinstance(s, ll.ForLoop) else ((), None)
            if axes:
                s = _shrink(s, tn, axes, first, _uniform_axes(s, first, tn, axes))
        out.append(s)
    return ll.seq(*out)


def _candidate(tn: Tnode, acc: list[Access]) -> bool:
    return (may_be_local(tn) and tn.provenance != provenance.REGISTER_BLOCK
            and not (tn.is_local() and tn.label[:1] in (["pack"], ["lanes"], ["acc"], ["edge"]))
            and all(idcs is not None for t, idcs, _ in acc if t is tn))


def _sliced_axes(top: ll.ForLoop, tn: Tnode) -> tuple[tuple[int, ...], ll.LLStmt | None]:
    """The axes of `tn` sliced by the loops from `top` down to the deepest one whose body first
    writes the whole slice, and that first write; () when there is none (see the module)."""
    best: tuple[int, ...] = ()
    first: ll.LLStmt | None = None
    axes: list[int] = []
    loop: ll.LLStmt = top
    while isinstance(loop, ll.ForLoop) and not loop.unroll:
        found = {slice_axis(idcs, loop.index) for t, idcs, _ in accesses(loop) if t is tn}
        axis = found.pop() if len(found) == 1 else None
        if axis is None or axis in axes:
            break
        axes.append(axis)
        inner = [x for x in ll.flatten(loop.body) if any(t is tn for t, _, _ in accesses(x))]
        if (inner and len(axes) < len(tn.dims) and _writes_slice(inner[0], tn, frozenset(axes))
                and _read_last(inner[-1], tn)):
            best, first = tuple(axes), inner[0]
        if len(inner) != 1:
            break
        loop = inner[0]
    return best, first


def _uniform_axes(top: ll.LLStmt, first: ll.LLStmt | None, tn: Tnode, axes: tuple[int, ...]) -> dict[int, Symbol]:
    """The axes of `tn`'s slice (not in `axes`) along which `first`, a perfect nest of whole
    loops around the only store into `tn` in `top`, stores one value: the loop over the axis
    indexes nothing else in the store. By axis, that loop's symbol."""
    whole = whole_loops(first) if first is not None else None
    if whole is None or not isinstance(st := whole[1], ll.Set) or st.tn is not tn:
        return {}
    if (sum(1 for t, _, w in accesses(top) if t is tn and w) != 1
            or any(isinstance(x, ll.LocalScope) for x in ll.iter_scalars(st.llsc))):
        return {}  # a scope's reads are not among `symbols`: its value may vary
    uniform: dict[int, Symbol] = {}
    for a, idx in enumerate(st.idcs):
        if a in axes or not isinstance(idx, Iterator) or idx.symbol not in whole[0]:
            continue
        elsewhere = symbols(st.llsc).union(*(index_symbols(i) for b, i in enumerate(st.idcs) if b != a))
        if idx.symbol not in elsewhere:
            uniform[a] = idx.symbol
    return uniform


def _read_last(stmt: ll.LLStmt, tn: Tnode) -> bool:
    """Whether what `stmt` does last to `tn` is a read: it does not write `tn`, or it is a loop
    slicing `tn` whose body's last statement touching `tn` reads last."""
    if not any(w for t, _, w in accesses(stmt) if t is tn):
        return True
    if not isinstance(stmt, ll.ForLoop):
        return False
    found = {slice_axis(idcs, stmt.index) for t, idcs, _ in accesses(stmt) if t is tn}
    inner = [x for x in ll.flatten(stmt.body) if any(t is tn for t, _, _ in accesses(x))]
    return len(found) == 1 and None not in found and bool(inner) and _read_last(inner[-1], tn)


def _writes_slice(stmt: ll.LLStmt, tn: Tnode, fixed: frozenset[int]) -> bool:
    """Whether `stmt` stores into every cell of `tn`'s slice (the axes not in `fixed`) before
    it reads any: a perfect nest of unclipped loops, one per axis over the whole of it, around
    a store that does not read `tn`; or an unclipped loop over the whole of one such axis,
    slicing `tn` there, whose body's first statement touching `tn` does so for the rest."""
    if isinstance(stmt, ll.ForLoop) and stmt.start is None and stmt.stop is None and stmt.from_ == 0:
        found = {slice_axis(idcs, stmt.index) for t, idcs, _ in accesses(stmt) if t is tn}
        axis = found.pop() if len(found) == 1 else None
        inner = [x for x in ll.flatten(stmt.body) if any(t is tn for t, _, _ in accesses(x))]
        if (axis is not None and axis not in fixed and stmt.to_ + 1 == tn.dims[axis] and inner
                and _writes_slice(inner[0], tn, fixed | {axis})):
            return True
    whole = whole_loops(stmt)
    if whole is None:
        return False
    extent, stmt = whole
    if not isinstance(stmt, ll.Set) or stmt.tn is not tn or any(t is tn for t, _, w in accesses(stmt) if not w):
        return False
    free = [(a, idx) for a, idx in enumerate(stmt.idcs) if a not in fixed]
    symbols = [idx.symbol for _, idx in free if isinstance(idx, Iterator)]
    return (len(symbols) == len(free) == len(extent) and len(set(symbols)) == len(symbols)
            and all(extent.get(idx.symbol) == tn.dims[a] for a, idx in free if isinstance(idx, Iterator)))


def _shrink(stmt: ll.LLStmt, tn: Tnode, axes: tuple[int, ...], first: ll.LLStmt | None,
            uniform: dict[int, Symbol]) -> ll.LLStmt:
    """`stmt` with `tn` replaced by a local of its axes other than `axes`, of one cell along
    the `uniform` axes, whose loops in `first` (the write) go: that write then stores its one
    cell once. (Only there: a sibling loop may run over the same symbol.)"""
    if uniform and first is not None:
        drop = set(uniform.values())
        stmt = _replaced(stmt, first, _without_loops(first, drop))
    row = scheduler_local("row", tuple(1 if a in uniform else d for a, d in enumerate(tn.dims) if a not in axes),
                          tn.prec)
    return retarget(stmt, {tn: row}, writes=True, at=lambda ix: tuple(
        FixedIdx(0) if a in uniform else i for a, i in enumerate(ix) if a not in axes))


def _without_loops(stmt: ll.LLStmt, drop: set[Symbol]) -> ll.LLStmt:
    """A perfect nest `stmt` with the loops over `drop` replaced by their bodies."""
    match stmt:
        case ll.ForLoop(index=index, body=body):
            inner = _without_loops(body, drop)
            return inner if index in drop else dataclasses.replace(stmt, body=inner)
    return stmt


def _replaced(stmt: ll.LLStmt, old: ll.LLStmt, new: ll.LLStmt) -> ll.LLStmt:
    """`stmt` with the statement `old` (itself, not an equal one) replaced by `new`."""
    if stmt is old:
        return new
    match stmt:
        case ll.Seq(a, b):
            return ll.Seq(_replaced(a, old, new), _replaced(b, old, new))
        case ll.ForLoop(body=body):
            return dataclasses.replace(stmt, body=_replaced(body, old, new))
    return stmt
