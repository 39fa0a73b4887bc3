"""Nodes that cost no more memory traffic to recompute at every read than to read: a pointwise
`+ - *` of one full-size operand and of broadcast ones (`x - mean[row]`, `centered * rsqrt[row]`).

Storing such a node writes a stream of its size, and every read reads it back; recomputing it
reads the full-size operand instead (one stream as well) plus values that stay in registers or
L1 (a row's mean, a column's gamma), for one or two flops per read. LayerNorm's `x - mean` and
`(x - mean) * rsqrt` are read by the variance, the output and the backward's row sums, six
and two times: kept in memory they were two of the forward's four 512 KiB store streams at the
GPT's size, with a read stream each in the backward, where the backward reads `x` and `mean`
anyway. Virtualization (`virtualize.decide_from_trace`) inlines these nodes however often they
are read, within `MAX_READS`.

Three conditions keep the recomputation as cheap as the read:
- the node is computed by one pointwise statement (no loop outside its indices) of `+`, `-`,
  `*`, negation and FMA over constants and reads, at most one of them (one position of one
  node) indexed by all of the statement's loops, the others by fewer;
- every read of it is by every loop around the read (no loop re-reads a cell: a contraction
  operand read once per output column would recompute the node in its innermost loop);
- the full-size operand is stored, or is itself such a node: a node read only here would be
  inlined too, and an inlined `a + b` reads two streams per read.

A product added to something (`y = x * scale[j] + r`) is kept: inlined, the simplifier would
contract the two into an FMA, rounded once where the stored product was rounded twice. Every
other recomputation rounds as the stored node did, so results keep their bits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import AxisIndex, FixedIdx, Iterator, Symbol, index_symbols
from einjit.ir.tnode import Tnode

MAX_READS = 8
"""How many reads (expression occurrences in the routine) a node recomputed at each may have:
each costs a flop or two and makes the reader's expression longer."""

_ARITHMETIC = {ops.Binop.ADD, ops.Binop.SUB, ops.Binop.MUL}


def recomputable(llc: ll.LLStmt) -> frozenset[Tnode]:
    """The nodes of `llc` that are as cheap to recompute at every read as to read (see the
    module docstring)."""
    walk = _Walk()
    walk.stmt(llc, ())
    memo: dict[Tnode, bool] = {}
    return frozenset(tn for tn in walk.sets if walk.cheap(tn, memo))


