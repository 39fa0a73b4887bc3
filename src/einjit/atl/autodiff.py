"""Derivatives of ATL functions, as ATL functions.

``deriv`` is forward mode: each term is paired with its tangent by the usual rules
(``D[e0·e1] = D[e0]·e1 + e0·D[e1]``, ``D[Σ_i e] = Σ_i D[e]``, ``D[⊞_i e] = ⊞_i D[e]``,
``D[e[i]] = D[e][i]``, ``D[[p]e] = [p]D[e]``, pairs component-wise, and a let binds
its value's tangent beside it).

``adjoint`` is reverse mode, the transpose of ``deriv``. The program is first made
pair-free and let-flattened, so every variable is bound at the top. A cotangent then
flows down each term, keeping the indices of the binders it passed (the context):
through a generator it is indexed (``ḡ[i]``), through an access it is spread back
(``⊞_j [j=ix]·ḡ``), through a product it is scaled by the other factor. At a variable
the contributions are summed over the context, and the statements are visited last
to first. The indicator sums this produces (``Σ_i [j=i]·...``) collapse in gen
normalization, so the adjoint of a gather is a plain read again.

Both return ordinary ``Func``s that go through every pass and backend.
"""

from __future__ import annotations

from typing import Sequence

from .func import Func
from .ir import (
    Access,
    Add,
    Const,
    Eq,
    Expr,
    Gen,
    Indicate,
    IVar,
    Let,
    Mul,
    Pair,
    Proj,
    R,
    Sum,
    Sym,
    TNum,
    Type,
    Var,
    as_sym,
    tensor_shape,
    tensor_typ,
    typ_of,
)
from .lets import from_block, lift_lets, to_block
from .pairs import eliminate_pairs
from .rewrite import is_zero, zero
from .typecheck import is_relation_type

__all__ = ["deriv", "adjoint", "grad"]


def _add(a: Expr, b: Expr) -> Expr:
    if is_zero(a):
        return b
    if is_zero(b):
        return a
    return Add(a, b)


def _is_one(e: Expr) -> bool:
    return isinstance(e, Const) and e.val == 1.0


def _mul(a: Expr, b: Expr) -> Expr:
    if is_zero(a) or is_zero(b):
        return Const(0.0, R)
    if _is_one(a):
        return b
    if _is_one(b):
        return a
    return Mul(a, b)


def _fresh_name(base: str, taken: set[str]) -> str:
    name = base
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _differentiable(f: Func, wrt: Sequence[str] | None) -> list[int]:
    """Positions of the arguments to differentiate with respect to."""
    if wrt is None:
        return [k for k, t in enumerate(f.arg_types) if not is_relation_type(t)]
    out = []
    for name in wrt:
        if name not in f.arg_names:
            raise ValueError(f"'{name}' is not an argument of this function")
        k = f.arg_names.index(name)
        if is_relation_type(f.arg_types[k]):
            raise ValueError(f"cannot differentiate with respect to the relation '{name}'")
        out.append(k)
    return out


# ----------------------------------------------------------------------- forward mode

def deriv(f: Func, wrt: Sequence[str] | None = None) -> Func:
    """``Func(*args, *tangents)`` computing the directional derivative of ``f``.

    One tangent argument ``d<name>`` (same type) per argument in ``wrt`` (default: all
    but relations), appended after the original arguments.
    """
    taken = set(f.arg_names)
    tangents: dict[Sym, Expr] = {}
    extra = []
    for k in _differentiable(f, wrt):
        sym, typ = f.typed.args[k]
        dsym = Sym(_fresh_name("d" + str(sym), taken))
        tangents[sym] = Var(dsym, typ)
        extra.append((dsym, typ))
    body = _forward(f.typed.body, tangents)
    return Func(list(f.typed.args) + extra, body)


def _forward(e: Expr, tan: dict[Sym, Expr]) -> Expr:
    match e:
        case Var(name, typ):
            return tan.get(as_sym(name)) or zero(typ_of(e))
        case Const():
            return Const(0.0, R)
        case Add(lhs, rhs):
            return _add(_forward(lhs, tan), _forward(rhs, tan))
        case Mul(lhs, rhs):
            return _add(_mul(_forward(lhs, tan), rhs), _mul(lhs, _forward(rhs, tan)))
        case Pair(lhs, rhs, typ):
            return Pair(_forward(lhs, tan), _forward(rhs, tan), typ)
        case Proj(idx, arg, typ):
            return Proj(idx, _forward(arg, tan), typ)
        case Gen(i, rng, body, typ) | Sum(i, rng, body, typ):
            d = _forward(body, tan)
            return zero(typ_of(e)) if is_zero(d) else type(e)(i, rng, d, typ)
        case Access(base, idx, typ):
            d = _forward(base, tan)
            return zero(typ_of(e)) if is_zero(d) else Access(d, idx, typ)
        case Indicate(pred, body, typ):
            d = _forward(body, tan)
            return zero(typ_of(e)) if is_zero(d) else Indicate(pred, d, typ)
        case Let(name, rhs, body):
            dsym = Sym("d" + as_sym(name).name)
            inner = _forward(body, {**tan, as_sym(name): Var(dsym, rhs.typ)})
            return Let(name, rhs, Let(dsym, _forward(rhs, tan), inner))
    raise TypeError(f"not an ATL expression: {e!r}")


