"""Float copies of the bf16 nodes a contraction's row operand reads, for the fp32 fallback.

A register block broadcasts its row operand `A(i, k)` once per row and `k`. Where `A` is bf16
and the kernel is the float one (no bf16 dot product, or a layout `bf16_pairs` does not
take), every broadcast first widened the bf16 read (a shift and a move into a vector
register), and a 512 x 512 bf16 matmul ran at 0.57x einjit's fp32 one. The column operand is
widened once per panel while packing; the row operand has no pack, and widening each block's
rows into a float copy still widens every element once per column panel (0.78x). So the
scheduler widens each bf16 node the row operand reads into a float copy of the whole node,
once, before the contraction: the kernel is then the fp32 kernel on the copy, and the
contraction costs the fp32 one plus one pass over the operand. The values are those the
kernel computed before (widening is exact), so results are bit-identical.

A node that the contraction reads too little of to repay a pass over all of it (fewer than
`MIN_REUSE` multiply-adds per element: a slice of a larger node) keeps its widening reads.
"""

from __future__ import annotations

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.sched import nests
from einjit.ir.tnode import Tnode

__all__ = ["MIN_REUSE", "copies", "fills", "reading", "share_fills"]

MIN_REUSE = 4
"""Multiply-adds per element of a bf16 node below which it is not copied."""


def copies(sc: ll.LLScalar, work: int, prec: ops.Prec) -> dict[Tnode, Tnode]:
    """A float copy (of `prec`, the contraction's computed precision) of each bf16 node `sc`
    reads, for a contraction of `work` multiply-adds."""
    read = {x.tn for x in ll.iter_scalars(sc) if isinstance(x, ll.Get) and x.tn.prec is ops.bf16}
    return {tn: nests.scheduler_local("wide", tn.dims, prec)
            for tn in sorted(read, key=lambda t: t.id) if work >= MIN_REUSE * tn.size}


def reading(sc: ll.LLScalar, wide: dict[Tnode, Tnode]) -> ll.LLScalar:
    """`sc` reading the copies in `wide` instead of their bf16 nodes."""
    match sc:
        case ll.Get(tn, idcs) if tn in wide:
            return ll.Get(wide[tn], idcs)
        case ll.Unop() | ll.Binop() | ll.Ternop():
            return ll.map_operands(sc, lambda x: reading(x, wide))
    return sc


def fills(wide: dict[Tnode, Tnode]) -> list[ll.LLStmt]:
    """The nests widening each node into its copy, in the node's own layout."""
    out = []
    for tn, copy in wide.items():
        loops = [(get_symbol(f"w{d}"), n) for d, n in enumerate(tn.dims)]
        at = tuple(Iterator(s) for s, _ in loops)
        out.append(nests.nest(loops, ll.Set(copy, at, ll.Get(tn, at), f"widen {tn.name} to float once")))
    return out


def share_fills(code: ll.LLStmt) -> ll.LLStmt:
    """`code` widening each bf16 node once for all the contractions that read it, not once
    per contraction: a later fill of the same node, with the node not written since the first
    fill, is dropped and its copy's readers read the first copy. (The q, k and v projections
    of a transformer block each widened the LayerNorm's output, 3 x 6 bytes per element, in
    nests of their own that loop fusion does not merge with the producer.)"""
    stmts = list(ll.flatten(code))
    first: dict[Tnode, tuple[int, Tnode]] = {}
    renamed: dict[Tnode, Tnode] = {}
    dropped = set()
    writes = [{s.tn for s in ll.iter_stmts(st) if isinstance(s, (ll.Set, ll.SetFromVec, ll.ZeroOut))}
              for st in stmts]
    for p, st in enumerate(stmts):
        fill = nests.identity_copy(st)
        if fill is None or fill[0].prec is ops.bf16 or fill[1].prec is not ops.bf16:
            for tn in writes[p]:
                first.pop(tn, None)
            continue
        copy, src = fill
        if sum(copy in w for w in writes) != 1:
            continue
        if src in first and sum(first[src][1] in w for w in writes) == 1:
            renamed[copy] = first[src][1]
            dropped.add(p)
        else:
            first[src] = (p, copy)
    if not renamed:
        return code
    return ll.seq(*[nests.read_from(s, renamed) for p, s in enumerate(stmts) if p not in dropped])

