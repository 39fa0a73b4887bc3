"""Covered fills: a zero fill dropped when the nests writing its node store every cell that is
ever read afterwards (`optimize_proc`'s "first_writes" stage, after `first_writes.first_writes`).

`first_writes` drops a fill whose writers store every cell of the node, and `causal` one whose
skipped cells are only read under a `where` that ignores them. The causal step keeps two more,
a 1 MiB `memset` each per block at the GPT benchmark's size:

    zero_out(dP)                               dP = dY vᵀ, row blocks clipped to the diagonal
    for b, h, jp, ib (start 8*ib >= 32*jp-7):  dP[b, 8*ib+ir, h, 32*jp+j] := acc[ir, j]
    for b, t, h, c (stop 8*c < t+1):           sum -= dP[b, t, h, 8*c+l] * P[b, t, h, 8*c+l]

    zero_out(dS)                               the softmax's backward, chunks clipped the same way
    for b, t, h, c (stop 8*c < t+1):           dS[b, t, h, 8*c+l] := fma(..., 0.1767, dS[b, t, h, 8*c+l])
    for b, h, ib, s (stop s < 8*ib+8):         acc[ir, :] += dS[b, 8*ib+ir, h, s] * k[b, s, h, :]

The readers multiply the skipped cells by zero weights, which is why `causal` keeps the fills (a
stale NaN times zero is a NaN), but after the clipping no reader reaches them: the softmax's
chunks stop at the end of the 8 keys holding the diagonal, the 32-key panel of `dY vᵀ` holding
it is stored whole, and the products of `dS` stop at the end of their row block. Proving that
needs the cells themselves: the clips bound one loop by another's index at a different
granularity on each side. So the cells are counted, in NumPy, for nodes a clipped loop touches:
each access's loops are enumerated (only those its indices or clips depend on), giving the cells
each writer stores and each later statement reads.

The fill goes when the node is this routine's own storage (no host or other routine sees its
skipped cells), the statements touching it after the fill are first its writers, then readers
only, and every cell read was written. A writer's update `g =+ e` into the freshly zeroed node
becomes the store `g := e`, as in `first_writes`, when it updates each cell once and no store of
the writers touches the same cell: `0 + e` is `e`, so every value read is the same bits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator as PyIterator

import numpy as np

from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, AxisIndex, FixedIdx, Iterator, Symbol, index_symbols
from einjit.ir.sched.causal import may_be_local
from einjit.ir.sched.first_writes import update_term
from einjit.ir.tnode import Tnode

__all__ = ["MAX_CELLS", "accesses", "cells", "drop_covered_fills", "touching"]

#: The most cells a node may have, and the most iterations one access may enumerate, for the
#: count to be worth its compile time (the benchmark's nodes: 2**18 cells).
MAX_CELLS = 1 << 22

Access = tuple["ll.Set | ll.Get | ll.GetMergeBuffer | ll.LLStmt", tuple[ll.ForLoop, ...]]


def drop_covered_fills(llc: ll.LLStmt, *, local_storage: bool) -> ll.LLStmt:
    """`llc` without the zero fills whose cells no reader uses (see the module docstring);
    with `local_storage` off, every node may be seen outside the routine, and `llc` is kept."""
    items = list(ll.flatten(llc))
    if not local_storage or not any(isinstance(s, ll.ZeroOut) for s in items):
        return llc
    clipped = [any(isinstance(x, ll.ForLoop) and (x.start or x.stop) for x in ll.iter_stmts(s)) for s in items]
    if not any(clipped):
        return llc
    users = touching(items)
    dropped: set[int] = set()
    for n, s in enumerate(items):
        if not isinstance(s, ll.ZeroOut) or not may_be_local(s.tn) or s.tn.size > MAX_CELLS:
            continue
        after = [k for k in users[s.tn] if k > n]
        if not any(clipped[k] for k in after):
            continue
        rewritten = _covering_writers([items[k] for k in after], s.tn)
        if rewritten is not None:
            for k, new in zip(after, rewritten, strict=False):
                items[k] = new
            dropped.add(n)
    return ll.seq(*(s for n, s in enumerate(items) if n not in dropped))


def touching(items: list[ll.LLStmt]) -> dict[Tnode, list[int]]:
    """For each node, the positions of the statements of `items` that touch it."""
    out: dict[Tnode, list[int]] = {}
    for k, s in enumerate(items):
        for tn in ll.nodes_of(s):
            out.setdefault(tn, []).append(k)
    return out


def _covering_writers(stmts: list[ll.LLStmt], tn: Tnode) -> list[ll.LLStmt] | None:
    """The writers among `stmts` (the statements touching `tn` after its fill, in order) with
    their updates turned into stores, when they come first and store every cell the others
    read; None otherwise."""
    writes = [any(isinstance(a, (ll.Set, ll.SetFromVec, ll.ZeroOut)) for a, _ in accesses(s, tn)) for s in stmts]
    n_writers = writes.index(False) if False in writes else len(writes)
    if n_writers == 0 or any(writes[n_writers:]):
        return None
    stored = np.zeros(tn.size, dtype=bool)
    updated = np.zeros(tn.size, dtype=np.int64)
    terms: dict[int, ll.Set] = {}
    for stmt in stmts[:n_writers]:
        own = None  # the cell the update just met reads, which comes right after it
        for access, loops in accesses(stmt, tn):
            if own is not None and access == own:
                continue
            if not isinstance(access, ll.Set):
                return None  # a read of the node among its writes, or a vector store
            update = _reads_node(access.llsc, tn)
            at = cells(access.idcs, loops, tn.dims, exact=True, every=update)
            if at is None:
                return None
            own = None
            if not update:
                stored[at] = True
                continue
            term = update_term(access)
            if term is None:
                return None
            own = ll.Get(tn, access.idcs)
            np.add.at(updated, at, 1)
            terms[id(access)] = ll.Set(tn, access.idcs, term, access.debug.replace(" =+ ", " =: ", 1))
    if np.any(updated > 1) or np.any(stored & (updated > 0)):
        return None
    written = stored | (updated > 0)
    for stmt in stmts[n_writers:]:
        for access, loops in accesses(stmt, tn):
            if not isinstance(access, (ll.Get, ll.GetMergeBuffer)):
                return None
            at = cells(access.idcs, loops, tn.dims, exact=False)
            if at is None or not np.all(written[at]):
                return None
    return [_with_sets(s, terms) for s in stmts[:n_writers]]


def _reads_node(sc: ll.LLScalar, tn: Tnode) -> bool:
    return any(isinstance(x, (ll.Get, ll.GetMergeBuffer)) and x.tn is tn for x in ll.deep_parts(sc))


def accesses(stmt: ll.LLStmt, tn: Tnode, loops: tuple[ll.ForLoop, ...] = ()) -> PyIterator[Access]:
    """Every write and read of `tn` under `stmt`, with the loops around it (outermost first),
    those of local scopes included; an update `g := g + e` gives its write, then its read. A
    statement touching `tn` that is neither (a fill, a staged compilation) comes as itself."""
    for s in ll.flatten(stmt):
        match s:
            case ll.ForLoop(body=body):
                yield from accesses(body, tn, (*loops, s))
            case ll.Set(llsc=sc) | ll.SetFromVec(arg=sc):
                if s.tn is tn:
                    yield s, loops
                yield from _scalar_reads(sc, tn, loops)
            case ll.SetLocal(value=sc):
                yield from _scalar_reads(sc, tn, loops)
            case ll.ZeroOut(tn=t) if t is tn:
                yield s, loops
            case ll.StagedCompilation():
                yield s, loops


def _scalar_reads(sc: ll.LLScalar, tn: Tnode, loops: tuple[ll.ForLoop, ...]) -> PyIterator[Access]:
    stack = [sc]
    while stack:
        x = stack.pop()
        match x:
            case ll.Get(tn=t) | ll.GetMergeBuffer(tn=t) if t is tn:
                yield x, loops
            case ll.LocalScope(body=body):
                yield from accesses(body, tn, loops)
            case _:
                stack.extend(ll.scalar_children(x))


def cells(idcs: tuple[AxisIndex, ...], loops: tuple[ll.ForLoop, ...], dims: tuple[int, ...],
           exact: bool, every: bool = False) -> np.ndarray | None:
    """The flat positions of the cells an access at `idcs` reaches over `loops`, enumerated:
    only the loops its indices and their clips depend on (with `exact`, every clipped loop too,
    and none empty: a write must happen for its cell to count; with `every`, every loop, so
    that a cell comes once per visit: an update inside a loop its index does not name sums
    into the cell more than once); None when an index is not affine in the loops, leaves the
    node or the iterations are too many to count."""
    by_symbol = {lp.index: lp for lp in loops}
    needed: set[Symbol] = {lp.index for lp in loops} if every else set()
    for idx in idcs:
        if not isinstance(idx, (FixedIdx, Iterator, Affine)):
            return None
        needed.update(index_symbols(idx))
    if exact:
        needed.update(lp.index for lp in loops if lp.start is not None or lp.stop is not None)
    for lp in reversed(loops):  # clips depend on outer indices only
        if lp.index in needed:
            needed.update(s for clip in (lp.start, lp.stop) if clip is not None for s in index_symbols(clip.bound))
    if not needed <= by_symbol.keys():
        return None  # a static symbol
    if exact and any(lp.from_ > lp.to_ for lp in loops):
        return np.zeros(0, dtype=np.int64)
    # the flat position is affine in the loop indices: its weights, and each axis in bounds
    # over the loops' widest ranges (a clip only narrows them)
    weight: dict[Symbol, int] = {}
    flat_offset = 0
    for idx, stride, dim in zip(idcs, ll.row_major_strides(dims), dims, strict=True):
        terms, offset = _terms(idx)
        low = high = offset
        for c, sym in terms:
            weight[sym] = weight.get(sym, 0) + c * stride
            ends = (c * by_symbol[sym].from_, c * by_symbol[sym].to_)
            low, high = low + min(ends), high + max(ends)
        if low < 0 or high >= dim:
            return None
        flat_offset += offset * stride
    bounded = {sym for lp in loops if lp.index in needed
               for clip in (lp.start, lp.stop) if clip is not None for sym in index_symbols(clip.bound)}
    columns: dict[Symbol, np.ndarray] = {}  # the indices later clips read
    flat = np.full(1, flat_offset, dtype=np.int64)
    for lp in loops:
        if lp.index not in needed:
            continue
        rows = flat.size
        lo = np.full(rows, lp.from_, dtype=np.int64)
        hi = np.full(rows, lp.to_ + 1, dtype=np.int64)
        if lp.start is not None:
            lo = np.maximum(lo, -(-_value(lp.start.bound, columns, rows) // lp.start.scale))
        if lp.stop is not None:
            hi = np.minimum(hi, -(-_value(lp.stop.bound, columns, rows) // lp.stop.scale))
        counts = np.maximum(hi - lo, 0)
        total = int(counts.sum())
        if total > MAX_CELLS:
            return None
        picks = np.repeat(np.arange(rows), counts)
        values = lo[picks] + np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        flat = flat[picks] + weight.get(lp.index, 0) * values
        columns = {sym: v[picks] for sym, v in columns.items()}
        if lp.index in bounded:
            columns[lp.index] = values
    return flat


def _terms(idx: AxisIndex) -> tuple[list[tuple[int, Symbol]], int]:
    match idx:
        case FixedIdx(k):
            return [], k
        case Iterator(sym):
            return [(1, sym)], 0
        case Affine(terms, offset):
            return list(terms), offset
    raise AssertionError(idx)


def _value(idx: AxisIndex, columns: dict[Symbol, np.ndarray], rows: int) -> np.ndarray:
    match idx:
        case FixedIdx(k):
            return np.full(rows, k, dtype=np.int64)
        case Iterator(s):
            return columns[s]
        case Affine(terms, offset):
            out = np.full(rows, offset, dtype=np.int64)
            for c, s in terms:
                out = out + c * columns[s]
            return out
    raise AssertionError(idx)


def _with_sets(stmt: ll.LLStmt, sets: dict[int, ll.Set]) -> ll.LLStmt:
    """`stmt` with the `Set`s named by id in `sets` replaced."""
    match stmt:
        case ll.Seq(a, b):
            return ll.Seq(_with_sets(a, sets), _with_sets(b, sets))
        case ll.ForLoop(body=body):
            return dataclasses.replace(stmt, body=_with_sets(body, sets))
        case ll.Set() if id(stmt) in sets:
            return sets[id(stmt)]
    return stmt
