"""Let flattening: pull every binding up to the top, making the program a block.

Halide statements live at the top level, so a binding under a ``Gen`` or ``Sum`` must
be closed over that binder's index: ``Σ_i let x = e1 in e2`` becomes
``let x = ⊞_i e1 in Σ_i {x ↦ x[i]}e2``. Bindings pass through ``+``, ``*`` and accesses
unchanged, and a binding in a let's right-hand side goes first.

One departure from the notebook, for safety: a binding lifted out of an indicator
keeps the indicator (``[p](let x = e1 in e2)`` becomes ``let x = [p]e1 in [p]e2``).
Without it, a read that was guarded (``[i+1<n] x[i+1]``) would run unguarded at the
top level and fall outside its tensor.
"""

from __future__ import annotations

from .ir import (
    Access,
    Add,
    Const,
    Expr,
    Gen,
    Indicate,
    IVar,
    Let,
    Mul,
    Pair,
    Proj,
    Sum,
    Sym,
    TTensor,
    Var,
    as_sym,
    typ_of,
)
from .rewrite import subst_indices, subst_vars
from .typecheck import TypedFunc

__all__ = ["lift_lets", "to_block", "from_block"]

Binds = list[tuple[Sym, Expr]]


def lift_lets(tf: TypedFunc) -> TypedFunc:
    """The same function as ``let x1 = e1 in ... let xn = en in e`` with no lets inside
    the ``e``s. Pairs must have been eliminated first."""
    binds, ret = _lift(tf.body)
    return TypedFunc(tf.args, from_block(binds, ret))


def to_block(e: Expr) -> tuple[Binds, Expr]:
    """Split a let chain into its bindings and its final expression."""
    binds: Binds = []
    while isinstance(e, Let):
        binds.append((as_sym(e.name), e.rhs))
        e = e.body
    return binds, e


def from_block(binds: Binds, ret: Expr) -> Expr:
    for name, rhs in reversed(binds):
        ret = Let(name, rhs, ret, ret.typ)
    return ret


def _lift(e: Expr) -> tuple[Binds, Expr]:
    match e:
        case Var() | Const():
            return [], e
        case Add(lhs, rhs, typ) | Mul(lhs, rhs, typ):
            lb, left = _lift(lhs)
            rb, right = _lift(rhs)
            return lb + rb, type(e)(left, right, typ)
        case Gen(i, rng, body, typ) | Sum(i, rng, body, typ):
            binds, b = _lift(body)
            closed: Binds = []
            env: dict[Sym, Expr] = {}
            for name, rhs in binds:
                # earlier bindings already became tensors over i
                rhs = subst_vars(rhs, env)
                fresh = as_sym(i).copy()
                tensor = TTensor(rng, typ_of(rhs))
                closed.append((name, Gen(fresh, rng,
                                         subst_indices(rhs, {as_sym(i): IVar(fresh)}), tensor)))
                env[name] = Access(Var(name, tensor), IVar(i), rhs.typ)
            return closed, type(e)(i, rng, subst_vars(b, env), typ)
        case Access(base, idx, typ):
            binds, b = _lift(base)
            return binds, Access(b, idx, typ)
        case Indicate(pred, body, typ):
            binds, b = _lift(body)
            guarded: Binds = [(name, Indicate(pred, rhs, rhs.typ)) for name, rhs in binds]
            return guarded, Indicate(pred, b, typ)
        case Let(name, rhs, body):
            rb, r = _lift(rhs)
            bb, b = _lift(body)
            return rb + [(name, r)] + bb, b
        case Pair() | Proj():
            raise ValueError("lift_lets needs a pair-free program: run eliminate_pairs first")
    raise TypeError(f"not an ATL expression: {e!r}")
