"""Batched contractions whose packed operand does not depend on the batch: pack once.

`schedule.py` blocks a contraction with batch loops (lhs loops that are neither the row `i`
nor the column `j` axis) by running the whole blocked contraction once per batch cell:

    for b:  for j0:  pack[k, c] := B(j0, k);  for i0: kernel(b, i0, j0)

A transformer's dense layers are such contractions: `w @ x` over `batch, time | -> d` has the
batch as a batch loop and the time as the rows, and the packed operand is the weight, which
does not depend on the batch. Packing it once per batch cell repeats the same copy (a
transposing one for the forward's `w @ x`) batch-size times: in the GPT benchmark's MLP
(16 sequences of 64 tokens, 512 x 128 weights) the forward nests spent about as long packing
as multiplying. `batch_inside_panels` moves those batch loops inside the column panels,
after the packing:

    for j0:  pack[k, c] := B(j0, k);  for b:  for i0: kernel(b, i0, j0)

Every output cell still accumulates its terms in the same order (the k chunks, outside the
panels, keep theirs), so results stay bit-identical. When the batch loop ran on threads, the
panel loop does instead (each panel writes its own columns; each thread packs its own
panels: still one fork-join per nest), and a tail panel outside it runs its batch loop on
threads, sharing its packed panel as the row blocks of an unbatched contraction do. A batch
loop the packed operand depends on (the attention's `q kᵀ`, batched over sequences and heads
on both sides) stays outside. When the scheduler packs every panel before any row block
(`schedule._packs_all_panels`), the packing comes first and the batch loops go around all the
panels' row blocks at once:

    for j0:  pack[j0, k, c] := B(j0, k);  for b:  for j0:  for i0: kernel(b, i0, j0)
"""

from __future__ import annotations

import dataclasses

from einjit.ir import low_level as ll
from einjit.ir.indexing import Symbol, index_symbols
from einjit.ir.sched import nests
from einjit.ir.tnode import Tnode

__all__ = ["batch_inside_panels"]


def batch_inside_panels(pack: Tnode, batch: list[tuple[Symbol, int]], body: ll.LLStmt,
                        parallel: Symbol | None, panel: Symbol) -> ll.LLStmt:
    """`body` (a blocked contraction) under its `batch` loops (`(symbol, extent)`, outermost
    first; `parallel` the one on threads): the loops the filling of `pack` does not read go
    around each panel's row blocks instead of around the whole contraction. Only the loop over
    `panel` may take the threads of the batch loop (not a k-chunk loop: its steps add into
    the same cells one after the other)."""
    fills = _packs(body, pack)
    read = set().union(*(_symbols(st) for st in fills))
    inner = [(s, n) for s, n in batch if s not in read and n > 1]
    moved = _sink(list(ll.flatten(body)), pack, inner, parallel, panel) if fills and inner else None
    if moved is None:
        return nests.nest(batch, body, parallel=parallel)
    return nests.nest([(s, n) for s, n in batch if (s, n) not in inner], ll.seq(*moved), parallel=parallel)


def _sink(stmts: list[ll.LLStmt], pack: Tnode, inner: list[tuple[Symbol, int]],
          parallel: Symbol | None, panel: Symbol) -> list[ll.LLStmt] | None:
    """`stmts` with `inner` wrapped around the statements after each panel's packing (up to the
    next packing); None when a statement outside every panel computes something."""
    out: list[ll.LLStmt] = []
    k = 0
    while k < len(stmts):
        s = stmts[k]
        if _fills(s, pack):
            while k < len(stmts) and _fills(stmts[k], pack):
                out.append(stmts[k])
                k += 1
            rows: list[ll.LLStmt] = []
            while k < len(stmts) and not _writes(stmts[k], pack):
                rows.append(stmts[k])
                k += 1
            trailing: list[ll.LLStmt] = []
            while rows and isinstance(rows[-1], ll.Comment):
                trailing.insert(0, rows.pop())
            out.append(nests.nest(inner, ll.seq(*rows), parallel=parallel))
            out.extend(trailing)
        elif isinstance(s, ll.ForLoop) and _writes(s, pack):
            # the panel loop takes the threads of a batch loop it now holds: one fork-join
            # per nest, each thread packing its own panels
            panels = parallel in dict(inner) and s.index == panel and _fills(next(ll.flatten(s.body)), pack)
            body = _sink(list(ll.flatten(s.body)), pack, inner, None if panels else parallel, panel)
            if body is None:
                return None
            out.append(dataclasses.replace(s, body=ll.seq(*body), parallel=s.parallel or panels))
            k += 1
        elif isinstance(s, ll.Comment):
            out.append(s)
            k += 1
        else:
            return None
    return out


def _packs(stmt: ll.LLStmt, pack: Tnode) -> list[ll.Set]:
    """The assignments filling `pack` inside `stmt`."""
    match stmt:
        case ll.Set(tn, _, _, _) if tn is pack:
            return [stmt]
        case ll.ForLoop():
            return _packs(stmt.body, pack)
        case ll.Seq(a, b):
            return _packs(a, pack) + _packs(b, pack)
    return []


def _writes(stmt: ll.LLStmt, pack: Tnode) -> bool:
    return bool(_packs(stmt, pack))


def _fills(stmt: ll.LLStmt, pack: Tnode) -> bool:
    """Whether `stmt` only fills `pack` (a packing nest: loops around assignments to it)."""
    match stmt:
        case ll.Set(tn, _, _, _):
            return tn is pack
        case ll.ForLoop():
            return all(_fills(s, pack) for s in ll.flatten(stmt.body))
    return False


def _symbols(st: ll.Set) -> set[Symbol]:
    """The loop symbols an assignment reads or writes at."""
    return {s for idx in st.idcs for s in index_symbols(idx)} | nests.symbols(st.llsc)
