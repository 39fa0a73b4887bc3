"""Rounded copies folded into their readers: a bf16 copy of a float node that no other
routine reads (routine-local, or a mixed-precision step's copy of a parameter or operand) and that
is only ever copied again (packed into a kernel's panel, widened into a float copy) is not
stored.

A mixed-precision step rounds each float32 parameter into a bf16 copy at its start, a pass
reading 4 and writing 2 bytes per weight; on a CPU without a bf16 dot product every
contraction then widens the copy again, while packing its panel or into a float copy of the
whole node (`bf16_widen`). Where every read of the copy is such a copy, the readers round the
float node themselves, in registers (`einjit_bf16_store` then `_load`: a few integer vector
operations, in a loop gcc vectorizes), and the rounding pass and the bf16 node disappear: the
MLP step's pass over its 784 x 256 weights cost 1.5-2% of the step. The values are the
copy's (rounding depends on the float value alone, and the float node is not written
between the rounding nest and the last read), so results are bit-identical. A copy that a
pair panel for `vdpbf16ps` packs is kept (`_paired`).

Folding trades the copy's 6 bytes per element for 2 more bytes per read (4 of the float
node instead of 2 of the copy): a copy read more than `MAX_READS_PER_ELEMENT` times per
element in all (a panel packed again for every block of rows) is kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from einjit.ir import low_level as ll
from einjit.ir import ops, provenance
from einjit.ir.sched import bf16_widen, nests
from einjit.ir.tnode import VIRTUAL, Tnode

__all__ = ["MAX_READS_PER_ELEMENT", "bf16_stage", "fold_rounded_copies"]

MAX_READS_PER_ELEMENT = 3
"""Reads per element of a bf16 copy above which storing it once is cheaper than rounding at
every read (4 bytes read per element instead of 2, against the copy's 4 read and 2 written)."""


def _rounding(stmt: ll.LLStmt) -> tuple[Tnode, Tnode] | None:
    """`(copy, source)` when `stmt` is a nest rounding all of a float node into a private bf16
    node of its dims, cell by cell in the same layout."""
    match nests.identity_copy(stmt):
        case (x, y) if x.prec is ops.bf16 and y.prec is ops.single and _private(x):
            return x, y
    return None


def _private(tn: Tnode) -> bool:
    """Whether no other routine reads `tn`: a local node, or a mixed-precision step's copy
    of a parameter or of a contraction's operand (`training/mixed_precision.py` makes them per
    step)."""
    return tn.is_local() or tn.provenance in (provenance.MIXED_PRECISION_COPY, provenance.MIXED_PRECISION_OPERAND)


def _written(stmt: ll.LLStmt) -> Iterator[Tnode]:
    for s in ll.iter_stmts(stmt):
        match s:
            case ll.Set(tn=tn) | ll.SetFromVec(tn=tn) | ll.ZeroOut(tn):
                yield tn


def _copy_reads(stmt: ll.LLStmt, trips: int, out: dict[Tnode, int]) -> None:
    """Adds to `out`, per node, how many times `stmt` copies a cell of it (`Set(t, .., Get
    (node, ..))`), loops' trip counts multiplied."""
    for s in ll.flatten(stmt):
        match s:
            case ll.ForLoop(from_=lo, to_=hi, body=body):
                _copy_reads(body, trips * (hi - lo + 1), out)
            case ll.Set(llsc=ll.Get(tn, _)):
                out[tn] = out.get(tn, 0) + trips


def _all_reads(stmt: ll.LLStmt) -> Iterator[Tnode]:
    for x in ll.deep_parts(stmt):
        match x:
            case ll.Get(tn, _) | ll.GetMergeBuffer(tn, _):
                yield tn


def _folded(stmt: ll.LLStmt, sources: dict[Tnode, Tnode], inlined: dict[Tnode, Tnode]) -> ll.LLStmt:
    """`stmt` with each copy of a cell of a node in `sources` rounding its source instead: in
    the local of a virtual bf16 node (`inlined`, one per copy), which holds a float rounded
    to bf16, as a virtual bf16 node's inlined computation does."""
    match stmt:
        case ll.Seq(a, b):
            return ll.Seq(_folded(a, sources, inlined), _folded(b, sources, inlined))
        case ll.ForLoop(body=body):
            return dataclasses.replace(stmt, body=_folded(body, sources, inlined))
        case ll.Set(tn, idcs, ll.Get(x, src), debug) if x in sources:
            sid = ll.fresh_scope_id(inlined[x])
            rounded = ll.LocalScope(sid, ll.SetLocal(sid, ll.Get(sources[x], src)), src)
            return ll.Set(tn, idcs, rounded, debug)
    return stmt


def bf16_stage(code: ll.LLStmt) -> ll.LLStmt:
    """The optimizer's `bf16` stage, after scheduling: each bf16 node widened once for all
    its contractions (`bf16_widen.share_fills`), then the weight copies folded."""
    return fold_rounded_copies(bf16_widen.share_fills(code))


def fold_rounded_copies(code: ll.LLStmt) -> ll.LLStmt:
    """`code` without the rounding nests of the bf16 copies whose reads all copy them (see the
    module docstring), those reads rounding the copies' sources."""
    stmts = list(ll.flatten(code))
    found = {p: r for p, s in enumerate(stmts) if (r := _rounding(s)) is not None}
    if not found:
        return code
    writes = [set(_written(s)) for s in stmts]
    reads = [list(_all_reads(s)) for s in stmts]
    copies: list[dict[Tnode, int]] = []
    for s in stmts:
        counts: dict[Tnode, int] = {}
        _copy_reads(s, 1, counts)
        copies.append(counts)
    sources: dict[Tnode, Tnode] = {}
    dropped = set()
    for p, (x, y) in found.items():
        readers = [q for q, r in enumerate(reads) if x in r]
        if not readers or readers[0] <= p or any(x in w for q, w in enumerate(writes) if q != p):
            continue
        if any(y in writes[q] for q in range(p + 1, readers[-1] + 1)):
            continue
        if any(reads[q].count(x) != _occurrences(stmts[q], x) for q in readers):
            continue
        if sum(copies[q].get(x, 0) for q in readers) > MAX_READS_PER_ELEMENT * x.size:
            continue
        if any(_paired(stmts[q], x) for q in readers):
            continue
        sources[x] = y
        dropped.add(p)
    if not sources:
        return code
    inlined = {x: Tnode(x.label, x.dims, ops.bf16, memory_mode=VIRTUAL, provenance=provenance.INLINED)
               for x in sources}
    return ll.seq(*[_folded(s, sources, inlined) for p, s in enumerate(stmts) if p not in dropped])


def _paired(stmt: ll.LLStmt, x: Tnode) -> bool:
    """Whether `stmt` copies cells of `x` into a bf16 node (a pair panel for `vdpbf16ps`). Such
    a copy is kept: rounding in the packing nest cost more than the vectorized rounding pass
    and 16-bit copies (the MLP step ran 8% slower folded on a Zen 4 core)."""
    return any(isinstance(s, ll.Set) and s.tn.prec is ops.bf16 and isinstance(s.llsc, ll.Get) and s.llsc.tn is x
               for s in ll.iter_stmts(stmt))


def _occurrences(stmt: ll.LLStmt, x: Tnode) -> int:
    """How many statements of `stmt` copy a cell of `x` (each read of `x` must be one)."""
    return sum(1 for s in ll.iter_stmts(stmt) if isinstance(s, ll.Set) and isinstance(s.llsc, ll.Get)
               and s.llsc.tn is x)
