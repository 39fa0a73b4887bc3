"""Building and reading loop nests around one scalar statement: what the scheduling stage's
rewrites (`schedule.py`, `schedule_conv.py`) share to take a nest apart and build new ones."""

from __future__ import annotations

from einjit.ir import low_level as ll
from einjit.ir import ops, provenance
from einjit.ir.indexing import AxisIndex, Iterator, Symbol, index_symbols, subst_index
from einjit.ir.tnode import LOCAL, Tnode


def reads(sc: ll.LLScalar, tn: Tnode) -> bool:
    """Whether `sc` reads `tn` (its own array or its merge buffer): a term reading the node a
    nest accumulates into cannot be moved or split like the others."""
    return any(isinstance(x, (ll.Get, ll.GetMergeBuffer)) and x.tn is tn for x in ll.iter_scalars(sc))


def symbols(sc: ll.LLScalar) -> set[Symbol]:
    """The loop symbols `sc` depends on: which loops an operand varies along decides which
    operand is packed and which loops its panel is filled inside."""
    out: set[Symbol] = set()
    for x in ll.iter_scalars(sc):
        match x:
            case ll.Get(_, idcs) | ll.GetMergeBuffer(_, idcs):
                out.update(s for idx in idcs for s in index_symbols(idx))
            case ll.EmbedIndex(idx):
                out.update(index_symbols(idx))
    return out


def subst(sc: ll.LLScalar, env: dict[Symbol, AxisIndex]) -> ll.LLScalar:
    """`sc` with loop symbols replaced by indices, to read an operand from a block, a panel or
    a lane instead of the original loop. Local scopes are not entered: the rewrites take only
    nests without them (`interchange.reorderable`)."""
    match sc:
        case ll.Get(tn, idcs):
            return ll.Get(tn, tuple(subst_index(env, i) for i in idcs))
        case ll.GetMergeBuffer(tn, idcs):
            return ll.GetMergeBuffer(tn, tuple(subst_index(env, i) for i in idcs))
        case ll.EmbedIndex(idx):
            return ll.EmbedIndex(subst_index(env, idx))
        case ll.Unop(op, a):
            return ll.Unop(op, subst(a, env))
        case ll.Binop(op, a, b):
            return ll.Binop(op, subst(a, env), subst(b, env))
        case ll.Ternop(op, a, b, c):
            return ll.Ternop(op, subst(a, env), subst(b, env), subst(c, env))
    return sc


def nest(loops: list[tuple[Symbol, int]], body: ll.LLStmt, unrolled: frozenset[Symbol] = frozenset(),
         parallel: Symbol | None = None) -> ll.LLStmt:
    """Loops `(symbol, extent)` from 0, outermost first, around `body`; those in `unrolled`
    marked for complete unrolling, the one named `parallel` for threads."""
    for s, n in reversed(loops):
        body = ll.ForLoop(s, 0, n - 1, body, unroll=s in unrolled, parallel=s == parallel)
    return body


def scheduler_local(label: str, dims: tuple[int, ...], prec: ops.Prec) -> Tnode:
    """A node the scheduler introduces (a packed panel, an accumulator block, partial sums):
    local to the routine, with the provenance that says so in memory reports and errors."""
    return Tnode(label, dims, prec, memory_mode=LOCAL, provenance=provenance.SCHEDULED_LOCAL)


def unit_stride_axis_symbol(tn: Tnode, idcs: tuple[AxisIndex, ...]) -> Symbol | None:
    """The loop symbol indexing the innermost axis of `tn[idcs]` longer than one, when that
    index is a plain iterator: the loop along which the access is contiguous."""
    for d, idx in reversed(list(zip(tn.dims, idcs, strict=True))):
        if d == 1:
            continue
        return idx.symbol if isinstance(idx, Iterator) else None
    return None
