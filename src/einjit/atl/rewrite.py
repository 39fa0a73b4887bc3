"""Small rewriting tools on the typed IR: rebuilding, substitution, α-equivalence, zeros.

The passes rely on the typechecker's invariant that each binder owns a fresh ``Sym``,
so substitution never needs to rename to avoid capture. α-equivalence is what
"running a pass again changes nothing" means once passes mint fresh symbols.
"""

from __future__ import annotations

from typing import Callable, Mapping

from .index import index_vars, pred_index_vars, subst_index, subst_pred
from .ir import (
    Access,
    Add,
    And,
    Const,
    Eq,
    Expr,
    Gen,
    IAdd,
    IConst,
    IMul,
    Index,
    Indicate,
    IVar,
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
    R,
    Rel,
    Sum,
    Sym,
    TNum,
    TPair,
    TTensor,
    Type,
    Var,
)

__all__ = [
    "map_children", "subst_vars", "subst_indices", "index_vars_of", "alpha_equal", "zero",
    "is_zero",
]


def map_children(e: Expr, f: Callable[[Expr], Expr]) -> Expr:
    """``e`` with ``f`` applied to each direct sub-expression, everything else kept."""
    match e:
        case Var() | Const():
            return e
        case Add(lhs, rhs, typ) | Mul(lhs, rhs, typ) | Pair(lhs, rhs, typ):
            return type(e)(f(lhs), f(rhs), typ)
        case Proj(idx, arg, typ):
            return Proj(idx, f(arg), typ)
        case Gen(i, rng, body, typ) | Sum(i, rng, body, typ):
            return type(e)(i, rng, f(body), typ)
        case Access(base, idx, typ):
            return Access(f(base), idx, typ)
        case Indicate(pred, body, typ):
            return Indicate(pred, f(body), typ)
        case Let(name, rhs, body, typ):
            return Let(name, f(rhs), f(body), typ)
    raise TypeError(f"not an ATL expression: {e!r}")


def subst_vars(e: Expr, sub: Mapping[Sym, Expr]) -> Expr:
    """Replace variables by expressions (of the same type)."""
    if not sub:
        return e
    if isinstance(e, Var):
        return sub.get(e.name, e) if isinstance(e.name, Sym) else e  # a string is no key
    return map_children(e, lambda c: subst_vars(c, sub))


def subst_indices(e: Expr, sub: Mapping[Sym, Index]) -> Expr:
    """Replace index variables in accesses and predicates.

    A predicate that becomes trivially true is dropped with its indicator.
    """
    if not sub:
        return e
    match e:
        case Access(base, idx, typ):
            return Access(subst_indices(base, sub), subst_index(idx, sub), typ)
        case Indicate(pred, body, typ):
            body = subst_indices(body, sub)
            p = subst_pred(pred, sub)
            return body if p is None else Indicate(p, body, typ)
    return map_children(e, lambda c: subst_indices(c, sub))


def index_vars_of(e: Expr) -> set:
    """Index variables read anywhere in ``e`` (bound or free)."""
    out: set = set()

    def walk(x: Expr) -> Expr:
        match x:
            case Access(_, idx):
                out.update(index_vars(idx))
            case Indicate(pred, _):
                out.update(pred_index_vars(pred))
        return map_children(x, walk)

    walk(e)
    return out


# --------------------------------------------------------------------- α-equivalence

def _index_eq(a: Index, b: Index, ren: Mapping) -> bool:
    match a, b:
        case IVar(x), IVar(y):
            return ren.get(x, x) == y
        case IConst(u), IConst(v):
            return u == v
        case IAdd(al, ar), IAdd(bl, br):
            return _index_eq(al, bl, ren) and _index_eq(ar, br, ren)
        case IMul(ac, aa), IMul(bc, ba):
            return ac == bc and _index_eq(aa, ba, ren)
    return False


def _pred_eq(a: Pred, b: Pred, ren: Mapping) -> bool:
    if type(a) is not type(b):
        return False
    match a, b:
        case (Eq(al, ar), Eq(bl, br)) | (Ne(al, ar), Ne(bl, br)) | \
                (Lt(al, ar), Lt(bl, br)) | (Le(al, ar), Le(bl, br)):
            return _index_eq(al, bl, ren) and _index_eq(ar, br, ren)
        case Rel(ar, aa), Rel(br, ba):
            return (ren.get(ar, ar) == br and len(aa) == len(ba)
                    and all(_index_eq(x, y, ren) for x, y in zip(aa, ba, strict=True)))
        case (And(al, ar), And(bl, br)) | (Or(al, ar), Or(bl, br)):
            return _pred_eq(al, bl, ren) and _pred_eq(ar, br, ren)
        case Not(x), Not(y):
            return _pred_eq(x, y, ren)
    return False


def alpha_equal(a: Expr, b: Expr, ren: Mapping | None = None) -> bool:
    """Equal up to the choice of bound symbols (types included)."""
    ren = {} if ren is None else ren
    if type(a) is not type(b) or a.typ != b.typ:
        return False
    match a, b:
        case Var(x), Var(y):
            return ren.get(x, x) == y
        case Const(u), Const(v):
            return u == v
        case (Add(al, ar), Add(bl, br)) | (Mul(al, ar), Mul(bl, br)) | \
                (Pair(al, ar), Pair(bl, br)):
            return alpha_equal(al, bl, ren) and alpha_equal(ar, br, ren)
        case Proj(ai, aa), Proj(bi, ba):
            return ai == bi and alpha_equal(aa, ba, ren)
        case (Gen(ai, an, ab), Gen(bi, bn, bb)) | (Sum(ai, an, ab), Sum(bi, bn, bb)):
            return an == bn and alpha_equal(ab, bb, {**ren, ai: bi})
        case Access(ab, ai), Access(bb, bi):
            return _index_eq(ai, bi, ren) and alpha_equal(ab, bb, ren)
        case Indicate(ap, ab), Indicate(bp, bb):
            return _pred_eq(ap, bp, ren) and alpha_equal(ab, bb, ren)
        case Let(ax, ar, ab), Let(bx, br, bb):
            return alpha_equal(ar, br, ren) and alpha_equal(ab, bb, {**ren, ax: bx})
    return False


# ------------------------------------------------------------------------------ zeros

def zero(t: Type) -> Expr:
    """The typed zero of a (pair-free or not) type."""
    match t:
        case TNum():
            return Const(0.0, R)
        case TTensor(rng, sub):
            return Gen(Sym("_"), rng, zero(sub), t)
        case TPair(lhs, rhs):
            return Pair(zero(lhs), zero(rhs), t)
    raise TypeError(f"no zero of type {t}")


def is_zero(e: Expr) -> bool:
    """A syntactic zero: what ``zero`` builds, possibly indexed or guarded."""
    match e:
        case Const(val):
            return val == 0.0
        case Gen(_, _, body) | Indicate(_, body):
            return is_zero(body)
        case Access(base, _):
            return is_zero(base)
        case Pair(lhs, rhs):
            return is_zero(lhs) and is_zero(rhs)
    return False
