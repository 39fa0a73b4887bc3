"""Pair elimination: push projections down until they meet pair constructors.

Halide has no pair values, so pairs must go. Projections commute with indicators,
generators and accesses (``π_k [p]e → [p]π_k e``, ``π_k ⊞_i e → ⊞_i π_k e``,
``π_k e[i] → (π_k e)[i]``) and cancel against pairs (``π_k (e0,e1) → e_k``). A let whose
value holds pairs is split along the array-of-structs to struct-of-arrays view of its
type (``[n](A,B) ≅ ([n]A,[n]B)``): one pair-free binding per leaf, named after its path
(``c3_00``, ``c3_01``, ``c3_1``), and the variable becomes a tree of pairs of the new
variables, so every projection of it cancels. Functions whose arguments or result
contain pairs are refused: eliminating them would change the function's type.
"""

from __future__ import annotations

from einjit.errors import EinjitError

from .index import subst_index, subst_pred
from .ir import (
    Access,
    Add,
    Const,
    Expr,
    Gen,
    Index,
    Indicate,
    IVar,
    Let,
    Mul,
    Pair,
    Proj,
    Sum,
    Sym,
    TBool,
    TError,
    TNum,
    TPair,
    TTensor,
    Type,
    Var,
    as_sym,
    tensor_typ,
    typ_of,
)
from .typecheck import TypedFunc

__all__ = ["PairError", "typ_has_pairs", "typ_soa_transform", "eliminate_pairs"]


class PairError(EinjitError, TypeError):
    """A function whose interface has pairs cannot be compiled."""


def typ_has_pairs(t: Type) -> bool:
    match t:
        case TPair():
            return True
        case TTensor(_, sub):
            return typ_has_pairs(sub)
    return False


def typ_soa_transform(t: Type, ranges: tuple[int, ...] = ()) -> Type:
    """Move every tensor dimension below the pairs: ``[3](R,R)`` becomes ``([3]R,[3]R)``."""
    match t:
        case TTensor(rng, sub):
            return typ_soa_transform(sub, ranges + (rng,))
        case TPair(lhs, rhs):
            return TPair(typ_soa_transform(lhs, ranges), typ_soa_transform(rhs, ranges))
        case TNum() | TBool() | TError():
            for rng in reversed(ranges):
                t = TTensor(rng, t)
            return t
    raise TypeError(f"not an ATL type: {t!r}")


def eliminate_pairs(tf: TypedFunc) -> TypedFunc:
    """The same function with no ``Pair`` or ``Proj`` left (raises ``PairError`` when
    its arguments or result contain pairs)."""
    if typ_has_pairs(tf.ret_type):
        raise PairError("Cannot eliminate pairs from a function whose return type is "
                        f"a pair: {tf.ret_type}")
    for sym, typ in tf.args:
        if typ_has_pairs(typ):
            raise PairError("Cannot eliminate pairs from a function with pair-typed "
                            f"arguments: '{sym}' : {typ}")
    return TypedFunc(tf.args, _Eliminator().push(tf.body, ()))


class _Eliminator:
    """Projections travel as a stack: the last entry is applied first."""

    def __init__(self) -> None:
        self.values: dict[Sym, Expr] = {}    # let variables -> trees of pair-free vars
        self.indices: dict[Sym, Index] = {}  # binders copied on the way down

    def idx(self, ix: Index) -> Index:
        return subst_index(ix, self.indices)

    def push(self, e: Expr, projs: tuple[int, ...]) -> Expr:
        match e:
            case Var(name):
                sub = self.values.get(as_sym(name))
                if sub is None:
                    assert not projs, f"projection of a pair-free variable {name!r}"
                    return e
                return self.push(sub, projs)
            case Const():
                return e
            case Add(lhs, rhs, typ) | Mul(lhs, rhs, typ):
                return type(e)(self.push(lhs, ()), self.push(rhs, ()), typ)
            case Pair(lhs, rhs):
                assert projs, "a pair survived in a pair-free position"
                return self.push(rhs if projs[-1] else lhs, projs[:-1])
            case Proj(k, arg):
                return self.push(arg, projs + (k,))
            case Gen(i, rng, body) | Sum(i, rng, body):
                # the same binder may be pushed through more than once (one copy per
                # let leaf), and each copy must own its symbol
                fresh = as_sym(i).copy()
                self.indices[as_sym(i)] = IVar(fresh)
                b = self.push(body, projs)
                typ = TTensor(rng, typ_of(b)) if isinstance(e, Gen) else b.typ
                return type(e)(fresh, rng, b, typ)
            case Access(base, ix):
                b = self.push(base, projs)
                return Access(b, self.idx(ix), tensor_typ(b).typ)
            case Indicate(p, body):
                b = self.push(body, projs)
                q = subst_pred(p, self.indices)
                return b if q is None else Indicate(q, b, b.typ)
            case Let(name, rhs, body):
                return self.let(as_sym(name), rhs, body, projs)
        raise TypeError(f"not an ATL expression: {e!r}")

    def let(self, name: Sym, rhs: Expr, body: Expr, projs: tuple[int, ...]) -> Expr:
        soa = typ_soa_transform(typ_of(rhs))
        binds: list[tuple[Sym, Expr]] = []

        def unpack(label: str, t: Type, path: tuple[int, ...]) -> Expr:
            if isinstance(t, TPair):
                lhs = unpack(label + "0", t.lhs, (0,) + path)
                rhs_ = unpack(label + "1", t.rhs, (1,) + path)
                return Pair(lhs, rhs_, t)
            value = self.push(rhs, path)
            sym = Sym(label)
            binds.append((sym, value))
            return Var(sym, value.typ)

        tree = unpack(name.name + ("_" if isinstance(soa, TPair) else ""), soa, ())
        self.values[name] = tree
        b = self.push(body, projs)
        for sym, value in reversed(binds):
            b = Let(sym, value, b, b.typ)
        return b
