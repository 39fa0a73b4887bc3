"""Trimmed writes: a loop storing cells nobody reads clipped, by whole vectors, to the chunks
some reader reaches (`optimize_proc`'s "trim" stage, after the fused nests' rows became row buffers).

The causal softmax divides every row of its weights by the row's total, the masked zeros above
the diagonal included, though after the causal clipping no reader reaches most of them:

    for b, t, h, s:                             P[b, t, h, s] := e[b, t, h, s] / total[b, t, h]
    P v:   for b, h, ib, s (stop s < 8*ib+8):   ... P[b, 8*ib+ir, h, s] ...
    Pᵀ dY: for b, h, ib, t (start t >= 8*ib):   ... P[b, t, h, 8*ib+ir] ...
    dP·P:  for b, t, h, c (stop 8*c < t+1):     ... P[b, t, h, 8*c+l] ...

Each reader stops at the end of the 8 keys holding the diagonal, so the division's loop over
the keys becomes chunks of 8 with `stop 8*c < t + 1` (a 64-key row: 36 of 64 divisions on
average). The clip is read off the readers themselves: the cells they reach are counted in NumPy
(`covered_fills.cells`), and for the store's loop over one axis of the node (the key) and a loop
around it over another (the query), the chunks kept are those up to the chunk of the last key
read at each query, written `CHUNK*c < q + c1` with the least `c1` that covers every query.

The node must be this routine's own storage, written by that one store, never filled, and read
only outside the store's loop; the loop innermost around the store alone, whole chunks from 0.
The cells the clipped loop writes are counted again and must hold every cell read: a cell
nobody reads may keep whatever it held, and every cell read gets the value it had.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, index_symbols, make_affine
from einjit.ir.sched.causal import CHUNK, chunked, may_be_local
from einjit.ir.sched.covered_fills import MAX_CELLS, accesses, cells, touching
from einjit.ir.tnode import Tnode

__all__ = ["trim_writes"]


def trim_writes(llc: ll.LLStmt, *, local_storage: bool) -> ll.LLStmt:
    """`llc` with the loops storing only partly read nodes clipped (see the module docstring);
    with `local_storage` off, every node may be read outside the routine, and `llc` is kept."""
    if not local_storage:
        return llc
    items = list(ll.flatten(llc))
    read_clipped = _read_in_clipped_loops(items)
    if not read_clipped:
        return llc
    routine = _Routine(items, touching(items))
    return ll.seq(*(_trimmed(top, (), routine, read_clipped) for top in items))


def _read_in_clipped_loops(items: list[ll.LLStmt]) -> dict[Tnode, set[int]]:
    """For each node some clipped loop reads, the axes that loop's index reaches: only along
    those can a store's loop write cells no reader reaches."""
    found: dict[Tnode, set[int]] = {}
    for top in items:
        for x in ll.iter_stmts(top):
            if isinstance(x, ll.ForLoop) and (x.start is not None or x.stop is not None):
                for y in ll.deep_parts(x):
                    if isinstance(y, ll.Get):
                        axes = (p for p, idx in enumerate(y.idcs) if x.index in index_symbols(idx))
                        found.setdefault(y.tn, set()).update(axes)
    return found


@dataclasses.dataclass(frozen=True)
class _Routine:
    """The routine's top-level statements, and for each node the positions of those touching it."""

    items: list[ll.LLStmt]
    users: dict[Tnode, list[int]]

    def touching(self, tn: Tnode) -> list[ll.LLStmt]:
        return [self.items[k] for k in self.users.get(tn, [])]


