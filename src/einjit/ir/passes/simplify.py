"""Simplification of low-level code (seed 000, `simplify_llc`), the last optimization pass.

Rewrites, bottom-up, each scalar expression in the precision it is computed in (that of the
node or local it is stored into), so that folded constants are exactly what the reference
interpreter would compute:

- constant folding of unary, binary and ternary operations (only to finite results, which
  every backend can spell), and of fixed embedded indices;
- identities: `x + 0`, `0 + x`, `x - 0`, `x * 1`, `1 * x`, `x / 1` → `x`; `0 - x` → `-x`;
  `--x` → `x`; `identity(x)` → `x`. They are exact except for the sign of a zero result:
  `-0.0 + 0` is `+0.0` and `0 - 0.0` is `+0.0`, where the rewrites give `-0.0` (compares
  equal; only a later division by it can tell, as is accepted by ML compilers);
- `x * 0` → `0` only where `x` cannot be NaN or infinite — in integer precision, or for an
  embedded index: in floating point `NaN * 0` and `inf * 0` are NaN, so dropping `x` would
  hide a NaN or an overflow;
- integer powers up to `MAX_UNROLLED_POWER`: `x ** 3` → `x * x * x`, `x ** 0` → `1`,
  `x ** -2` → `recip(x * x)` (floating point only). An `x` that is more than a read is
  computed once into a local first, so unrolling never duplicates work;
- fused multiply-add: `a + b * c` and `b * c + a` → `fma(b, c, a)` in floating point;
- `where` with a constant condition, or with equal branches, and comparisons of embedded
  indices that the enclosing loops' bounds decide (the bounds guards of padded reads that
  inlining made always true) — with `and`/`or` of such decided conditions;
- local scopes: comments are dropped, a leading `v := 0` is dropped (locals start at 0),
  consecutive `v := e` statements are substituted into each other, and a scope whose body is
  just `v := e` becomes `e`. A substitution that would duplicate a non-trivial `e` is not made,
  and a scope is replaced by its value only when the local has the precision of the
  expression around it (otherwise the rounding to the local's precision would be lost).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TypeGuard

import numpy as np

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.fma import fma_rounded_once
from einjit.ir.indexing import Affine, FixedIdx, Iterator, SubAxis, Symbol
from einjit.ir.tnode import Tnode

MAX_UNROLLED_POWER = 4

Ranges = dict[Symbol, tuple[int, int]]
_LocalsMemo = dict[int, tuple[object, frozenset[ll.ScopeId]]]
_WidestMemo = dict[int, tuple[object, "ops.Prec | None"]]


@dataclass(frozen=True, slots=True)
class _Memo:
    """Facts about expressions, memoized by identity for one simplification (see `_locals_in`)."""

    locals: _LocalsMemo
    widest: _WidestMemo


@dataclass(frozen=True, slots=True)
class _Ctx:
    """Where an expression is computed: its precision, the node a new local would belong to
    (None where no local may be introduced) and the bounds of the enclosing loops."""

    prec: ops.Prec
    tn: Tnode | None
    ranges: Ranges
    memo: _Memo


def simplify_llc(llc: ll.LLStmt) -> ll.LLStmt:
    """Simplify every statement and expression of `llc`; loops left empty disappear."""
    return _stmt(llc, {}, _Memo({}, {}))


def _stmt(stmt: ll.LLStmt, ranges: Ranges, memo: _Memo) -> ll.LLStmt:
    out: list[ll.LLStmt] = []
    for s in ll.flatten(stmt):
        match s:
            case ll.ForLoop(index, from_, to_, body, _):
                if to_ < from_:
                    continue
                inner = _stmt(body, {**ranges, index: (from_, to_)}, memo)
                if not isinstance(inner, ll.Noop):
                    out.append(replace(s, body=inner))
            case ll.Set(tn, _, llsc, _):
                out.append(replace(s, llsc=_scalar(llsc, _Ctx(tn.prec.computed_in, tn, ranges, memo))))
            case ll.SetFromVec(tn, _, _, _, arg, _):
                out.append(replace(s, arg=_scalar(arg, _Ctx(ops.int64, None, ranges, memo))))
            case ll.SetLocal(sid, value):
                out.append(ll.SetLocal(sid, _scalar(value, _Ctx(sid.tn.prec.computed_in, sid.tn, ranges, memo))))
            case _:
                out.append(s)
    return ll.seq(*out)


def simplify_scalar(sc: ll.LLScalar, prec: ops.Prec, tn: Tnode | None = None,
                    ranges: Ranges | None = None) -> ll.LLScalar:
    """Simplify an expression computed in `prec`; `tn` is the node a local introduced for
    power unrolling would belong to, `ranges` the bounds of the loop symbols in scope."""
    return _scalar(sc, _Ctx(prec, tn, ranges or {}, _Memo({}, {})))


def _scalar(sc: ll.LLScalar, cx: _Ctx) -> ll.LLScalar:
    wide = _combine_prec(cx.prec, sc, cx.memo.widest)
    if wide is not cx.prec:  # computed in its wider arguments' precision; no narrower local here
        cx = _Ctx(wide, None, cx.ranges, cx.memo)
    match sc:
        case ll.EmbedIndex(FixedIdx(i)) | ll.EmbedIndex(Affine((), i)):
            return ll.Constant(float(i))
        case ll.EmbedIndex(SubAxis()):
            return ll.Constant(0.0)
        case ll.Unop(op, a):
            return _unop(op, _scalar(a, cx), cx)
        case ll.Binop(op, a, b):
            return _binop(op, _scalar(a, cx), _scalar(b, cx), cx)
        case ll.Ternop(op, a, b, c):
            return _ternop(op, _scalar(a, cx), _scalar(b, cx), _scalar(c, cx), cx)
        case ll.LocalScope(sid, body, orig):
            return _local_scope(sid, body, orig, cx)
    return sc


# ---------------------------------------------------------------- constants


def _is_const(sc: ll.LLScalar, value: float) -> TypeGuard[ll.Constant]:
    return isinstance(sc, ll.Constant) and sc.value == value


def _is_positive_zero(sc: ll.LLScalar) -> bool:
    return _is_const(sc, 0.0) and math.copysign(1.0, sc.value) > 0


def _is_zero(sc: ll.LLScalar, *, negative: bool, cx: "_Ctx") -> bool:
    """Whether `sc` is the zero a difference may drop: for floats only the signed one
    (`x - 0.0` is `x` and `-0.0 - x` is `-x` for every `x`, but `x - -0.0` turns a `-0.0`
    into `0.0`, and `0.0 - 0.0` is `0.0` where `-(0.0)` is `-0.0`: a random program's
    `1 / (0 - x)` came out `-inf` for `x = 0`); for integers either. Sums keep dropping any
    zero (`0 + x` is `x`): a sum that starts from zero takes its first term's sign, as a
    gradient PyTorch assigns rather than adds, and keeping the `0.0 +` of every zero-filled
    accumulator changed the code of whole models."""
    if not _is_const(sc, 0.0):
        return False
    return not cx.prec.is_float or (math.copysign(1.0, sc.value) < 0) == negative


def _finite_constant(value) -> ll.Constant | None:
    v = float(value)
    return ll.Constant(v) if math.isfinite(v) else None


def _fold(compute, prec: ops.Prec, *args: float) -> ll.Constant | None:
    """`compute` applied to `args` converted to `prec`, converted back as the interpreter does;
    None if that fails (an integer overflow) or is not finite."""
    dt = prec.dtype.type
    try:
        with np.errstate(all="ignore"):
            return _finite_constant(dt(compute(*(dt(a) for a in args))))
    except (OverflowError, ValueError, ZeroDivisionError):
        return None


def _fma(prec: ops.Prec):
    if prec.is_float:
        return fma_rounded_once(prec.computed_in.dtype)
    return lambda x, y, z: ops.apply_ternop(ops.Ternop.FMA, x, y, z)


# ---------------------------------------------------------------- operations


def _unop(op: ops.Unop, a: ll.LLScalar, cx: _Ctx) -> ll.LLScalar:
    if op is ops.Unop.IDENTITY:
        return a
    if isinstance(a, ll.Constant):
        folded = _fold(lambda x: ops.apply_unop(op, x), cx.prec, a.value)
        if folded is not None:
            return folded
    if op is ops.Unop.NEG and isinstance(a, ll.Unop) and a.op is ops.Unop.NEG:
        return a.arg
    return ll.Unop(op, a)


def _binop(op: ops.Binop, a: ll.LLScalar, b: ll.LLScalar, cx: _Ctx) -> ll.LLScalar:
    if op is ops.Binop.ARG1:
        return a
    if op is ops.Binop.ARG2:
        return b
    if isinstance(a, ll.Constant) and isinstance(b, ll.Constant):
        folded = _fold(lambda x, y: ops.apply_binop(op, x, y), cx.prec, a.value, b.value)
        if folded is not None:
            return folded
    match op:
        case ops.Binop.ADD if _is_const(b, 0.0):
            return a
        case ops.Binop.ADD if _is_const(a, 0.0):
            return b
        case ops.Binop.SUB if _is_zero(b, negative=False, cx=cx):
            return a
        case ops.Binop.SUB if _is_zero(a, negative=True, cx=cx):
            return _unop(ops.Unop.NEG, b, cx)
        case ops.Binop.MUL if _is_const(b, 1.0):
            return a
        case ops.Binop.MUL if _is_const(a, 1.0):
            return b
        case ops.Binop.MUL if (_is_const(b, 0.0) and _never_nan_or_inf(a, cx)) or \
                             (_is_const(a, 0.0) and _never_nan_or_inf(b, cx)):
            return ll.Constant(0.0)
        case ops.Binop.DIV if _is_const(b, 1.0):
            return a
        case ops.Binop.TO_POW_OF if isinstance(b, ll.Constant) and float(b.value).is_integer() \
                and abs(b.value) <= MAX_UNROLLED_POWER:
            unrolled = _power(a, int(b.value), cx)
            if unrolled is not None:
                return unrolled
        case ops.Binop.ADD if cx.prec.is_float and _is_mul(b):
            return ll.Ternop(ops.Ternop.FMA, b.arg1, b.arg2, a)
        case ops.Binop.ADD if cx.prec.is_float and _is_mul(a):
            return ll.Ternop(ops.Ternop.FMA, a.arg1, a.arg2, b)
        case ops.Binop.CMPLT:
            decided = _decide_less(a, b, cx.ranges)
            if decided is not None:
                return ll.Constant(float(decided))
        case ops.Binop.AND if _is_boolean(a) and _is_boolean(b):
            for x, y in ((a, b), (b, a)):
                if isinstance(x, ll.Constant):
                    return y if x.value != 0 else ll.Constant(0.0)
        case ops.Binop.OR if _is_boolean(a) and _is_boolean(b):
            for x, y in ((a, b), (b, a)):
                if isinstance(x, ll.Constant):
                    return ll.Constant(1.0) if x.value != 0 else y
    return ll.Binop(op, a, b)


def _ternop(op: ops.Ternop, a: ll.LLScalar, b: ll.LLScalar, c: ll.LLScalar, cx: _Ctx) -> ll.LLScalar:
    if op is ops.Ternop.WHERE:
        if isinstance(a, ll.Constant):
            return b if a.value != 0 else c
        if b == c:
            return b
    elif isinstance(a, ll.Constant) and isinstance(b, ll.Constant) and isinstance(c, ll.Constant):
        folded = _fold(_fma(cx.prec), cx.prec, a.value, b.value, c.value)
        if folded is not None:
            return folded
    return ll.Ternop(op, a, b, c)


def _is_mul(sc: ll.LLScalar) -> TypeGuard[ll.Binop]:
    return isinstance(sc, ll.Binop) and sc.op is ops.Binop.MUL


def _never_nan_or_inf(sc: ll.LLScalar, cx: _Ctx) -> bool:
    return not cx.prec.is_float or isinstance(sc, ll.EmbedIndex)


_BOOLEAN_BINOPS = {ops.Binop.CMPLT, ops.Binop.CMPEQ, ops.Binop.CMPNE, ops.Binop.AND, ops.Binop.OR}


def _is_boolean(sc: ll.LLScalar) -> bool:
    """Whether the value is always 0 or 1, so that `1 and x` is `x`."""
    match sc:
        case ll.Constant(v):
            return v in (0.0, 1.0)
        case ll.Binop(op, _, _):
            return op in _BOOLEAN_BINOPS
        case ll.Unop(ops.Unop.NOT, _):
            return True
    return False


def _cheap(sc: ll.LLScalar) -> bool:
    """Reading it again costs no more than reading a local."""
    return isinstance(sc, (ll.Constant, ll.ConstantBits, ll.Get, ll.GetLocal, ll.GetMergeBuffer, ll.EmbedIndex))


def _power(base: ll.LLScalar, n: int, cx: _Ctx) -> ll.LLScalar | None:
    if n == 0:
        return ll.Constant(1.0)
    if n < 0 and not cx.prec.is_float:
        return None
    k = abs(n)
    if k == 1 or _cheap(base):
        factor, bind = base, None
    elif cx.tn is not None and cx.tn.prec == cx.prec:
        bind = ll.fresh_scope_id(cx.tn)
        factor = ll.GetLocal(bind)
    else:
        return None
    product = factor
    for _ in range(k - 1):
        product = ll.Binop(ops.Binop.MUL, product, factor)
    if bind is not None:
        product = ll.LocalScope(bind, ll.seq(ll.SetLocal(bind, base), ll.SetLocal(bind, product)), ())
    return ll.Unop(ops.Unop.RECIP, product) if n < 0 else product


# ---------------------------------------------------------------- index bounds


def _interval(sc: ll.LLScalar, ranges: Ranges) -> tuple[float, float] | None:
    match sc:
        case ll.Constant(v):
            return v, v
        case ll.EmbedIndex(Iterator(s)) if s in ranges:
            return ranges[s]
        case ll.EmbedIndex(Affine(symbols, offset)) if all(s in ranges for _, s in symbols):
            lo = hi = offset
            for c, s in symbols:
                a, b = c * ranges[s][0], c * ranges[s][1]
                lo, hi = lo + min(a, b), hi + max(a, b)
            return lo, hi
    return None


def _decide_less(a: ll.LLScalar, b: ll.LLScalar, ranges: Ranges) -> bool | None:
    x, y = _interval(a, ranges), _interval(b, ranges)
    if x is None or y is None:
        return None
    if x[1] < y[0]:
        return True
    if x[0] >= y[1]:
        return False
    return None


# ---------------------------------------------------------------- local scopes


def _combine_prec(asked: ops.Prec, sc: ll.LLScalar, memo: _WidestMemo) -> ops.Prec:
    """`precision.combine_prec`, memoized like `_locals_in` (it reads the whole expression)."""
    if not asked.is_float or not isinstance(sc, (ll.Unop, ll.Binop, ll.Ternop)):
        return asked
    widest = _widest_float_read(sc, memo)
    return widest if widest is not None and widest.itemsize > asked.itemsize else asked


def _widest_float_read(sc: ll.LLScalar, memo: _WidestMemo) -> ops.Prec | None:
    """The widest floating precision among the cells `sc` reads (`precision.read_precisions`);
    float precisions differ in size, so the widest is unique."""
    hit = memo.get(id(sc))
    if hit is not None:
        return hit[1]
    match sc:
        case ll.Get(tn, _) | ll.GetMergeBuffer(tn, _):
            out = tn.prec if tn.prec.is_float else None
        case ll.GetLocal(sid) | ll.LocalScope(sid, _, _):
            out = sid.tn.prec if sid.tn.prec.is_float else None
        case ll.Unop() | ll.Binop() | ll.Ternop():
            out = None
            for child in ll.scalar_children(sc):
                p = _widest_float_read(child, memo)
                if p is not None and (out is None or p.itemsize > out.itemsize):
                    out = p
        case _:
            out = None
    memo[id(sc)] = (sc, out)
    return out


_NO_LOCALS: frozenset[ll.ScopeId] = frozenset()


def _locals_in(x: ll.LLScalar | ll.LLStmt, memo: _LocalsMemo) -> frozenset[ll.ScopeId]:
    """The locals `x` reads or writes. Inlined chains nest each value inside the next, so a
    scan of every value would cost the square of the chain's length; this is memoized by
    identity (the memo keeps `x` alive) and is mostly empty, so it stays linear."""
    hit = memo.get(id(x))
    if hit is not None:
        return hit[1]
    match x:
        case ll.GetLocal(sid):
            out = frozenset((sid,))
        case ll.SetLocal(sid, value):
            out = _locals_in(value, memo) | {sid}
        case ll.LocalScope(sid, body, _):
            out = _locals_in(body, memo) | {sid}
        case ll.Seq(a, b):
            out = _union(_locals_in(a, memo), _locals_in(b, memo))
        case ll.ForLoop(body=body):
            out = _locals_in(body, memo)
        case ll.Set(llsc=sc) | ll.SetFromVec(arg=sc):
            out = _locals_in(sc, memo)
        case ll.Unop() | ll.Binop() | ll.Ternop():
            out = _NO_LOCALS
            for child in ll.scalar_children(x):
                out = _union(out, _locals_in(child, memo))
        case _:
            out = _NO_LOCALS
    memo[id(x)] = (x, out)
    return out


def _union(a: frozenset[ll.ScopeId], b: frozenset[ll.ScopeId]) -> frozenset[ll.ScopeId]:
    return a | b if a and b else a or b


def _writes_local(sc: ll.LLScalar, sid: ll.ScopeId) -> bool:
    return any(isinstance(x, ll.SetLocal) and x.id == sid for x in ll.deep_parts(sc))


def _substitute(sc: ll.LLScalar, sid: ll.ScopeId, value: ll.LLScalar) -> ll.LLScalar:
    match sc:
        case ll.GetLocal(s) if s == sid:
            return value
        case ll.Unop() | ll.Binop() | ll.Ternop():
            return ll.map_operands(sc, lambda x: _substitute(x, sid, value))
        case ll.LocalScope(s, body, orig):
            return ll.LocalScope(s, _substitute_stmt(body, sid, value), orig)
    return sc


def _substitute_stmt(stmt: ll.LLStmt, sid: ll.ScopeId, value: ll.LLScalar) -> ll.LLStmt:
    out: list[ll.LLStmt] = []
    for s in ll.flatten(stmt):
        match s:
            case ll.ForLoop(body=body):
                out.append(replace(s, body=_substitute_stmt(body, sid, value)))
            case ll.SetLocal(s2, v):
                out.append(ll.SetLocal(s2, _substitute(v, sid, value)))
            case ll.Set(llsc=v):
                out.append(replace(s, llsc=_substitute(v, sid, value)))
            case _:
                out.append(s)
    return ll.seq(*out)


def _local_scope(sid: ll.ScopeId, body: ll.LLStmt, orig, cx: _Ctx) -> ll.LLScalar:
    inner = _Ctx(sid.tn.prec.computed_in, sid.tn, cx.ranges, cx.memo)
    stmts = [s for s in ll.flatten(_stmt(body, cx.ranges, cx.memo))
             if not isinstance(s, ll.Comment)]
    value: ll.LLScalar = ll.Constant(0.0)
    consumed = 0
    for s in stmts:
        if not isinstance(s, ll.SetLocal) or s.id != sid:
            break
        mentioned = sid in _locals_in(s.value, cx.memo.locals)
        if mentioned and _writes_local(s.value, sid):
            break
        uses = sum(1 for x in ll.deep_parts(s.value) if isinstance(x, ll.GetLocal) and x.id == sid) if mentioned else 0
        if uses > 1 and not _cheap(value):
            break
        value = _scalar(_substitute(s.value, sid, value), inner) if uses else s.value
        consumed += 1
    rest = stmts[consumed:]
    if not rest and sid.tn.prec == cx.prec and _combine_prec(cx.prec, value, cx.memo.widest) is cx.prec:
        return value  # no rounding boundary is lost: the value computes in the local's precision
    head = [] if _is_positive_zero(value) else [ll.SetLocal(sid, value)]
    return ll.LocalScope(sid, ll.seq(*head, *rest), orig)
