"""The reference interpreter: slow, direct, and the oracle for every pass and backend.

Values are Python floats, nested lists and tuples (pairs). Sums add left to right from
``0.0``, so results match plain Python arithmetic bit for bit. An indicator whose
predicate is false yields zero without evaluating its body, which is what makes a
guarded out-of-range read (``[i+1<n]*x[i+1]``) safe; an unguarded one raises
``IndexError`` instead of wrapping around as NumPy's negative indices would. A relation
contains no tuple outside its extents.
"""

from __future__ import annotations

from typing import Any, Sequence

from .index import eval_index
from .ir import (
    Access,
    Add,
    And,
    Const,
    Eq,
    Expr,
    Gen,
    Indicate,
    Le,
    Let,
    Lt,
    Mul,
    Ne,
    Not,
    Or,
    Pair,
    Pred,
    Proj,
    Rel,
    Sum,
    TNum,
    TPair,
    TTensor,
    Type,
    Var,
    tensor_typ,
    typ_of,
)
from .typecheck import TypedFunc

__all__ = ["interpret", "zero_value"]


def zero_value(t: Type) -> Any:
    match t:
        case TNum():
            return 0.0
        case TTensor(rng, sub):
            return [zero_value(sub) for _ in range(rng)]
        case TPair(lhs, rhs):
            return (zero_value(lhs), zero_value(rhs))
    raise TypeError(f"no value of type {t}")


def interpret(tf: TypedFunc, args: Sequence[Any]) -> Any:
    """Evaluate ``tf`` on Python values given in argument order."""
    if len(args) != len(tf.args):
        raise TypeError(f"expected {len(tf.args)} arguments, but was called with {len(args)}")
    env = {sym: val for (sym, _), val in zip(tf.args, args, strict=True)}
    return _eval(tf.body, env)


def _eval(e: Expr, env: dict) -> Any:
    match e:
        case Var(name):
            return env[name]
        case Const(val):
            return val
        case Add(lhs, rhs):
            return _eval(lhs, env) + _eval(rhs, env)
        case Mul(lhs, rhs):
            return _eval(lhs, env) * _eval(rhs, env)
        case Pair(lhs, rhs):
            return (_eval(lhs, env), _eval(rhs, env))
        case Proj(idx, arg):
            return _eval(arg, env)[idx]
        case Gen(i, rng, body):
            return [_bound(i, k, body, env) for k in range(rng)]
        case Sum(i, rng, body):
            acc = 0.0
            for k in range(rng):
                acc += _bound(i, k, body, env)
            return acc
        case Access(base, idx):
            k = eval_index(idx, env)
            rng = tensor_typ(base).range
            if not 0 <= k < rng:
                raise IndexError(f"index {idx} = {k} is outside [0, {rng}) in {e}; "
                                 f"guard the read with an indicator")
            if isinstance(base, Gen):
                return _bound(base.idx, k, base.body, env)
            return _eval(base, env)[k]
        case Indicate(pred, body):
            return _eval(body, env) if _holds(pred, env) else zero_value(typ_of(e))
        case Let(name, rhs, body):
            env[name] = _eval(rhs, env)
            return _eval(body, env)
    raise TypeError(f"not an ATL expression: {e!r}")


def _bound(i, k: int, body: Expr, env: dict) -> Any:
    """Evaluate ``body`` with index ``i`` set to ``k``, restoring any outer binding
    (a rewrite may reuse a binder's symbol in disjoint places)."""
    saved = env.get(i, _bound)
    env[i] = k
    try:
        return _eval(body, env)
    finally:
        if saved is _bound:
            del env[i]
        else:
            env[i] = saved


def _holds(p: Pred, env: dict) -> bool:
    match p:
        case Eq(l, r):
            return eval_index(l, env) == eval_index(r, env)
        case Ne(l, r):
            return eval_index(l, env) != eval_index(r, env)
        case Lt(l, r):
            return eval_index(l, env) < eval_index(r, env)
        case Le(l, r):
            return eval_index(l, env) <= eval_index(r, env)
        case Rel(rel, args):
            v = env[rel]
            for a in args:
                k = eval_index(a, env)
                if not 0 <= k < len(v):
                    return False
                v = v[k]
            return bool(v)
        case And(l, r):
            return _holds(l, env) and _holds(r, env)
        case Or(l, r):
            return _holds(l, env) or _holds(r, env)
        case Not(arg):
            return not _holds(arg, env)
    raise TypeError(f"not a predicate: {p!r}")
