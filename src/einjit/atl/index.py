"""Affine index arithmetic and predicates over indices.

Index expressions are kept as the user wrote them until a rewrite substitutes into
them; the result is then put in a canonical affine form (``j-1+1`` becomes ``j``), so
repeated substitution does not grow them. Intervals over index ranges decide when a
range guard is needed, which keeps the notebook's programs free of guards they do not
need.
"""

from __future__ import annotations

from typing import Any, Mapping, TypeVar

from .ir import (
    And,
    Eq,
    IAdd,
    IConst,
    IMul,
    Index,
    IVar,
    Le,
    Lt,
    Name,
    Ne,
    Not,
    Or,
    Pred,
    Rel,
)

__all__ = [
    "to_affine", "from_affine", "index_vars", "subst_index", "interval", "eval_index",
    "pred_index_vars", "subst_pred", "solve_for", "range_guards", "mentions",
]

_V = TypeVar("_V")

Affine = tuple[dict[Name, int], int]
#: A mapping keyed by names. `Any` keys: the typed passes pass `Sym`-keyed dicts, and a
#: `Mapping[Name, ...]` would not accept those (a mapping's key type is invariant).
NameMap = Mapping[Any, _V]


def to_affine(ix: Index) -> Affine:
    """``(coefficients by variable, constant)``, with zero coefficients dropped."""
    match ix:
        case IVar(name):
            return {name: 1}, 0
        case IConst(val):
            return {}, val
        case IAdd(lhs, rhs):
            lt, lc = to_affine(lhs)
            rt, rc = to_affine(rhs)
            terms = dict(lt)
            for v, c in rt.items():
                terms[v] = terms.get(v, 0) + c
            return {v: c for v, c in terms.items() if c != 0}, lc + rc
        case IMul(coeff, arg):
            t, c = to_affine(arg)
            if coeff == 0:
                return {}, 0
            return {v: coeff * k for v, k in t.items()}, coeff * c
    raise TypeError(f"not an index expression: {ix!r}")


def from_affine(terms: Mapping[Name, int], const: int) -> Index:
    """The canonical expression: terms in their order, the constant last."""
    parts: list[Index] = [IVar(v) if c == 1 else IMul(c, IVar(v))
                          for v, c in terms.items() if c != 0]
    if not parts:
        return IConst(const)
    out = parts[0]
    for p in parts[1:]:
        out = IAdd(out, p)
    return IAdd(out, IConst(const)) if const != 0 else out


def index_vars(ix: Index) -> set:
    match ix:
        case IVar(name):
            return {name}
        case IConst():
            return set()
        case IAdd(lhs, rhs):
            return index_vars(lhs) | index_vars(rhs)
        case IMul(_, arg):
            return index_vars(arg)
    raise TypeError(f"not an index expression: {ix!r}")


def subst_index(ix: Index, sub: NameMap[Index]) -> Index:
    """Replace variables; untouched expressions keep their written form."""
    if isinstance(ix, IVar):
        return sub.get(ix.name, ix)
    if not (index_vars(ix) & sub.keys()):
        return ix
    terms, const = to_affine(ix)
    out: dict[Name, int] = {}
    for v, c in terms.items():
        if v in sub:
            st, sc = to_affine(sub[v])
            const += c * sc
            for w, k in st.items():
                out[w] = out.get(w, 0) + c * k
        else:
            out[v] = out.get(v, 0) + c
    result = from_affine(out, const)
    if isinstance(result, IVar):
        # `t+0` stays affine: as a plain variable it would claim `t`'s range for the whole
        # axis, and a prefix read (`y[t+0]`, t over fewer cells than y has) would no longer typecheck.
        return IAdd(result, IConst(0))
    return result


def interval(ix: Index, ranges: NameMap[int]) -> tuple[int, int] | None:
    """Inclusive bounds of ``ix`` when each variable ``v`` runs over ``[0, ranges[v])``;
    ``None`` when a variable's range is unknown."""
    terms, const = to_affine(ix)
    lo = hi = const
    for v, c in terms.items():
        n = ranges.get(v)
        if n is None:
            return None
        span = c * (n - 1)
        lo += min(0, span)
        hi += max(0, span)
    return lo, hi