# ----------------------------------------------------------------------- reverse mode

def adjoint(f: Func, wrt: str, dout: str = "dout") -> Func:
    """``Func(*args, dout)`` giving the cotangent of argument ``wrt``: the transpose of
    ``deriv(f, [wrt])`` applied to ``dout`` (same type as ``f``'s result)."""
    k = _differentiable(f, [wrt])[0]
    dsym = Sym(_fresh_name(dout, set(f.arg_names)))
    body = _reverse(f, k, Var(dsym, f.ret_type))
    return Func(list(f.typed.args) + [(dsym, f.ret_type)], body)


def grad(f: Func, wrt: str) -> Func:
    """The gradient of a scalar-valued ``f`` with respect to ``wrt``, as a ``Func`` of
    the same arguments."""
    if not isinstance(f.ret_type, TNum):
        raise TypeError(f"grad needs a function with result R, not {f.ret_type}; "
                        f"use adjoint for other results")
    k = _differentiable(f, [wrt])[0]
    return Func(list(f.typed.args), _reverse(f, k, Const(1.0, R)))


def _reverse(f: Func, k: int, seed: Expr) -> Expr:
    tf = lift_lets(eliminate_pairs(f.typed))
    binds, ret = to_block(tf.body)
    back = _Backprop()
    back.visit(ret, seed, ())
    adjoints = []
    for name, rhs in reversed(binds):
        parts = back.contributions.pop(name, [])
        if not parts:
            continue
        bar = Sym(name.name + "_bar")
        adjoints.append((bar, back.total(parts, typ_of(rhs))))
        back.visit(rhs, Var(bar, rhs.typ), ())
    sym, typ = tf.args[k]
    parts = back.contributions.get(sym, [])
    result = back.total(parts, typ) if parts else zero(typ)
    return from_block(binds + adjoints, result)


def _indexed_at(e: Expr, gens: list[tuple[Sym, int]]) -> Expr:
    for j, _ in gens:
        e = Access(e, IVar(j))
    return e


def _wrap_gens(gens: list[tuple[Sym, int]], e: Expr) -> Expr:
    for j, n in reversed(gens):
        e = Gen(j, n, e)
    return e


class _Backprop:
    def __init__(self) -> None:
        self.contributions: dict[Sym, list[Expr]] = {}
        self._count = 0

    def fresh(self) -> Sym:
        """A new index, numbered so that printed adjoints stay readable."""
        self._count += 1
        return Sym(f"j{self._count}")

    def indexed(self, e: Expr, typ: Type) -> tuple[list[tuple[Sym, int]], Expr]:
        """Fresh generator indices over ``typ``'s dimensions and ``e`` read at them."""
        gens = [(self.fresh(), n) for n in tensor_shape(typ)[0]]
        return gens, _indexed_at(e, gens)

    def total(self, parts: list[Expr], typ: Type) -> Expr:
        """The sum of same-typed contributions (element-wise for tensors)."""
        if len(parts) == 1:
            return parts[0]
        gens, acc = self.indexed(parts[0], typ)
        for p in parts[1:]:
            acc = Add(acc, _indexed_at(p, gens))
        return _wrap_gens(gens, acc)

    def visit(self, e: Expr, g: Expr, ctx: tuple[tuple[Sym, int], ...]) -> None:
        """Send cotangent ``g`` (an expression over the indices in ``ctx``) into ``e``."""
        if is_zero(g):
            return
        match e:
            case Var(name):
                gens, body = self.indexed(g, typ_of(e))
                for i, n in reversed(ctx):
                    body = Sum(i, n, body)
                self.contributions.setdefault(as_sym(name), []).append(_wrap_gens(gens, body))
            case Const():
                pass
            case Add(lhs, rhs):
                self.visit(lhs, g, ctx)
                self.visit(rhs, g, ctx)
            case Mul(lhs, rhs):
                self.visit(lhs, _mul(g, rhs), ctx)
                self.visit(rhs, _mul(lhs, g), ctx)
            case Sum(i, rng, body):
                self.visit(body, g, ctx + ((i, rng),))
            case Gen(i, rng, body):
                self.visit(body, Access(g, IVar(i)), ctx + ((i, rng),))
            case Access(base, idx):
                j = self.fresh()
                spread = Gen(j, tensor_typ(base).range, Indicate(Eq(IVar(j), idx), g))
                self.visit(base, spread, ctx)
            case Indicate(pred, body):
                self.visit(body, Indicate(pred, g), ctx)
            case _:
                raise TypeError(f"unexpected term in a let-flattened program: {e!r}")
