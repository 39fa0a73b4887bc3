"""Causal skipping: accumulation loops clipped to the triangle a causal mask keeps.

A causal attention's weights are exactly zero above the diagonal: `masked_softmax` writes
`where(s < t + offset + 1, ..., 0)`, the weights divide those zeros by a row total of at
least 1, and the scores' gradient is the same `where` of zero. Every contraction reading
them (`P v`, `dS k`, `Pᵀ dY`, `dSᵀ q`) adds `0 * x` for half of its terms. This stage finds
those zeros in the code itself and clips the loops that would only add them:

    for ib:  for k in 0..63:              acc[ir, :] += P[6*ib + ir, k] * panel[k, :]
    for ib:  for k in 0..63 while k < 6*ib + 6:  ...

A node is *zero above a diagonal* — zero wherever its index at one axis (the key) is at
least its index at another (the query) plus `c` — when every value written into it is:
`where(key < query + c', a, b)` with `c' <= c` and `b` zero there, a product with a factor
zero there, a quotient whose dividend is zero there and whose divisor is a node written as
`max(x, positive constant)`, a sum of such terms, or (for a node zeroed before its
accumulation) its own cell. A loop whose body only accumulates products `y += a * b` with
`a` read from such a node gets a `start` or `stop` (`ll.LoopClip`) computed from the outer
indices, so that its skipped iterations are exactly those whose every term reads a zero
of `a`: the sums keep their other terms in their order, so the results are those of the
full loop as long as `b` is finite (the zeros skipped would have added `0 * b`).

The scores `q kᵀ` and their gradient's `dY vᵀ` are not zero above the diagonal, but nobody
reads those cells: the masked softmax reads the scores under `where(s < t + 1, ...)`, the
softmax's backward reads `dY vᵀ` under the same `where` or times the zero weights. A node
of this routine's own storage (routine-local, or one that can become so: never hosted, kept
by no other routine; `VirtualizeSettings.local_storage`), zeroed before its accumulation and
read only that way (*unread above a diagonal*), has its register blocks' row loop clipped to
the blocks with a cell on or below the diagonal: the skipped cells keep their zeros, which
the reads ignore or multiply by zero. A clipped loop's other writes must be scheduler locals
written before they are read, in the loop and after it (register blocks, panels). When every
such read is a `where` (the scores, read only by the masked softmax) and the contraction
stores every cell it keeps from zero, the zeros are never used and the fill goes too
(`_dead_fills`: a 1 MiB `memset` per block at the benchmark's size).

The softmax around them has two more kinds of such loops. A factor computed in place,
`where(key < query + c, x, 0)`, is zero there whatever `x` is (the scores' gradient
accumulates one), and so is a term of a local scope's sum `v := v - dP * P / total` (the
softmax's backward row sum; the sum starts at 0, is never -0, and subtracting a zero keeps
it). And a node of this routine's own storage written once, every read of which is a `where`
that picks its other branch above the diagonal (`exp(where(mask, s - max, 0))`, read only as
`where(mask, exp, 0)`), needs no cells written there (*masked above a diagonal*): the loop
writing it is clipped, and the cells keep whatever they held, which the reads never use
(a stale infinity or NaN included, which is why a product read does not count here).

The softmax's row maximum reads its masked scores, `where(key < query + c, s, -1e30)`, whole:
every cell past the diagonal holds the same constant (*constant above a diagonal*). A loop
taking maxima (or minima) of such a node into cells its own index does not pick is clipped to
the iterations reaching the diagonal and one more, whose cells all hold the constant: each
maximum still reads the constant, as often or not does not change a maximum, so the results
are the full loop's bits, and the 8 partial maxima of the extrema stage read about two thirds
of the 64 keys of the benchmark's rows (`for k0 = 0 to 7 (stop 8*k0 < q + 9)`).

A clipped innermost loop over whole vectors becomes a loop over chunks of 8 iterations,
clipped to the chunks reaching the diagonal, around a whole loop over the chunk (`CHUNK`):
gcc vectorizes the chunk, and the few iterations past the diagonal it adds back are
iterations of the full loop, which computed the same.

The loop bound depends on another index, which the IR says with `LoopClip` rather than a
special attention kernel: the register-blocked contraction the scheduler built is kept as
it is, only its reduction loop is shortened per row block. Loops marked for unrolling or
threads are never clipped (register block rows and lanes stay whole, thread chunks even).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import (
    Affine,
    AxisIndex,
    FixedIdx,
    Iterator,
    Symbol,
    get_symbol,
    index_symbols,
    make_affine,
    subst_index,
)
from einjit.ir.passes.local_storage import is_routine_local, kept_in_context
from einjit.ir.sched import nests
from einjit.ir.sched.first_writes import overwrites
from einjit.ir.tnode import LOCAL, Tnode

__all__ = ["CHUNK", "chunked", "clip_causal_loops", "may_be_local"]

#: Zero wherever `key >= query + c`, by `(key, query) -> c` (symbols or axis positions);
#: None: zero everywhere.
Zeros = dict | None


def clip_causal_loops(llc: ll.LLStmt, *, local_storage: bool = True) -> ll.LLStmt:
    """`llc` with the accumulation loops that read nodes zero above a diagonal clipped to
    the iterations whose terms can be non-zero, and, with `local_storage` (the optimizer's
    setting), the loops writing cells of a routine's own scratch that nothing reads (see the
    module docstring)."""
    if not any(isinstance(x, ll.Binop) and _false_above(x) for x in ll.deep_parts(llc)):
        return llc  # no causal comparison: nothing is zero above a diagonal
    zeros = _Analysis(llc, local_storage)
    tops = zeros.tops
    dead = _dead_fills(zeros)
    return ll.seq(*(_clip(top, zeros, {}, tuple(tops[k + 1:]))
                    if any(zeros.zeros(tn) or zeros.unseen(tn) or zeros.masked(tn) or zeros.constant(tn)
                           for tn in nodes)
                    else top
                    for k, (top, nodes) in enumerate(zip(tops, zeros.nodes, strict=True)) if k not in dead))


def _dead_fills(zeros: _Analysis) -> set[int]:
    """The positions of the zero fills nothing uses once the loops are clipped: the fill of a
    node unread above a diagonal whose every read there is a `where` picking its other branch
    (the scores `q kᵀ`, read only by the masked softmax), when the statements writing it, as
    they come unclipped, store each cell once without reading it (a contraction whose register
    blocks start at zero). Clipped, they skip only blocks of cells the reads ignore, whatever
    those cells hold; so no cell's zero is ever used. `first_writes` keeps such a fill, since
    the clipped nest does not store every cell. A later statement writing the node again
    would escape `unseen`'s reads (it skips the node's own nests): then the fill stays."""
    dead: set[int] = set()
    for k, top in enumerate(zeros.tops):
        if not isinstance(top, ll.ZeroOut):
            continue
        tn = top.tn
        unseen, ignored = zeros.unseen(tn), zeros.unseen(tn, products=False)
        if not unseen or not all(at in ignored and ignored[at] <= c for at, c in unseen.items()):
            continue
        touching = zeros.touching[tn]
        writers = [t for t in touching[1:] if any(isinstance(s, ll.Set) and s.tn is tn for s in ll.iter_stmts(t))]
        first = touching[1:len(writers) + 1]
        if (touching[0] is top and all(a is b for a, b in zip(first, writers, strict=True))
                and overwrites(writers, tn) and not (len(writers) > 1 and overwrites(writers[:-1], tn))):
            dead.add(k)  # the writers come first, and the last one completes the node
    return dead


# ---------------------------------------------------------------- zero facts


def _intersect(a: Zeros, b: Zeros) -> Zeros:
    if a is None:
        return b
    if b is None:
        return a
    return {k: max(a[k], b[k]) for k in a.keys() & b.keys()}


def _union(a: Zeros, b: Zeros) -> Zeros:
    if a is None or b is None:
        return None
    return {k: min(c for c in (a.get(k), b.get(k)) if c is not None) for k in a.keys() | b.keys()}


def _linear(idx: AxisIndex) -> dict[Symbol | None, int] | None:
    """An affine index as `{symbol: coefficient, None: offset}`."""
    match idx:
        case FixedIdx(i):
            return {None: i}
        case Iterator(s):
            return {s: 1, None: 0}
        case Affine(terms, offset):
            out: dict[Symbol | None, int] = {None: offset}
            for c, s in terms:
                out[s] = out.get(s, 0) + c
            return out
    return None


def _false_above(cond: ll.LLScalar) -> Zeros:
    """Where a condition `key < query + c` is false, as a zero fact."""
    match cond:
        case ll.Binop(ops.Binop.CMPLT, ll.EmbedIndex(k), ll.EmbedIndex(q)):
            key, query = _linear(k), _linear(q)
            if key is None or query is None or key[None] != 0 or len(key) != 2 or len(query) != 2:
                return {}
            (ks, kc), = ((s, c) for s, c in key.items() if s is not None)
            (qs, qc), = ((s, c) for s, c in query.items() if s is not None)
            return {(ks, qs): query[None]} if kc == 1 and qc == 1 else {}
    return {}


class _Analysis:
    """Which nodes are zero above a diagonal, by axis positions (`zeros`), from all their
    writes in the routine."""

    def __init__(self, llc: ll.LLStmt, local_storage: bool):
        self.local_storage = local_storage
        self.sets: dict[Tnode, list[tuple[ll.Set, dict[Symbol, ll.ForLoop]]]] = {}
        self.zeroed: set[Tnode] = set()
        self.other: set[Tnode] = set()
        self.tops = list(ll.flatten(llc))
        self.nodes = [ll.nodes_of(top) for top in self.tops]
        self.touching: dict[Tnode, list[ll.LLStmt]] = {}
        for top, nodes in zip(self.tops, self.nodes, strict=True):
            for tn in nodes:
                self.touching.setdefault(tn, []).append(top)
        self._collect(llc, {})
        collected = {id(st) for writes in self.sets.values() for st, _ in writes}
        # a node also written inside a local scope's loops is not analyzed
        self.other |= {s.tn for s in ll.iter_stmts(llc) if isinstance(s, ll.Set) and id(s) not in collected}
        self.memo: dict[Tnode, Zeros] = {}
        self.pending: set[Tnode] = set()
        self.unseen_memo: dict[tuple[Tnode, bool], dict[tuple[int, int], int]] = {}
        self.masked_memo: dict[Tnode, dict[tuple[int, int], int]] = {}
        self.constant_memo: dict[Tnode, dict[tuple[int, int], int]] = {}

    def _collect(self, stmt: ll.LLStmt, loops: dict[Symbol, ll.ForLoop]) -> None:
        for s in ll.flatten(stmt):
            match s:
                case ll.ForLoop(index=index, body=body):
                    self._collect(body, {**loops, index: s})
                case ll.ZeroOut(tn):
                    if tn not in self.sets:
                        self.zeroed.add(tn)
                case ll.Set(tn=tn):
                    self.sets.setdefault(tn, []).append((s, loops))
                case ll.SetFromVec(tn=tn):
                    self.other.add(tn)

    def zeros(self, tn: Tnode) -> dict[tuple[int, int], int]:
        """`(key axis, query axis) -> c` for `tn` zero wherever `key >= query + c`."""
        if tn not in self.memo:
            self.pending.add(tn)
            self.memo[tn] = self._node_zeros(tn)
            self.pending.discard(tn)
        return self.memo[tn] or {}

    def _node_zeros(self, tn: Tnode) -> Zeros:
        writes = self.sets.get(tn, [])
        if not writes or tn in self.other:
            return {}
        if tn not in self.zeroed and (len(writes) != 1 or not _covers(*writes[0])):
            return {}
        found: Zeros = None
        for st, _ in writes:
            facts = self.value(st.llsc, st)
            if facts is None:
                continue
            where = {_position(st.idcs, ks, qs): c for (ks, qs), c in facts.items()}
            where.pop(None, None)
            found = _intersect(found, where)
        return found if found is not None else {}

    def unseen(self, tn: Tnode, products: bool = True) -> dict[tuple[int, int], int]:
        """`(key axis, query axis) -> c` for a routine-local `tn`, zeroed before it is
        accumulated, whose cells with `key >= query + c` no statement outside its own nests
        reads in a way that matters: under a `where` that picks its other branch there, or
        (with `products`) times a factor zero there (its zeros, finite, give that product's
        zero; without them, any cell value there goes unused)."""
        if (tn, products) not in self.unseen_memo:
            self.unseen_memo[tn, products] = self._node_unseen(tn, products)
        return self.unseen_memo[tn, products]

    def _node_unseen(self, tn: Tnode, products: bool) -> dict[tuple[int, int], int]:
        if not (self.local_storage and may_be_local(tn)) or tn not in self.zeroed or tn in self.other:
            return {}
        found: dict[tuple[int, int], int] | None = None
        for top in self.touching.get(tn, []):
            if any(isinstance(s, (ll.Set, ll.ZeroOut)) and s.tn is tn for s in ll.iter_stmts(top)):
                continue
            for s in ll.iter_stmts(top):
                match s:
                    case ll.Set(llsc=sc) | ll.SetLocal(value=sc):
                        target = s if isinstance(s, ll.Set) else None
                        here = self._masked_reads(sc, tn, {}, target, products)
                    case ll.SetFromVec(arg=sc):
                        here = self._masked_reads(sc, tn, {}, None, products)
                    case _:
                        continue
                if here is not None:
                    found = here if found is None else {k: max(found[k], here[k]) for k in found.keys() & here.keys()}
        return found or {}

    def masked(self, tn: Tnode) -> dict[tuple[int, int], int]:
        """`(key axis, query axis) -> c` for a node of this routine's own storage, written
        once (`:=`), every read of which is a `where` picking its other branch wherever
        `key >= query + c` (the softmax's `exp(where(mask, s - max, 0))`, read only as
        `where(mask, exp, 0)`): those cells may keep whatever they held, as nothing uses them."""
        if tn not in self.masked_memo:
            self.masked_memo[tn] = self._node_masked(tn)
        return self.masked_memo[tn]

    def _node_masked(self, tn: Tnode) -> dict[tuple[int, int], int]:
        writes = self.sets.get(tn, [])
        if (not (self.local_storage and may_be_local(tn)) or tn in self.zeroed or tn in self.other
                or len(writes) != 1 or nests.reads(writes[0][0].llsc, tn)):
            return {}
        found: dict[tuple[int, int], int] | None = None
        for top in self.touching.get(tn, []):
            for s in ll.iter_stmts(top):
                match s:
                    case ll.Set(llsc=sc) | ll.SetLocal(value=sc) | ll.SetFromVec(arg=sc):
                        here = self._masked_reads(sc, tn, {}, None, products=False)
                    case _:
                        continue
                if here is not None:
                    found = here if found is None else {k: max(found[k], here[k]) for k in found.keys() & here.keys()}
        return found or {}

    def constant(self, tn: Tnode) -> dict[tuple[int, int], int]:
        """`(key axis, query axis) -> c` for a node written once, whole, as `where(key < query +
        c, x, v)` with `v` a constant: every cell with `key >= query + c` holds `v` (the
        softmax's masked scores, `v` = -1e30, which its row maximum reads)."""
        if tn not in self.constant_memo:
            self.constant_memo[tn] = self._node_constant(tn)
        return self.constant_memo[tn]

    def _node_constant(self, tn: Tnode) -> dict[tuple[int, int], int]:
        writes = self.sets.get(tn, [])
        if tn in self.zeroed or tn in self.other or len(writes) != 1 or not _covers(*writes[0]):
            return {}
        st = writes[0][0]
        match st.llsc:
            case ll.Ternop(ops.Ternop.WHERE, cond, _, ll.Constant()):
                spots = ((_position(st.idcs, ks, qs), c) for (ks, qs), c in (_false_above(cond) or {}).items())
                return {at: c for at, c in spots if at is not None}
        return {}

    def _masked_reads(self, sc: ll.LLScalar, tn: Tnode, unused: Zeros, target: ll.Set | None,
                      products: bool = True) -> dict[tuple[int, int], int] | None:
        """The regions (by `tn`'s axes) where every read of `tn` in `sc` goes unused, `unused`
        being where `sc`'s own value is not used (by loop symbols); None when `sc` reads no
        `tn`, {} when some read is used everywhere. Without `products`, a read times a zero
        counts as used (a stale cell may hold an infinity or a NaN)."""
        match sc:
            case ll.Get(t, idcs) | ll.GetMergeBuffer(t, idcs) if t is tn:
                if unused is None:
                    return None
                spots = {idx.symbol: p for p, idx in enumerate(idcs) if isinstance(idx, Iterator)}
                return {(spots[k], spots[q]): c for (k, q), c in unused.items() if k in spots and q in spots}
            case ll.Ternop(ops.Ternop.WHERE, cond, a, b):
                parts = [(cond, unused), (a, _union(unused, _false_above(cond))), (b, unused)]
            case ll.Ternop(ops.Ternop.FMA, a, b, c) if products:
                parts = [(a, _union(unused, self.value(b, target))), (b, _union(unused, self.value(a, target))),
                         (c, unused)]
            case ll.Binop(ops.Binop.MUL, a, b) if products:
                parts = [(a, _union(unused, self.value(b, target))), (b, _union(unused, self.value(a, target)))]
            case ll.Binop(ops.Binop.DIV, a, b):
                parts = [(a, unused), (b, {})]
            case ll.LocalScope(body=body):
                parts = [(x.value, unused) for x in ll.iter_stmts(body) if isinstance(x, ll.SetLocal)]
                if any(isinstance(x, (ll.Set, ll.SetFromVec)) for x in ll.iter_stmts(body)):
                    return {} if any(tn in ll.nodes_of(x) for x in ll.iter_stmts(body)) else None
            case _:
                parts = [(x, unused) for x in ll.scalar_children(sc)]
        found: dict[tuple[int, int], int] | None = None
        for x, where in parts:
            here = self._masked_reads(x, tn, where, target, products)
            if here is not None:
                found = here if found is None else {k: max(found[k], here[k]) for k in found.keys() & here.keys()}
        return found

    def value(self, sc: ll.LLScalar, st: ll.Set | None) -> Zeros:
        """Where the value `sc`, stored by `st`, is zero (by loop symbols)."""
        match sc:
            case ll.Constant(v):
                return None if v == 0.0 else {}
            case ll.Get(tn, idcs) if st is not None and tn is st.tn:
                return None if idcs == st.idcs and tn in self.zeroed else {}
            case ll.Get(tn, idcs):
                if tn in self.pending:
                    return {}
                out: dict = {}
                for (kp, qp), c in self.zeros(tn).items():
                    k, q = idcs[kp], idcs[qp]
                    if isinstance(k, Iterator) and isinstance(q, Iterator):
                        key = (k.symbol, q.symbol)
                        out[key] = min(c, out.get(key, c))
                return out
            case ll.Ternop(ops.Ternop.WHERE, cond, a, b):
                zb = self.value(b, st)
                return _union(_intersect(_false_above(cond), zb), _intersect(self.value(a, st), zb))
            case ll.Ternop(ops.Ternop.FMA, a, b, c):
                return _intersect(_union(self.value(a, st), self.value(b, st)), self.value(c, st))
            case ll.Binop(ops.Binop.MUL, a, b):
                return _union(self.value(a, st), self.value(b, st))
            case ll.Binop(ops.Binop.ADD | ops.Binop.SUB, a, b):
                return _intersect(self.value(a, st), self.value(b, st))
            case ll.Binop(ops.Binop.DIV, a, b):
                return self.value(a, st) if self._positive(b) else {}
            case ll.Unop(ops.Unop.NEG | ops.Unop.IDENTITY, a):
                return self.value(a, st)
        return {}

    def _positive(self, sc: ll.LLScalar) -> bool:
        """Whether `sc` reads a node every write of which is `max(x, c)` with `c > 0`."""
        if not isinstance(sc, ll.Get) or sc.tn in self.zeroed or sc.tn in self.other:
            return False
        writes = self.sets.get(sc.tn, [])
        return bool(writes) and all(
            isinstance(v := st.llsc, ll.Binop) and v.op is ops.Binop.MAX
            and any(isinstance(x, ll.Constant) and x.value > 0 for x in (v.arg1, v.arg2))
            for st, _ in writes)


def may_be_local(tn: Tnode) -> bool:
    """Whether `tn` is, or can become, storage of this routine alone (`local_storage`): no
    other routine and no host reads its cells, only the statements of this one."""
    if tn.is_local():
        return True
    mode = tn.memory_mode
    return mode is not None and bool(mode.leaves & LOCAL.leaves) and not tn.is_hosted() and not kept_in_context(tn)


def _position(idcs: tuple[AxisIndex, ...], key: Symbol, query: Symbol) -> tuple[int, int] | None:
    spots = {idx.symbol: p for p, idx in enumerate(idcs) if isinstance(idx, Iterator)}
    return (spots[key], spots[query]) if key in spots and query in spots else None


def _covers(st: ll.Set, loops: dict[Symbol, ll.ForLoop]) -> bool:
    """Whether `st` writes every cell of its node: one loop per axis over the whole axis (an
    axis of one cell may be indexed by 0, as a batch of one sequence is)."""
    spanned: list[tuple[Symbol, int]] = []
    for idx, d in zip(st.idcs, st.tn.dims, strict=True):
        match idx:
            case Iterator(s):
                spanned.append((s, d))
            case FixedIdx(0) if d == 1:
                pass
            case _:
                return False
    syms = [s for s, _ in spanned]
    if len(set(syms)) != len(syms):
        return False
    return all(s in loops and loops[s].from_ == 0 and loops[s].to_ == d - 1 and loops[s].start is None
               and loops[s].stop is None for s, d in spanned)


# ---------------------------------------------------------------- clipping


def _clip(stmt: ll.LLStmt, zeros: _Analysis, outer: dict[Symbol, tuple[int, int]],
          after: tuple[ll.LLStmt, ...]) -> ll.LLStmt:
    """`stmt` with its loops clipped; `after`: what may run next (the statements after it,
    and the next iterations of the loops around it)."""
    match stmt:
        case ll.Seq():
            items = list(ll.flatten(stmt))
            return ll.seq(*(_clip(x, zeros, outer, (*items[k + 1:], *after)) for k, x in enumerate(items)))
        case ll.ForLoop(index=index, body=body):
            loop = stmt
            if not (loop.unroll or loop.parallel or loop.start or loop.stop):
                clipped = _clipped(loop, zeros, outer, (body, *after))
                loop = clipped if clipped is not None and not _over_lanes(loop) else loop
            inner = _clip(body, zeros, {**outer, index: (loop.from_, loop.to_)}, (body, *after))
            whole = loop is stmt
            loop = loop if inner is body else dataclasses.replace(loop, body=inner)
            return loop if whole else chunked(loop)
        case ll.Set(llsc=sc) if any(isinstance(x, ll.LocalScope) for x in ll.iter_scalars(sc)):
            return dataclasses.replace(stmt, llsc=_clip_scopes(sc, zeros, outer, after))
    return stmt


def _clip_scopes(sc: ll.LLScalar, zeros: _Analysis, outer: dict[Symbol, tuple[int, int]],
                 after: tuple[ll.LLStmt, ...]) -> ll.LLScalar:
    """`sc` with the loops of its local scopes clipped (a reduction computed inside an
    expression, as the softmax's backward sums `dP * P` over a row)."""
    match sc:
        case ll.LocalScope(sid, body, orig):
            return ll.LocalScope(sid, _clip(body, zeros, outer, after), orig)
        case ll.Unop() | ll.Binop() | ll.Ternop():
            return ll.map_operands(sc, lambda x: _clip_scopes(x, zeros, outer, after))
    return sc


CHUNK = 8
"""The iterations a clipped innermost loop keeps together: gcc at `-O2` vectorizes only a loop
whose trip count is a known multiple of the vector width, so a loop clipped iteration by
iteration would run scalar (the softmax's `exp`, its backward's divisions); clipped by chunks
of 8 (an AVX2 vector of floats), the chunk's loop stays whole and vectorized."""


def chunked(loop: ll.ForLoop) -> ll.ForLoop:
    """`loop`, a clipped innermost loop, as a loop over chunks of `CHUNK` iterations clipped to
    the chunks with a kept iteration, around a whole loop over the chunk: the iterations it
    adds back are iterations of the unclipped loop, which add zeros or write unread cells as
    the clip's skipped ones do. `loop` itself when its range is not whole chunks from 0."""
    extent = loop.to_ - loop.from_ + 1
    body = list(ll.iter_stmts(loop.body))
    if (loop.from_ != 0 or extent % CHUNK or extent == CHUNK
            or any(isinstance(x, ll.ForLoop) for x in body)
            or any(isinstance(x, ll.LocalScope) for st in body for x in ll.deep_parts(st))):
        return loop
    chunk, lane = get_symbol("c"), get_symbol("l")
    env: dict[Symbol, AxisIndex] = {loop.index: make_affine([(CHUNK, chunk), (1, lane)])}
    lanes = ll.ForLoop(lane, 0, CHUNK - 1, _substituted(loop.body, env))
    start = stop = None
    if loop.start is not None:  # scale * (CHUNK * c + CHUNK - 1) >= bound for the chunk's last
        start = ll.LoopClip(_shifted(loop.start.bound, -(CHUNK - 1) * loop.start.scale), CHUNK * loop.start.scale)
    if loop.stop is not None:  # scale * CHUNK * c < bound for the chunk's first
        stop = ll.LoopClip(loop.stop.bound, CHUNK * loop.stop.scale)
    return ll.ForLoop(chunk, 0, extent // CHUNK - 1, lanes, loop.trace_it, start=start, stop=stop)


def _shifted(idx: AxisIndex, by: int) -> AxisIndex:
    lin = _linear(idx)
    assert lin is not None  # clips are built affine
    return make_affine([(c, s) for s, c in lin.items() if s is not None], lin[None] + by)


def _substituted(stmt: ll.LLStmt, env: dict[Symbol, AxisIndex]) -> ll.LLStmt:
    """The statements of an innermost loop's body (no loops, no local scopes) with `env`."""
    match stmt:
        case ll.Seq(a, b):
            return ll.Seq(_substituted(a, env), _substituted(b, env))
        case ll.Set(tn, idcs, sc, debug):
            return ll.Set(tn, tuple(subst_index(env, i) for i in idcs), nests.subst(sc, env), debug)
        case ll.SetLocal(sid, sc):
            return ll.SetLocal(sid, nests.subst(sc, env))
    return stmt


def _over_lanes(loop: ll.ForLoop) -> bool:
    """Whether `loop` runs over the lanes of a register block (a scheduler local indexed by it
    at its last axis): one vector statement, which stays whole."""
    lane = Iterator(loop.index)
    for s in ll.iter_stmts(loop.body):
        if isinstance(s, ll.Set):
            gets = [x for x in ll.iter_scalars(s.llsc) if isinstance(x, ll.Get)]
            if any(tn.is_local() and not is_routine_local(tn) and idcs and idcs[-1] == lane
                   for tn, idcs in [(s.tn, s.idcs), *((x.tn, x.idcs) for x in gets)]):
                return True
    return False


def _written_first(tn: Tnode, stmts: tuple[ll.LLStmt, ...]) -> bool:
    """Whether the first access to `tn` in `stmts` (in order) writes it, or there is none."""
    for stmt in stmts:
        for s in ll.iter_stmts(stmt):
            match s:
                case ll.Set(llsc=sc) | ll.SetLocal(value=sc) | ll.SetFromVec(arg=sc):
                    if any(isinstance(x, (ll.Get, ll.GetMergeBuffer)) and x.tn is tn for x in ll.iter_scalars(sc)):
                        return False
                    if getattr(s, "tn", None) is tn:
                        return True
                case ll.ZeroOut(tn=written) if written is tn:
                    return True
    return True


def _clipped(loop: ll.ForLoop, zeros: _Analysis, outer: dict[Symbol, tuple[int, int]],
             after: tuple[ll.LLStmt, ...]) -> ll.ForLoop | None:
    """`loop` with a start or stop where its body only accumulates products with a factor
    zero above a diagonal and that diagonal cuts its range; None otherwise."""
    inner = {s.index: (s.from_, s.to_) for s in ll.iter_stmts(loop.body) if isinstance(s, ll.ForLoop)}
    if any(isinstance(s, ll.ForLoop) and (s.start or s.stop) for s in ll.iter_stmts(loop.body)):
        return None
    clips = _zero_term_clips(loop, zeros, outer, inner)
    if clips is None:
        clips = _unseen_cell_clips(loop, zeros, outer, inner, after)
    if clips is None:
        clips = _masked_cell_clips(loop, zeros, outer, inner)
    if clips is None:
        clips = _extremum_clips(loop, zeros, outer, inner)
    if clips is None or len(clips) != 1:
        return None
    (at_start, clip), = clips
    least, most = _range(clip.bound, outer)
    if at_start and most > clip.scale * loop.from_:
        return dataclasses.replace(loop, start=clip) if loop.from_ >= 0 else None
    if not at_start and least < clip.scale * (loop.to_ + 1):
        return dataclasses.replace(loop, stop=clip) if loop.from_ >= 0 else None
    return None


def _zero_term_clips(loop: ll.ForLoop, zeros: _Analysis, outer: dict[Symbol, tuple[int, int]],
                     inner: dict[Symbol, tuple[int, int]]) -> set[tuple[bool, ll.LoopClip]] | None:
    """The clips of `loop` whose body only accumulates products with a factor zero above a
    diagonal: its other iterations add zeros."""
    clips: set[tuple[bool, ll.LoopClip]] = set()
    for s in ll.iter_stmts(loop.body):
        match s:
            case ll.Set() | ll.SetLocal():
                term = (_term_clip(s, loop, zeros, outer, inner) if isinstance(s, ll.Set)
                        else _local_term_clip(s, loop, zeros, outer, inner))
                if term is None:
                    return None
                clips.add(term)
            case ll.ForLoop() | ll.Seq() | ll.Comment() | ll.Noop():
                pass
            case _:
                return None
    return clips


def _unseen_cell_clips(loop: ll.ForLoop, zeros: _Analysis, outer: dict[Symbol, tuple[int, int]],
                       inner: dict[Symbol, tuple[int, int]],
                       after: tuple[ll.LLStmt, ...]) -> set[tuple[bool, ll.LoopClip]] | None:
    """The clips of `loop` whose body writes cells of nodes unread above a diagonal
    (`_Analysis.unseen`: they keep the zeros they were cleared to) and scheduler locals it
    writes before it reads them, as does whatever runs `after` it (register blocks, panels):
    its other iterations only write cells nobody reads."""
    clips: set[tuple[bool, ll.LoopClip]] = set()
    written_first: dict[Tnode, bool] = {}
    for s in ll.iter_stmts(loop.body):
        match s:
            case ll.Set(tn=tn, idcs=idcs, llsc=sc):
                for x in ll.iter_scalars(sc):
                    if isinstance(x, (ll.Get, ll.GetMergeBuffer)):
                        written_first.setdefault(x.tn, False)
                written_first.setdefault(tn, True)
                unseen = zeros.unseen(tn)
                if unseen:
                    kept = [clip for (kp, qp), c in unseen.items()
                            if (clip := _diagonal_clip(idcs[kp], idcs[qp], c, loop.index, outer, inner))]
                    if not kept:
                        return None
                    clips.add(kept[0])
                elif not (tn.is_local() and not is_routine_local(tn)):
                    return None
            case ll.ForLoop() | ll.Seq() | ll.Comment() | ll.Noop():
                pass
            case _:
                return None
    if not clips:
        return None
    scratch = {s.tn for s in ll.iter_stmts(loop.body) if isinstance(s, ll.Set) and not zeros.unseen(s.tn)}
    return clips if all(written_first[tn] and _written_first(tn, after) for tn in scratch) else None


def _masked_cell_clips(loop: ll.ForLoop, zeros: _Analysis, outer: dict[Symbol, tuple[int, int]],
                       inner: dict[Symbol, tuple[int, int]]) -> set[tuple[bool, ll.LoopClip]] | None:
    """The clips of `loop` whose body only writes cells of nodes every read of which a `where`
    ignores (`_Analysis.masked`): its other iterations write cells nobody uses."""
    def clip_of(s: ll.Set) -> tuple[bool, ll.LoopClip] | None:
        return next((clip for (kp, qp), c in zeros.masked(s.tn).items()
                     if (clip := _diagonal_clip(s.idcs[kp], s.idcs[qp], c, loop.index, outer, inner))), None)
    return _every_store_clipped(loop, clip_of)


def _extremum_clips(loop: ll.ForLoop, zeros: _Analysis, outer: dict[Symbol, tuple[int, int]],
                    inner: dict[Symbol, tuple[int, int]]) -> set[tuple[bool, ll.LoopClip]] | None:
    """The clips of `loop` whose body only takes maxima or minima `m = max(m, x)` of cells of
    nodes constant above a diagonal (`_Analysis.constant`) into cells `m` the loop's own index
    does not pick: its other iterations read only that constant, and the clip keeps one
    iteration whose cells all hold it, which gives each `m` the constant once (a maximum of the
    same values, whatever their number: the same bits)."""
    def clip_of(s: ll.Set) -> tuple[bool, ll.LoopClip] | None:
        match s.llsc:
            case ll.Binop(ops.Binop.MAX | ops.Binop.MIN, a, b):
                mine = ll.Get(s.tn, s.idcs)
                x = b if a == mine else a if b == mine else None
            case _:
                return None
        if (not isinstance(x, ll.Get) or x.tn is s.tn
                or any(loop.index in index_symbols(idx) for idx in s.idcs)):
            return None
        return next((clip for (kp, qp), c in zeros.constant(x.tn).items()
                     if (clip := _constant_clip(x.idcs[kp], x.idcs[qp], c, loop, outer, inner))), None)
    return _every_store_clipped(loop, clip_of)


def _every_store_clipped(loop: ll.ForLoop, clip_of: Callable[[ll.Set], tuple[bool, ll.LoopClip] | None]
                         ) -> set[tuple[bool, ll.LoopClip]] | None:
    """The clips `clip_of` gives each store in `loop`'s body, or None when one store has none or
    the body holds anything but loops and stores."""
    clips: set[tuple[bool, ll.LoopClip]] = set()
    for s in ll.iter_stmts(loop.body):
        match s:
            case ll.Set():
                clip = clip_of(s)
                if clip is None:
                    return None
                clips.add(clip)
            case ll.ForLoop() | ll.Seq() | ll.Comment() | ll.Noop():
                pass
            case _:
                return None
    return clips or None


def _constant_clip(key: AxisIndex, query: AxisIndex, c: int, loop: ll.ForLoop, outer: dict[Symbol, tuple[int, int]],
                   inner: dict[Symbol, tuple[int, int]]) -> tuple[bool, ll.LoopClip] | None:
    """A stop for `loop` whose skipped iterations read only cells with `key >= query + c`, and
    whose last kept one, when it skips any, reads only such cells too: the diagonal moved out
    by the inner loops' span of `key - query` and one step. None when the loop steps over more
    than that span at once (an iteration's cells would not all be past the diagonal), runs the
    other way, or may skip its first iteration."""
    diff = _difference(key, query)
    if diff is None:
        return None
    span = sum(abs(v) * (inner[s][1] - inner[s][0]) for s, v in diff.items() if s in inner)
    if not 0 < diff.get(loop.index, 0) <= span + 1:
        return None
    clip = _diagonal_clip(key, query, c + span + 1, loop.index, outer, inner)
    if clip is None or clip[0] or _range(clip[1].bound, outer)[0] <= clip[1].scale * loop.from_:
        return None
    return clip


def _term_clip(st: ll.Set, loop: ll.ForLoop, zeros: _Analysis, outer: dict[Symbol, tuple[int, int]],
               inner: dict[Symbol, tuple[int, int]]) -> tuple[bool, ll.LoopClip] | None:
    """The clip keeping the iterations of `loop` where the product `st` accumulates can be
    non-zero, as `(is a start, clip)`; None when `st` is no such accumulation."""
    mine = ll.Get(st.tn, st.idcs)
    match st.llsc:
        case ll.Ternop(ops.Ternop.FMA, a, b, acc) if acc == mine:
            factors = (a, b)
        case ll.Binop(ops.Binop.ADD, acc, ll.Binop(ops.Binop.MUL, a, b)) if acc == mine:
            factors = (a, b)
        case ll.Binop(ops.Binop.ADD, ll.Binop(ops.Binop.MUL, a, b), acc) if acc == mine:
            factors = (a, b)
        case _:
            return None
    if any(isinstance(x, (ll.Get, ll.GetMergeBuffer)) and x.tn is st.tn for f in factors for x in ll.iter_scalars(f)):
        return None
    for f in factors:
        if not isinstance(f, ll.Get):
            continue
        for (kp, qp), c in zeros.zeros(f.tn).items():
            clip = _diagonal_clip(f.idcs[kp], f.idcs[qp], c, loop.index, outer, inner)
            if clip is not None:
                return clip
    for f in factors:  # a factor computed in place: `where(key < query + c, x, 0)`, ...
        clip = _value_clip(zeros.value(f, st), loop, outer, inner)
        if clip is not None:
            return clip
    return None


def _local_term_clip(st: ll.SetLocal, loop: ll.ForLoop, zeros: _Analysis, outer: dict[Symbol, tuple[int, int]],
                     inner: dict[Symbol, tuple[int, int]]) -> tuple[bool, ll.LoopClip] | None:
    """The clip keeping the iterations of `loop` where the term a local scope's sum `v := v + t`
    or `v := v - t` adds can be non-zero. The sum starts at 0 (`LocalScope`), so it is never
    -0 and adding or subtracting a zero leaves it as it is."""
    match st.value:
        case ll.Binop(ops.Binop.ADD | ops.Binop.SUB, ll.GetLocal(sid), term) if sid == st.id:
            pass
        case ll.Binop(ops.Binop.ADD, term, ll.GetLocal(sid)) if sid == st.id:
            pass
        case _:
            return None
    if any(isinstance(x, ll.GetLocal) and x.id == st.id for x in ll.iter_scalars(term)):
        return None
    return _value_clip(zeros.value(term, None), loop, outer, inner)


def _value_clip(facts: Zeros, loop: ll.ForLoop, outer: dict[Symbol, tuple[int, int]],
                inner: dict[Symbol, tuple[int, int]]) -> tuple[bool, ll.LoopClip] | None:
    """A clip of `loop` from where a value is zero (`_Analysis.value`, by loop symbols)."""
    for (key, query), c in (facts or {}).items():
        clip = _diagonal_clip(Iterator(key), Iterator(query), c, loop.index, outer, inner)
        if clip is not None:
            return clip
    return None


def _difference(key: AxisIndex, query: AxisIndex) -> dict[Symbol | None, int] | None:
    """`key - query` as coefficients by symbol (None: the constant), or None when either index
    is not linear."""
    k, q = _linear(key), _linear(query)
    if k is None or q is None:
        return None
    diff = dict(k)
    for s, v in q.items():
        diff[s] = diff.get(s, 0) - v
    return diff


def _diagonal_clip(key: AxisIndex, query: AxisIndex, c: int, x: Symbol, outer: dict[Symbol, tuple[int, int]],
                   inner: dict[Symbol, tuple[int, int]]) -> tuple[bool, ll.LoopClip] | None:
    """Iteration `x` has a non-zero term iff `key - query - c < 0` for some inner indices:
    `alpha * x + rest + least < 0`, a stop (`alpha > 0`) or a start (`alpha < 0`)."""
    diff = _difference(key, query)
    if diff is None:
        return None
    const = diff.pop(None) - c
    alpha = diff.pop(x, 0)
    rest: list[tuple[int, Symbol]] = []
    for s, v in diff.items():
        if v == 0:
            continue
        if s in inner:
            lo, hi = inner[s]
            const += min(v * lo, v * hi)
        elif s in outer:
            rest.append((v, s))
        else:
            return None
    if alpha > 0:
        return False, ll.LoopClip(make_affine([(-v, s) for v, s in rest], -const), alpha)
    if alpha < 0:
        return True, ll.LoopClip(make_affine(rest, const + 1), -alpha)
    return None


def _range(idx: AxisIndex, loops: dict[Symbol, tuple[int, int]]) -> tuple[int, int]:
    lin = _linear(idx)
    assert lin is not None  # clips are built affine
    least = most = lin.pop(None)
    for s, v in lin.items():
        assert s is not None  # the offset was popped
        lo, hi = loops[s]
        least, most = least + min(v * lo, v * hi), most + max(v * lo, v * hi)
    return least, most