def _trimmed(stmt: ll.LLStmt, loops: tuple[ll.ForLoop, ...], routine: _Routine,
             candidates: dict[Tnode, set[int]]) -> ll.LLStmt:
    match stmt:
        case ll.Seq(a, b):
            return ll.Seq(_trimmed(a, loops, routine, candidates), _trimmed(b, loops, routine, candidates))
        case ll.ForLoop(index=index, body=ll.Set(tn=tn, idcs=idcs) as st) if any(
                Iterator(index) == idcs[p] for p in candidates.get(tn, ())):
            clipped = _clipped(stmt, st, loops, routine)
            return stmt if clipped is None else clipped
        case ll.ForLoop(body=body):
            inner = _trimmed(body, (*loops, stmt), routine, candidates)
            return stmt if inner is body else dataclasses.replace(stmt, body=inner)
    return stmt


def _clipped(loop: ll.ForLoop, st: ll.Set, loops: tuple[ll.ForLoop, ...], routine: _Routine) -> ll.ForLoop | None:
    """`loop` (around the store `st` alone) clipped by chunks to the cells the rest of the
    `routine` reads, when that keeps fewer chunks and covers every read; None otherwise."""
    tn = st.tn
    extent = loop.to_ - loop.from_ + 1
    if (loop.from_ != 0 or extent % CHUNK or extent == CHUNK or loop.unroll or loop.parallel
            or loop.start is not None or loop.stop is not None or tn.size > MAX_CELLS
            or not may_be_local(tn) or any(isinstance(x, ll.Get) and x.tn is tn for x in ll.deep_parts(st.llsc))):
        return None
    axes = {idx.symbol: p for p, idx in enumerate(st.idcs) if isinstance(idx, Iterator)}
    if loop.index not in axes:
        return None
    read = np.zeros(tn.size, dtype=bool)
    for top in routine.touching(tn):
        for access, around in accesses(top, tn):
            if access is st:
                continue
            if not isinstance(access, (ll.Get, ll.GetMergeBuffer)):
                return None  # another write or a fill: its cells are not this store's alone
            found = cells(access.idcs, around, tn.dims, exact=False)
            if found is None:
                return None
            read[found] = True
    key = axes[loop.index]
    best: tuple[int, ll.ForLoop] | None = None
    for q in loops:
        if q.index not in axes or q.start is not None or q.stop is not None:
            continue
        query = axes[q.index]
        last = _last_read(read.reshape(tn.dims), key, query)
        if last is None:
            continue  # a query no read reaches: no clip of this form keeps its keys alone
        c1 = max(CHUNK * (k // CHUNK) - t for t, k in enumerate(last)) + 1
        kept = sum(max(0, min(extent // CHUNK, -(-(t + c1) // CHUNK))) for t in range(len(last)))
        if kept >= len(last) * (extent // CHUNK):
            continue
        trimmed = chunked(dataclasses.replace(loop, stop=ll.LoopClip(make_affine([(1, q.index)], c1))))
        if best is None or kept < best[0]:
            best = (kept, trimmed)
    if best is None or best[1].index == loop.index:
        return None  # `chunked` keeps a loop it cannot split into whole chunks
    written = cells(_chunk_store(best[1]).idcs, (*loops, best[1], _lanes(best[1])), tn.dims, exact=True)
    if written is None:
        return None
    covered = np.zeros(tn.size, dtype=bool)
    covered[written] = True
    return best[1] if not np.any(read & ~covered) else None


def _last_read(read: np.ndarray, key: int, query: int) -> list[int] | None:
    """Per query, the last key read (any other axes); None when some query reads none."""
    plane = np.moveaxis(read, (query, key), (0, 1)).reshape(read.shape[query], read.shape[key], -1)
    reached = np.asarray(plane.any(axis=2))
    if not reached.any(axis=1).all():
        return None
    return [int(np.flatnonzero(reached[t]).max()) for t in range(reached.shape[0])]


def _lanes(chunks: ll.ForLoop) -> ll.ForLoop:
    assert isinstance(chunks.body, ll.ForLoop)
    return chunks.body


def _chunk_store(chunks: ll.ForLoop) -> ll.Set:
    store = _lanes(chunks).body
    assert isinstance(store, ll.Set)
    return store
