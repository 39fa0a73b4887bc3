"""Loop fusion, the last optimizer stage for CPU code (`optimize_proc`'s "fuse").

Lowering and the earlier stages leave one loop nest per tensor node, so LayerNorm is five
passes over the activations (the mean, the centred values, the variance, its reciprocal
square root, the affine map) and each pass streams its arrays from the last-level cache: the
GPT step spent more time in such small nests than in its attention. Here two consecutive nests
whose outer loops have the same range become one loop around both bodies, level by level, as
deep as the ranges agree and the fusion is legal, down to the innermost loops, which fuse only
where both compute plain arithmetic (`_innermost`): softmax becomes one pass over each row, the
row still in L1 from one step to the next. A loop over the rows alone (LayerNorm's reciprocal
square root) fuses into the nest over the same rows that it shares an array with, one scalar
statement per row, when the nest's rows are long (`_per_iteration`, `ROW_MIN`).

Fusing loop `i` of nest A with loop `i'` of nest B runs B's iteration `i` right after A's
instead of after all of A. That computes the same values when every array one of them writes
and both access is accessed by both at the slice of `i` alone: at one axis, the same in every
access, the index is the loop's own iterator, and no other axis depends on it. Iteration `i` of
either nest then touches only cells that no other iteration of either nest touches, so every
dependence between the two bodies stays inside one iteration, in the original order. The
bodies are not reordered, so no arithmetic changes and results are bit-identical. A `ZeroOut`
or comment between the two nests moves before them when the first nest does not touch its array.

Nests that pack a panel (scheduled contractions: their panels are sized for the cache, and
their loops split for it), loops with any mark (threads, unrolling, a fixed order) or over
the lanes of a register block's vectors, and nests holding staged code or whole-vector
writes are left as they are. One kind of marked loop may sit inside a fused nest: the
unrolled loops of a split reduction's partial sums (`_partial_sum_loop`), which run within
one output cell's iteration. LayerNorm's mean and variance are such reductions at GPT sizes;
with them fused, its forward is one pass over each block of rows instead of four, and its
backward (with the residual gradients) one or two instead of five; the LayerNorm forward and
backward row in `benchmarks/bench_pointwise.py` ran 1.2x faster.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import TypeVar

from einjit.ir import low_level as ll
from einjit.ir import ops, provenance
from einjit.ir.indexing import AxisIndex, Iterator, Symbol, index_symbols, subst_index
from einjit.ir.tnode import Tnode

Access = tuple[Tnode, tuple[AxisIndex, ...] | None, bool]
"""An array access: node, indices (None: the whole array), whether it writes."""


MAX_FUSED = 16
"""The most nests fused into one: each fusion checks the nest fused so far, so an unbounded
group would make the stage quadratic in a long chain of nests (and gcc's function larger).
A GPT block's LayerNorm backward with its residual gradients is a chain of nine or ten; at 8
the last of them (the residual gradient's copy) ran as one more pass over the activations."""


SINK_PAST = 8
"""How many statements a loop may sink past (`_sunk`): a row sum is three or four (its partial
sums' clear, steps, folds and total)."""


_S = TypeVar("_S")
_R = TypeVar("_R")

_known: ContextVar[dict[tuple[str, int], tuple[object, object]] | None] = ContextVar("einjit_fusion_facts",
                                                                                   default=None)
"""Facts about the statements of the running `fuse_loops` (`_remembered`), by function and
statement identity; each entry holds its statement, so that no id is reused while it lives."""


def _remembered(f: Callable[[_S], _R]) -> Callable[[_S], _R]:
    """`f` answered once per statement during a `fuse_loops`. Each fusion checks the nest fused
    so far again, and a fused nest's body is the old bodies under a few new `Seq`s: with the
    facts composed from the parts' (a sequence's accesses are its halves'), a check costs the
    new nodes, not a walk of the whole group (the stage took a fifth of the 4-block GPT step's
    compile). Statements are immutable, so a fact stays right while its statement lives."""

    @functools.wraps(f)
    def answer(stmt: _S) -> _R:
        known = _known.get()
        if known is None:
            return f(stmt)
        key = (f.__name__, id(stmt))
        hit = known.get(key)
        if hit is None:
            hit = known[key] = (stmt, f(stmt))
        return hit[1]  # type: ignore[return-value]  # stored by this function for this statement

    return answer


def fuse_loops(stmt: ll.LLStmt) -> ll.LLStmt:
    """`stmt` with every legal pair of consecutive nests fused, repeatedly (see the module)."""
    if _known.get() is not None:
        return _fused(stmt)
    token = _known.set({})
    try:
        return _fused(stmt)
    finally:
        _known.reset(token)


def _fused(stmt: ll.LLStmt) -> ll.LLStmt:
    out: list[ll.LLStmt] = []
    fused: list[int] = []
    for s in _sunk(list(ll.flatten(stmt))):
        if isinstance(s, ll.ForLoop) and _fuse_onto(out, fused, s):
            continue
        out.append(s)
        fused.append(1)
    return ll.seq(*out)


def _sunk(items: list[ll.LLStmt]) -> list[ll.LLStmt]:
    """`items` with each loop moved down, past statements independent of it, to just before a
    later loop that writes an array it writes, when the two fuse: one pass over that array
    instead of two. Independent statements commute (neither writes what the other accesses), so
    every value is computed as before. LayerNorm's backward added a row's gradient into the
    residual gradient, summed the row, then added the sum's share into the residual gradient:
    sunk past the row sum, the first addition joins the second's loop (an 11% faster nest).
    A loop sinks past at most `SINK_PAST` statements, which keeps the search linear in a long
    sequence of nests."""
    k = 0
    while k < len(items):
        target = _sink_target(items, k)
        if target is None:
            k += 1
        else:
            items.insert(target - 1, items.pop(k))
    return items


def _sink_target(items: list[ll.LLStmt], k: int) -> int | None:
    """The index of the loop `items[k]` may sink to (see `_sunk`), or None."""
    a = items[k]
    if not isinstance(a, ll.ForLoop) or not _plain(a):
        return None
    acc_a = accesses(a)
    writes_a = {tn for tn, _, w in acc_a if w}
    nodes_a = {tn for tn, _, _ in acc_a}
    for j in range(k + 1, min(len(items), k + 2 + SINK_PAST)):
        b = items[j]
        acc_b = accesses(b)
        if isinstance(b, ll.ForLoop) and writes_a & {tn for tn, _, w in acc_b if w}:
            return j if j > k + 1 and _fuse(a, b) is not None else None
        if not _plain_code(b) or writes_a & {tn for tn, _, _ in acc_b} or nodes_a & {tn for tn, _, w in acc_b if w}:
            return None
    return None


def _fuse_onto(out: list[ll.LLStmt], fused: list[int], b: ll.ForLoop) -> bool:
    """Fuse `b` into the last nest of `out`, moving the zero fills and comments after that nest
    before it; False when there is no such nest, it holds `MAX_FUSED` nests already, or fusing
    is not legal. `fused[k]`: how many nests `out[k]` holds."""
    j = len(out) - 1
    while j >= 0 and isinstance(out[j], (ll.ZeroOut, ll.Comment)):
        j -= 1
    if j < 0 or not isinstance(out[j], ll.ForLoop) or fused[j] >= MAX_FUSED:
        return False
    a = out[j]
    assert isinstance(a, ll.ForLoop)
    between = out[j + 1:]
    zeroed = {s.tn for s in between if isinstance(s, ll.ZeroOut)}
    if zeroed & {tn for tn, _, _ in accesses(a)}:
        return False
    new = _fuse(a, b)
    if new is None:
        return False
    out[j:] = [*between, new]
    fused[j:] = [*(1 for _ in between), fused[j] + 1]
    return True


def _marked(loop: ll.ForLoop) -> bool:
    """Loops fusion leaves alone: unrolled, threaded, ordered, untraced, and clipped ones (a
    clip's bound names outer indices, which fusing would have to rename and re-prove). A nest
    may hold clipped loops: fused, their bounds are renamed with the rest of its body."""
    return (loop.unroll or loop.parallel or loop.keep_order or not loop.trace_it
            or loop.start is not None or loop.stop is not None)


def _plain(loop: ll.ForLoop) -> bool:
    """No packed panel (a scheduled contraction), staged code or whole-vector write inside."""
    return _plain_code(loop.body)


@_remembered
def _plain_code(stmt: ll.LLStmt) -> bool:
    match stmt:
        case ll.Seq(first, second):
            return _plain_code(first) and _plain_code(second)
        case ll.StagedCompilation() | ll.SetFromVec():
            return False
        case ll.ForLoop(body=body):
            marked = stmt.unroll or stmt.parallel or stmt.keep_order or not stmt.trace_it
            return (not marked or _partial_sum_loop(stmt)) and _plain_code(body)
        case ll.Set(tn) if tn.is_local() and tn.label and tn.label[0] == "pack":
            return False
    return True


def _partial_sum_loop(loop: ll.ForLoop) -> bool:
    """Whether `loop` is an unrolled loop of a split reduction's partial sums or extrema
    (`schedule._split_reduction`): it clears, adds to, folds or totals their block. Such a loop
    runs inside one output cell's iteration, so fusing the loops around it moves it whole;
    LayerNorm's mean and variance then join the pass over their row."""
    if loop.parallel or loop.keep_order or not loop.trace_it or loop.start is not None or loop.stop is not None:
        return False
    return any(tn.is_local() and tn.label[:1] == ["lanes"] for tn, _, _ in accesses(loop))


@_remembered
def _lane_loop(loop: ll.ForLoop) -> bool:
    """Whether `loop` runs over the lanes of a register block's vectors: the C backend renders
    such a loop as one vector statement, which a second statement in its body would undo."""
    return any(tn.provenance == provenance.REGISTER_BLOCK and idcs is not None
               and any(loop.index in index_symbols(i) for i in idcs) for tn, idcs, _ in accesses(loop.body))


def _innermost(loop: ll.ForLoop) -> bool:
    """Whether `loop` holds no loop: innermost loops are fused only when both compute with
    additions, subtractions, multiplications, divisions, FMAs and `exp` alone (`_arithmetic`). gcc
    vectorizes an innermost loop per statement well, but fused softmax statements sharing a mask
    (`exp(where(m, s - max, 0))`, then `where(m, exp, 0)`) let it compute the `exp` on every
    lane, the masked -1e30 scores included, and then select: libmvec took its slow path for the
    underflowing lanes and the softmax pass ran 4x slower. Without a select no lane computes what
    it would not compute alone, and plain arithmetic has no slow lanes:
    fused, LayerNorm's row loops (a row's gradients, the column sums of gamma and beta, the
    residual and embedding gradients) load each operand once and reuse the values stored before."""
    return not _has_loop(loop.body)


def _pointwise(loop: ll.ForLoop) -> bool:
    """Whether the innermost `loop` may fuse with another: it computes plain arithmetic
    (`_arithmetic`), and each of its statements stores a cell per iteration from values read
    along the loop. A sum into one cell (a float reduction gcc keeps scalar, in order) would
    take the other loop's statements out of vectors; a statement storing one value along the
    loop is a row that `row_buffers` keeps as one cell, computed once, in a loop of its own."""
    if not _arithmetic(loop.body):
        return False
    moving = loop.index
    for st in ll.flatten(loop.body):
        if isinstance(st, ll.Set) and (not any(moving in index_symbols(i) for i in st.idcs) or not any(
                isinstance(x, ll.Get) and any(moving in index_symbols(i) for i in x.idcs)
                for x in ll.iter_scalars(st.llsc))):
            return False
    return True


def _per_iteration(loop: ll.ForLoop) -> bool:
    """Whether the innermost `loop` may fuse with a nest of loops that it shares an array with
    (`_share`): each of its statements writes a cell of its own per iteration. Fused, each
    runs as one scalar statement per iteration of the nest, beside that iteration's inner
    loops: LayerNorm's reciprocal square root between the row's variance and its normalized
    values, and its backward's variance gradient between the two passes over a row, which then
    run as one pass over each row, the row in L1, not over a block of rows (the block's buffers
    were 32 KiB each)."""
    moving = loop.index
    return all(not isinstance(st, ll.Set) or any(moving in index_symbols(i) for i in st.idcs)
               for st in ll.flatten(loop.body))


ROW_MIN = 64
"""The shortest inner loop a nest needs for a loop over its rows alone to fuse into it
(`_long_rows`): below, the row is a cache line or two, as cheap to reread as to keep, and the
fused loop's statements would run scalar beside little vector work (a small MLP's bias and
activation after each output's dot product of 2 or 16 terms)."""


@_remembered
def _long_rows(nest: ll.ForLoop) -> bool:
    """Whether some loop inside `nest` runs at least `ROW_MIN` iterations."""
    return any(isinstance(s, ll.ForLoop) and s.to_ - s.from_ + 1 >= ROW_MIN for s in ll.iter_stmts(nest.body))


def _share(acc_a: list[Access], acc_b: list[Access]) -> bool:
    """Whether one body writes an array the other accesses: fusing keeps it in cache from one
    to the other. Unrelated loops (two parameters' updates) gain nothing from sharing a loop."""
    written_a = {tn for tn, _, w in acc_a if w}
    written_b = {tn for tn, _, w in acc_b if w}
    return bool(written_a & {tn for tn, _, _ in acc_b} or written_b & {tn for tn, _, _ in acc_a})


_ARITHMETIC = frozenset({ops.Binop.ADD, ops.Binop.SUB, ops.Binop.MUL, ops.Binop.DIV})
_ARITHMETIC_UNOPS = frozenset({ops.Unop.NEG, ops.Unop.RECIP, ops.Unop.EXP})
"""`exp` counts as arithmetic: in single precision einjit's inline `exp` (`ir/own_exp.py`), the
same branchless steps on every lane, and libmvec's vector `exp` in double. Fused with the bias
addition before it, GELU's forward read its input from registers, and its backward summed the
bias gradient from them (5 and 3% faster nests)."""


@_remembered
def _arithmetic(stmt: ll.LLStmt) -> bool:
    """Whether `stmt` only stores values of reads, constants, FMAs, `_ARITHMETIC` and
    `_ARITHMETIC_UNOPS`."""
    match stmt:
        case ll.Seq(first, second):
            return _arithmetic(first) and _arithmetic(second)
        case ll.Set(llsc=sc):
            for x in ll.iter_scalars(sc):
                match x:
                    case ll.Get() | ll.Constant() | ll.Ternop(ops.Ternop.FMA):
                        pass
                    case ll.Binop(op) if op in _ARITHMETIC:
                        pass
                    case ll.Unop(op) if op in _ARITHMETIC_UNOPS:
                        pass
                    case _:
                        return False
            return True
        case ll.Comment():
            return True
    return False


@_remembered
def _has_loop(stmt: ll.LLStmt) -> bool:
    match stmt:
        case ll.Seq(first, second):
            return _has_loop(first) or _has_loop(second)
    return isinstance(stmt, ll.ForLoop)


def _fuse(a: ll.ForLoop, b: ll.ForLoop) -> ll.ForLoop | None:
    if ((a.from_, a.to_) != (b.from_, b.to_) or _marked(a) or _marked(b) or not _plain(a) or not _plain(b)
            or _lane_loop(a) or _lane_loop(b)):
        return None
    inner_a, inner_b = _innermost(a), _innermost(b)
    if inner_a and inner_b and not (_pointwise(a) and _pointwise(b)):
        return None
    acc_a, acc_b = accesses(a.body), accesses(b.body)
    if inner_a != inner_b:
        row_loop, nest = (a, b) if inner_a else (b, a)
        if not (_per_iteration(row_loop) and _share(acc_a, acc_b) and _long_rows(nest)):
            return None
    if not _sliced(acc_a, acc_b, a.index, b.index):
        return None
    renamed = _rename(b.body, {b.index: Iterator(a.index)})
    return dataclasses.replace(a, body=_fused(ll.seq(a.body, renamed)))


def _sliced(acc_a: list[Access], acc_b: list[Access], sa: Symbol, sb: Symbol) -> bool:
    """Whether every array written by one body and accessed by both is accessed, in both, only
    at the slice of the fused loop (see the module docstring)."""
    nodes_a = {tn for tn, _, _ in acc_a}
    nodes_b = {tn for tn, _, _ in acc_b}
    written = {tn for tn, _, w in acc_a + acc_b if w}
    for tn in written & nodes_a & nodes_b:
        axes = {slice_axis(idcs, sa) for t, idcs, _ in acc_a if t is tn}
        axes |= {slice_axis(idcs, sb) for t, idcs, _ in acc_b if t is tn}
        if len(axes) != 1 or None in axes:
            return False
    return True


def slice_axis(idcs: tuple[AxisIndex, ...] | None, s: Symbol) -> int | None:
    """The one axis indexed by exactly `s`, when no other axis depends on `s`."""
    if idcs is None:
        return None
    found = [k for k, idx in enumerate(idcs) if s in index_symbols(idx)]
    if len(found) != 1 or idcs[found[0]] != Iterator(s):
        return None
    return found[0]


@_remembered
def accesses(stmt: ll.LLStmt) -> list[Access]:
    """Every array access of `stmt`, local scopes included, in no particular order (callers ask
    which nodes, axes and writes occur)."""
    match stmt:
        case ll.Seq(first, second):
            return accesses(first) + accesses(second)
        case ll.ForLoop(body=body):
            return accesses(body)
        case ll.Set(tn, idcs, sc):
            return [(tn, idcs, True), *_reads(sc)]
        case ll.SetFromVec(tn, arg=sc):
            return [(tn, None, True), *_reads(sc)]
        case ll.SetLocal(value=sc):
            return _reads(sc)
        case ll.ZeroOut(tn):
            return [(tn, None, True)]
    return []


def _reads(sc: ll.LLScalar) -> list[Access]:
    """The reads of an expression, and the accesses of the local scopes in it."""
    out: list[Access] = []
    for y in ll.iter_scalars(sc):
        match y:
            case ll.Get(tn, idcs) | ll.GetMergeBuffer(tn, idcs):
                out.append((tn, idcs, False))
            case ll.LocalScope(body=body):
                out.extend(accesses(body))
    return out


def _rename(stmt: ll.LLStmt, env: dict[Symbol, AxisIndex]) -> ll.LLStmt:
    match stmt:
        case ll.Seq(first, second):
            return ll.Seq(_rename(first, env), _rename(second, env))
        case ll.ForLoop(body=body, start=start, stop=stop):
            start, stop = (c and ll.LoopClip(subst_index(env, c.bound), c.scale) for c in (start, stop))
            return dataclasses.replace(stmt, body=_rename(body, env), start=start, stop=stop)
        case ll.Set(tn, ix, llsc, debug):
            return ll.Set(tn, _renamed_idcs(ix, env), _renamed_scalar(llsc, env), debug)
        case ll.SetLocal(sid, value):
            return ll.SetLocal(sid, _renamed_scalar(value, env))
    return stmt


def _renamed_idcs(ix: tuple[AxisIndex, ...], env: dict[Symbol, AxisIndex]) -> tuple[AxisIndex, ...]:
    return tuple(subst_index(env, i) for i in ix)


def _renamed_scalar(sc: ll.LLScalar, env: dict[Symbol, AxisIndex]) -> ll.LLScalar:
    """`_rename` of an expression. Module-level, like `_rename`: a closure calling itself is a
    reference cycle, thousands of which a compile left for the cyclic collector."""
    match sc:
        case ll.Get(tn, ix):
            return ll.Get(tn, _renamed_idcs(ix, env))
        case ll.GetMergeBuffer(tn, ix):
            return ll.GetMergeBuffer(tn, _renamed_idcs(ix, env))
        case ll.EmbedIndex(idx):
            return ll.EmbedIndex(subst_index(env, idx))
        case ll.LocalScope(sid, body, orig):
            return ll.LocalScope(sid, _rename(body, env), _renamed_idcs(orig, env))
        case ll.Unop() | ll.Binop() | ll.Ternop():
            return ll.map_operands(sc, lambda x: _renamed_scalar(x, env))
    return sc
