"""Epilogues: a pointwise statement that reads a contraction's result cell by cell is computed
where the contraction stores that cell (`optimize_proc`'s "epilogues" stage, CPU, after
first_writes).

A dense layer with a bias lowers to two nests: the product `c := x @ w` into a node of its
own, then `y := b + c` over every cell. The scheduled product holds each cell in a vector
register right before it stores it; the second nest streams the whole of `c` back in, adds
the bias and streams `y` out. In the GPT step the attention's q, k and v projections each paid
such a nest (0.5 MiB in, 0.5 MiB out), and the MLP's first product stored its result only for
the GELU nest to add the bias to it. Here the statement moves into the product: where it
stored `c[e] := v` it stores `y[e] := b[..] + v`, and `c` is gone. Each cell is computed by
the same operations in the same order, so results are bit-identical.

The contraction `S` (the nests that write `c`: a tail panel is a nest of its own) and the
nest `P` after it qualify when:

- `c` is float or double (a narrower node rounds what it stores, which the statement read);
- `S` writes `c` only by copying cells of the scheduler's own buffers (an accumulator block, a
  tail's edge buffer) and never reads it: a product from zero in one chunk (chunks read back
  what the previous one stored); no other statement of the routine touches `c` but `P`,
  which only reads it; `c` may be storage of this routine alone (`causal.may_be_local`), so
  nobody outside looks for its cells;
- `P` is a perfect nest of whole loops, one per axis of `c` in order, and exactly one of its
  innermost statements, `T`, reads `c`: at the loops' cell, writing a node of `c`'s dims and
  precision at that same cell, from reads of that precision, constants, additions,
  subtractions, multiplications and FMAs only (what the C backend computes on a register
  block's vectors), every other read of a small node (a bias, `MAX_OPERAND_BYTES`) and along
  `c`'s last axis reading its own last axis with the same index (contiguous in the vector);
- nothing `T` reads or writes is written from `S`'s first nest to `P`, nor is what it writes
  read there; the statements of `P` before `T` neither read nor write what `T` writes, nor do
  the ones after it write it: `T` may then run before all of `P`, inside `S`.
"""

from __future__ import annotations

import dataclasses
import re

from einjit.ir import low_level as ll
from einjit.ir import provenance
from einjit.ir.indexing import AxisIndex, Iterator, Symbol, index_symbols
from einjit.ir.sched import copies, nests
from einjit.ir.sched.causal import may_be_local
from einjit.ir.tnode import Tnode

__all__ = ["fold_epilogues"]


def fold_epilogues(llc: ll.LLStmt, *, local_storage: bool = True) -> ll.LLStmt:
    """`llc` with each qualifying pointwise statement moved into the contraction before it."""
    if not local_storage:
        return llc
    items = list(ll.flatten(llc))
    accesses = [_accesses(s) for s in items]
    if any(a is None for a in accesses):
        return llc
    q = 1
    while q < len(items):
        folded = _fold(items, accesses, q)  # type: ignore[arg-type]
        if folded is None:
            q += 1
            continue
        writers, rest = folded
        for j, s in writers.items():
            items[j], accesses[j] = s, _accesses(s)
        if rest is None:
            del items[q], accesses[q]
        else:
            items[q], accesses[q] = rest, _accesses(rest)
    return ll.seq(*items)


Accesses = tuple[set[Tnode], set[Tnode]]


def _fold(items: list[ll.LLStmt], accesses: list[Accesses],
          q: int) -> tuple[dict[int, ll.LLStmt], ll.LLStmt | None] | None:
    """The statements writing a result the nest at `q` reads, with one statement of that nest
    moved in, and what is left of the nest (None: nothing), if any result qualifies (see the
    module). A contraction with a tail panel writes its result in two nests."""
    reads_p, writes_p = accesses[q]
    for c in sorted(reads_p - writes_p, key=lambda tn: tn.id):
        writers = [j for j, (r, w) in enumerate(accesses) if c in w]
        if not writers or writers[-1] > q or not may_be_local(c) or c.prec not in nests.VECTOR_PRECS:
            continue
        span = range(writers[0], q)
        if any(c in accesses[j][0] for j in range(len(items)) if j != q) \
                or not all(_only_sets(items[j], c) for j in writers):
            continue
        found = _statement(items[q], c)
        if found is None:
            continue
        t, symbols, rest = found
        if any(tn in accesses[j][1] or (tn is t.tn and tn in accesses[j][0])
               for j in span for tn in _reads(t.llsc) - {c} | {t.tn}) \
                or any(tn in writes_p for tn in _reads(t.llsc) - {c}):
            continue
        moved = {j: _store(items[j], c, t, symbols) for j in writers}
        moved |= {j: ll.Comment(_renamed(x.message, c, t.tn.name)) for j in span
                  if isinstance(x := items[j], ll.Comment)}
        return moved, rest
    return None