@dataclass(slots=True)
class _Walk:
    """What the code does with each node: its writes with their loops, how many reads, whether
    some loop re-reads a cell, and whether some read is an addend."""

    sets: dict[Tnode, list[tuple[tuple[ll.ForLoop, ...], ll.LLStmt]]] = field(default_factory=dict)
    reads: dict[Tnode, int] = field(default_factory=dict)
    reread: set[Tnode] = field(default_factory=set)
    added: set[Tnode] = field(default_factory=set)

    def stmt(self, stmt: ll.LLStmt, loops: tuple[ll.ForLoop, ...]) -> None:
        for s in ll.flatten(stmt):
            match s:
                case ll.ForLoop(body=body):
                    self.stmt(body, (*loops, s))
                case ll.Set(tn, _, llsc, _) | ll.SetFromVec(tn=tn, arg=llsc):
                    self.sets.setdefault(tn, []).append((loops, s))
                    self.scalar(llsc, loops, tn)
                case ll.ZeroOut(tn):
                    self.sets.setdefault(tn, []).append((loops, s))
                case ll.SetLocal(_, value):
                    self.scalar(value, loops, None)

    def scalar(self, sc: ll.LLScalar, loops: tuple[ll.ForLoop, ...], own: Tnode | None) -> None:
        """Count the reads of `sc`, but an accumulation's read of its own target."""
        stack: list[tuple[ll.LLScalar, bool]] = [(sc, False)]
        while stack:
            x, added = stack.pop()
            match x:
                case ll.Get(tn, idcs) | ll.GetMergeBuffer(tn, idcs) if tn is not own:
                    self.reads[tn] = self.reads.get(tn, 0) + 1
                    if added:
                        self.added.add(tn)
                    read_by = {s for idx in idcs for s in index_symbols(idx)}
                    if any(lp.to_ > lp.from_ and lp.index not in read_by for lp in loops):
                        self.reread.add(tn)
                case ll.LocalScope(body=body):
                    self.stmt(body, loops)
                case ll.Binop(ops.Binop.MUL, a, ll.Constant(1.0)) | ll.Binop(ops.Binop.MUL, ll.Constant(1.0), a):
                    stack.append((a, added))  # simplified away: the read is where the product is
                case ll.Unop(ops.Unop.IDENTITY, a):
                    stack.append((a, added))
                case _:
                    add = isinstance(x, ll.Binop) and x.op is ops.Binop.ADD
                    stack.extend((c, add) for c in ll.scalar_children(x))

    def cheap(self, tn: Tnode, memo: dict[Tnode, bool]) -> bool:
        if tn not in memo:
            memo[tn] = False  # a node reading itself is no candidate
            memo[tn] = self._cheap(tn, memo)
        return memo[tn]

    def _cheap(self, tn: Tnode, memo: dict[Tnode, bool]) -> bool:
        writes = self.sets.get(tn, [])
        if len(writes) != 1 or not 0 < self.reads.get(tn, 0) <= MAX_READS or tn in self.reread:
            return False
        loops, st = writes[0]
        if not isinstance(st, ll.Set) or isinstance(st.llsc, (ll.Get, ll.Constant)):
            return False  # a copy or a fill is a simple computation (`inline_simple_computations`)
        own = _pointwise_symbols(loops, st.idcs)
        operands = _operands(st.llsc) if own is not None else None
        if own is None or operands is None or (_product(st.llsc) and tn in self.added):
            return False
        full = {(t, idcs) for t, idcs in operands if {s for idx in idcs for s in index_symbols(idx)} == own}
        if any(t is tn or not {s for idx in idcs for s in index_symbols(idx)} <= own for t, idcs in operands):
            return False
        return len(full) <= 1 and all(self.stored_or_cheap(t, memo) for t, _ in full)

    def stored_or_cheap(self, t: Tnode, memo: dict[Tnode, bool]) -> bool:
        """Whether a recomputation reading `t` at every cell reads `t` itself, or what is as
        cheap: `t` is not computed here, or is read more than once (so it is not inlined as a
        single use), or is recomputable itself. (A broadcast operand is read many times per
        cell, so it is stored, or inlined only when it is a single read.)"""
        return t not in self.sets or self.reads.get(t, 0) > 1 or self.cheap(t, memo)


def _product(sc: ll.LLScalar) -> bool:
    """A product, or a negated one: what the simplifier contracts with an addition."""
    match sc:
        case ll.Unop(ops.Unop.NEG, a):
            return _product(a)
        case ll.Binop(ops.Binop.MUL):
            return True
    return False


def _pointwise_symbols(loops: tuple[ll.ForLoop, ...], idcs: tuple[AxisIndex, ...]) -> set[Symbol] | None:
    """The loop symbols of a write at distinct iterators and constants that every loop around
    it indexes (no reduction), or None."""
    syms = [idx.symbol for idx in idcs if isinstance(idx, Iterator)]
    if len(syms) != len(set(syms)) or not all(isinstance(idx, (Iterator, FixedIdx)) for idx in idcs):
        return None
    if any(lp.to_ > lp.from_ and lp.index not in syms for lp in loops):
        return None
    return set(syms)


def _operands(sc: ll.LLScalar) -> list[tuple[Tnode, tuple[AxisIndex, ...]]] | None:
    """The reads of an expression of `+ - *`, negation and FMA over constants and plain reads
    (at iterators and constants), or None for any other expression."""
    out = []
    for x in ll.iter_scalars(sc):
        match x:
            case ll.Get(tn, idcs) if all(isinstance(idx, (Iterator, FixedIdx)) for idx in idcs):
                out.append((tn, idcs))
            case ll.Binop(op) if op in _ARITHMETIC:
                pass
            case ll.Unop(ops.Unop.NEG) | ll.Ternop(ops.Ternop.FMA) | ll.Constant():
                pass
            case _:
                return None
    return out