def eval_index(ix: Index, env: Mapping[Name, int]) -> int:
    match ix:
        case IVar(name):
            return env[name]
        case IConst(val):
            return val
        case IAdd(lhs, rhs):
            return eval_index(lhs, env) + eval_index(rhs, env)
        case IMul(coeff, arg):
            return coeff * eval_index(arg, env)
    raise TypeError(f"not an index expression: {ix!r}")


def pred_index_vars(p: Pred) -> set:
    match p:
        case Eq(l, r) | Ne(l, r) | Lt(l, r) | Le(l, r):
            return index_vars(l) | index_vars(r)
        case Rel(_, args):
            return set().union(*(index_vars(a) for a in args))
        case And(l, r) | Or(l, r):
            return pred_index_vars(l) | pred_index_vars(r)
        case Not(arg):
            return pred_index_vars(arg)
    raise TypeError(f"not a predicate: {p!r}")


def mentions(p: Pred, name: Name) -> bool:
    return name in pred_index_vars(p)


def _difference(a: Index, b: Index) -> Affine:
    lt, lc = to_affine(a)
    rt, rc = to_affine(b)
    terms = dict(lt)
    for v, c in rt.items():
        terms[v] = terms.get(v, 0) - c
    return {v: c for v, c in terms.items() if c != 0}, lc - rc


def _decide(p: Pred) -> bool | None:
    """The truth of a comparison whose sides differ by a constant, else ``None``."""
    match p:
        case Eq(l, r) | Ne(l, r) | Lt(l, r) | Le(l, r):
            terms, d = _difference(l, r)
            if terms:
                return None
            return {Eq: d == 0, Ne: d != 0, Lt: d < 0, Le: d <= 0}[type(p)]
    return None


def subst_pred(p: Pred, sub: NameMap[Index]) -> Pred | None:
    """Substitute into a predicate; ``None`` means it became trivially true (so the
    indicator can be dropped, as the notebook drops ``[j=j]``)."""
    if not (pred_index_vars(p) & sub.keys()):
        return p
    match p:
        case Eq(l, r) | Ne(l, r) | Lt(l, r) | Le(l, r):
            q = type(p)(subst_index(l, sub), subst_index(r, sub))
            return None if _decide(q) is True else q
        case Rel(rel, args):
            return Rel(rel, *(subst_index(a, sub) for a in args))
        case And(l, r):
            ls, rs = subst_pred(l, sub), subst_pred(r, sub)
            if ls is None or rs is None:
                return rs if ls is None else ls
            return And(ls, rs)
        case Or(l, r):
            ls, rs = subst_pred(l, sub), subst_pred(r, sub)
            return None if ls is None or rs is None else Or(ls, rs)
        case Not(arg):
            a = subst_pred(arg, sub)
            return Lt(IConst(0), IConst(0)) if a is None else Not(a)
    raise TypeError(f"not a predicate: {p!r}")


def solve_for(p: Pred, name: Name) -> Index | None:
    """For ``[a = b]`` in which ``name`` has coefficient ±1, the expression it equals."""
    if not isinstance(p, Eq):
        return None
    terms, d = _difference(p.lhs, p.rhs)
    c = terms.pop(name, 0)
    if c not in (1, -1):
        return None
    # c*name + rest + d = 0  =>  name = -(rest + d)/c = -c*(rest + d)
    return from_affine({v: -c * k for v, k in terms.items()}, -c * d)


def range_guards(ix: Index, n: int, ranges: NameMap[int]) -> list[Pred]:
    """Predicates that keep ``ix`` inside ``[0, n)``, leaving out those the variables'
    ranges already imply."""
    box = interval(ix, ranges)
    guards: list[Pred] = []
    if box is None or box[0] < 0:
        guards.append(Le(IConst(0), ix))
    if box is None or box[1] >= n:
        guards.append(Lt(ix, IConst(n)))
    return guards
