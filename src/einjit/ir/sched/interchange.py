"""Loop interchange, an optimizer stage for CPU code (`optimize_proc`'s "interchange").

Lowering emits product-space loops in einsum order, so `c[i,j] += a[i,k] * b[k,j]` arrives
as i-j-k with a strided innermost read of `b`. This stage moves the lhs's unit-stride loop
innermost. It only touches a perfect nest whose body is a single `Set` that reads its lhs at
exactly the written position, whose lhs indices are distinct plain iterators or constants,
and that has no local scope. Then every lhs cell is updated by its own sequence of statement
instances, and moving an lhs loop inward keeps the order of that sequence: results are
bit-identical. A nest with a `keep_order` loop is the scheduling stage's deliberate choice
and stays as it is. GPU backends map loops to threads themselves and skip this stage.
"""

from __future__ import annotations

import dataclasses

from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, AxisIndex, FixedIdx, Iterator, Symbol, index_symbols
from einjit.ir.tnode import Tnode


def interchange_loops(stmt: ll.LLStmt) -> ll.LLStmt:
    """Every eligible perfect nest of `stmt` with its best unit-stride loop innermost. Code
    with no loop to reorder is returned as it is (most nests of a training step are already in
    order, and rebuilding each of their loops cost most of the stage's time)."""
    parts = list(ll.flatten(stmt))
    new = [_interchange_stmt(s) for s in parts]
    if all(a is b for a, b in zip(parts, new, strict=True)):
        return stmt
    return ll.seq(*new)


def _interchange_stmt(s: ll.LLStmt) -> ll.LLStmt:
    if not isinstance(s, ll.ForLoop):
        return s
    loops, body = perfect_nest(s)
    inner = list(ll.flatten(body))
    if any(lp.keep_order for lp in loops):
        return s
    if len(loops) > 1 and len(inner) == 1 and isinstance(inner[0], ll.Set) and reorderable(inner[0]):
        order = best_order(loops, inner[0])
        return s if order is loops else rewrap(order, body)
    new_body = interchange_loops(body)
    return s if new_body is body else rewrap(loops, new_body)


def perfect_nest(loop: ll.ForLoop) -> tuple[list[ll.ForLoop], ll.LLStmt]:
    """The loops of the perfect nest starting at `loop`, outermost first, and its body."""
    loops, body = [loop], loop.body
    while True:
        inner = list(ll.flatten(body))
        if len(inner) != 1 or not isinstance(inner[0], ll.ForLoop):
            return loops, body
        loops.append(inner[0])
        body = inner[0].body


def rewrap(loops: list[ll.ForLoop], body: ll.LLStmt) -> ll.LLStmt:
    """`perfect_nest` undone: `loops` (kept as they are, marks included) around a new body."""
    for loop in reversed(loops):
        body = dataclasses.replace(loop, body=body)
    return body


def reorderable(st: ll.Set) -> bool:
    """Whether the loops around `st` may run in any order without changing any result."""
    syms = [idx.symbol for idx in st.idcs if isinstance(idx, Iterator)]
    if len(syms) != len(set(syms)) or not all(isinstance(i, (Iterator, FixedIdx)) for i in st.idcs):
        return False
    for x in ll.iter_scalars(st.llsc):
        match x:
            case ll.LocalScope():
                return False
            case ll.Get(tn, idcs) if tn is st.tn and idcs != st.idcs:
                return False
    return True


def unit_stride_symbol(tn: Tnode, idcs: tuple[AxisIndex, ...], s: Symbol) -> bool:
    """Whether stepping `s` by one moves the access `tn[idcs]` by one element."""
    for d, idx in reversed(list(zip(tn.dims, idcs, strict=True))):
        if d == 1:
            continue
        match idx:
            case Iterator(sym):
                return sym == s
            case Affine(terms, _):
                return any(sym == s and abs(c) == 1 for c, sym in terms)
            case _:
                return False
    return False


def best_order(loops: list[ll.ForLoop], st: ll.Set) -> list[ll.ForLoop]:
    """`loops` with the lhs loop that scores best moved innermost, if it beats the innermost
    loop. A loop scores one for each distinct access it steps at unit stride and loses one for
    each it steps by more; an access it leaves in place costs nothing. So a row sum that
    reads a row-broadcast value (`var[i] += (x[i, j] - mean[i]) ** 2`, twice in the expression)
    keeps its row loop innermost: the read of `mean[i]`, invariant there, no longer outvotes the
    unit-stride read of `x`."""
    accesses = {(st.tn, st.idcs)} | {(x.tn, x.idcs) for x in ll.iter_scalars(st.llsc)
                                     if isinstance(x, ll.Get) and x.tn is not st.tn}

    def score(loop: ll.ForLoop) -> int:
        return sum(1 if unit_stride_symbol(tn, idcs, loop.index) else -_steps(idcs, loop.index)
                   for tn, idcs in accesses)

    lhs_syms = {idx.symbol for idx in st.idcs if isinstance(idx, Iterator)}
    candidates = [lp for lp in loops[:-1] if lp.index in lhs_syms and lp.to_ > lp.from_]
    if not candidates:
        return loops
    best = max(candidates, key=score)
    if score(best) <= score(loops[-1]):
        return loops
    return [lp for lp in loops if lp is not best] + [best]


def _steps(idcs: tuple[AxisIndex, ...], s: Symbol) -> bool:
    """Whether stepping `s` moves the access at all."""
    return any(s in index_symbols(idx) for idx in idcs)