def _statement(p: ll.LLStmt, c: Tnode) -> tuple[ll.Set, list[Symbol], ll.LLStmt | None] | None:
    """`(T, symbols, rest)`: the statement of `p` that may move (see the module), the loop
    symbols of `c`'s axes in order, and `p` without `T` (None if `T` was all of it)."""
    whole = nests.whole_loops(p)
    if whole is None:
        return None
    extent, body = whole
    symbols = list(extent)
    if [extent[s] for s in symbols] != list(c.dims):
        return None
    cell = tuple(Iterator(s) for s in symbols)
    stmts = list(ll.flatten(body))
    readers = [j for j, s in enumerate(stmts) if c in _stmt_reads(s)]
    if len(readers) != 1:
        return None
    j = readers[0]
    t = stmts[j]
    if not isinstance(t, ll.Set) or t.idcs != cell or t.tn.dims != c.dims or t.tn.prec is not c.prec \
            or t.tn is c or not nests.vector_ops_only(t.llsc, c.prec):
        return None
    if any(isinstance(x, ll.Get) and x.tn is c and x.idcs != cell for x in ll.iter_scalars(t.llsc)):
        return None
    if not _contiguous(t.llsc, c, symbols[-1]):
        return None
    for i, s in enumerate(stmts):
        if i == j:
            continue
        if not isinstance(s, ll.Set) or (i < j and t.tn in _stmt_reads(s)) or s.tn is t.tn:
            return None
    if len(stmts) == 1:
        return t, symbols, None
    rest = ll.seq(*stmts[:j], *stmts[j + 1:])
    return t, symbols, nests.nest([(s, extent[s]) for s in symbols], rest)


MAX_OPERAND_BYTES = 16 << 10
"""The largest node the moved statement may read besides `c`: a bias stays in the L1 across the
product. A node as large as the result (a residual stream, GELU's stored input and gate in its
backward) is read a block at a time between runs of the summed loop, rows apart, where the
hardware prefetcher does not follow: the GPT step's attention output projection with its
residual took 0.47 ms in the product against 0.30 ms apart, GELU's backward in its product
0.3 ms more than in a nest of its own."""


def _contiguous(sc: ll.LLScalar, c: Tnode, last: Symbol) -> bool:
    """Whether every read of `sc` other than `c` is of a node of at most `MAX_OPERAND_BYTES` and
    uses the symbol of `c`'s last axis, if at all, as the plain index of its own last axis: the
    lane a vector of `c` runs along then runs along that read too."""
    for x in ll.iter_scalars(sc):
        if isinstance(x, ll.Get) and x.tn is not c:
            if x.tn.size * x.tn.prec.itemsize > MAX_OPERAND_BYTES:
                return False
            *outer, inner = x.idcs
            if any(last in index_symbols(i) for i in outer):
                return False
            if last in index_symbols(inner) and inner != Iterator(last):
                return False
    return True


def _store(s: ll.LLStmt, c: Tnode, t: ll.Set, symbols: list[Symbol]) -> ll.LLStmt:
    """`s` storing `t`'s value where it stored `c`'s cell."""

    def value(idcs: tuple[AxisIndex, ...], v: ll.LLScalar) -> ll.LLScalar:
        return _with(t.llsc, c, v, dict(zip(symbols, idcs, strict=True)))

    def walk(x: ll.LLStmt) -> ll.LLStmt:
        match x:
            case ll.Seq(a, b):
                return ll.Seq(walk(a), walk(b))
            case ll.ForLoop(body=body):
                return dataclasses.replace(x, body=walk(body))
            case ll.Set(tn, idcs, v, _) if tn is c:
                return ll.Set(t.tn, idcs, value(idcs, v), _note(t.debug, c, v))
        return x

    return walk(s)


def _note(debug: str, c: Tnode, v: ll.LLScalar) -> str:
    """`debug` naming what the store held (an accumulator) where it named `c`, which is gone."""
    return _renamed(debug, c, v.tn.name) if isinstance(v, ll.Get) else debug


def _renamed(text: str, c: Tnode, name: str) -> str:
    return re.sub(rf"\b{re.escape(c.name)}\b", name, text)


def _with(sc: ll.LLScalar, c: Tnode, v: ll.LLScalar, env: dict[Symbol, AxisIndex]) -> ll.LLScalar:
    """`sc` with its read of `c` replaced by `v` and the nest's symbols by the store's indices."""
    match sc:
        case ll.Get(tn, _) if tn is c:
            return v
    if isinstance(sc, ll.Get):
        return nests.subst(sc, env)
    return ll.map_operands(sc, lambda x: _with(x, c, v, env))


def _only_sets(s: ll.LLStmt, c: Tnode) -> bool:
    """Whether `s` writes `c` by `Set`s alone, each storing a cell of the scheduler's own buffers
    (an accumulator block, a tail's edge buffer): the statement moved in then reads a register
    or a cell in L1 where it read `c`, and a producer computing its value (a pointwise nest,
    which inlining already weighed) keeps its node."""
    for x in ll.deep_parts(s):
        match x:
            case ll.Set(tn, _, v) if tn is c:
                if not (isinstance(v, ll.Get) and v.tn.provenance in _SCHEDULED):
                    return False
            case ll.SetFromVec(tn=tn) | ll.ZeroOut(tn) if tn is c:
                return False
            case ll.LocalScope():
                return False
    return True


_SCHEDULED = (provenance.REGISTER_BLOCK, provenance.SCHEDULED_LOCAL)


def _reads(sc: ll.LLScalar) -> set[Tnode]:
    return {x.tn for x in ll.iter_scalars(sc) if isinstance(x, (ll.Get, ll.GetMergeBuffer))}


def _stmt_reads(s: ll.LLStmt) -> set[Tnode]:
    return {x.tn for x in ll.deep_parts(s) if isinstance(x, (ll.Get, ll.GetMergeBuffer))}


def _accesses(stmt: ll.LLStmt) -> Accesses | None:
    """The nodes `stmt` reads and writes; None when it holds staged code or reads a merge
    buffer (whose text or transfers may name a node)."""
    merged: set[Tnode] = set()
    reads, writes = copies.accesses(stmt, merged)
    return None if reads is None or merged else (reads, writes)
