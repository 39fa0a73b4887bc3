"""Gen normalization: every statement becomes generators around a generator-free body.

A statement compiles to one pure Halide definition ``f(i, j, ...) = e`` only when all
its ``Gen``s sit at the top. Generators are lifted out of the term by β-reducing
accesses to them, ``(⊞_i e)[j] → {i ↦ j}e``, and by moving indicators inside them,
``[p]·⊞_i e → ⊞_i [p]·e``. Indicators travel outwards together with the generators as
far as they can: out of products and accesses, and out of a sum whose index they do
not mention; ``Σ_i [i=e]·b`` collapses to ``{i ↦ e}b``. With affine indices the
collapse also solves ``[j = i+1]`` for ``i``, and adds the range guards
``[0 <= e][e < n]`` that the index ranges do not already imply.

Finally a body that is still a tensor (a bare variable, possibly indexed) is
η-expanded, so each statement's body is a number.
"""

from __future__ import annotations

from .index import mentions, range_guards, solve_for, subst_pred
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
    Pred,
    Proj,
    Sum,
    Sym,
    TTensor,
    Var,
    as_sym,
    typ_of,
)
from .lets import from_block, to_block
from .rewrite import subst_indices
from .typecheck import TypedFunc

__all__ = ["gen_normalize", "normalize_statement"]

Gens = list[tuple[Sym, int]]  # innermost first: the last entry is the outermost Gen


def gen_normalize(tf: TypedFunc) -> TypedFunc:
    """Normalize each statement of a let-flattened, pair-free function."""
    binds, ret = to_block(tf.body)
    stmts = [(name, normalize_statement(rhs)) for name, rhs in binds]
    return TypedFunc(tf.args, from_block(stmts, normalize_statement(ret)))


def normalize_statement(e: Expr) -> Expr:
    """``Gen(i1) ... Gen(ik) [p1]*...*[pm]*body`` with ``body`` a Gen-free number."""
    gens, inds, body = _lift(e, {})
    eta: Gens = []
    while isinstance(body.typ, TTensor):
        k = Sym(f"k{len(eta)}")
        eta.append((k, body.typ.range))
        body = Access(body, IVar(k), body.typ.typ)
    body = _wrap(inds, body)
    for i, rng in reversed(eta):
        body = Gen(i, rng, body, TTensor(rng, typ_of(body)))
    for i, rng in gens:
        body = Gen(i, rng, body, TTensor(rng, typ_of(body)))
    return body


def _wrap(inds: list[Pred], e: Expr) -> Expr:
    for p in inds:
        e = Indicate(p, e, e.typ)
    return e


def _subst_all(inds: list[Pred], body: Expr, sub: dict) -> tuple[list[Pred], Expr]:
    kept = [q for q in (subst_pred(p, sub) for p in inds) if q is not None]
    return kept, subst_indices(body, sub)


def _lift(e: Expr, ranges: dict[Sym, int]) -> tuple[Gens, list[Pred], Expr]:
    """Split ``e`` into the generators and indicators lifted out of it, and the rest."""
    match e:
        case Var() | Const():
            return [], [], e
        case Add(lhs, rhs, typ):
            _, li, left = _lift(lhs, ranges)
            _, ri, right = _lift(rhs, ranges)
            return [], [], Add(_wrap(li, left), _wrap(ri, right), typ)
        case Mul(lhs, rhs, typ):
            _, li, left = _lift(lhs, ranges)
            _, ri, right = _lift(rhs, ranges)
            return [], li + ri, Mul(left, right, typ)
        case Gen(i, rng, body):
            gens, inds, b = _lift(body, {**ranges, as_sym(i): rng})
            return gens + [(as_sym(i), rng)], inds, b
        case Sum(i, rng, body, typ):
            _, inds, b = _lift(body, {**ranges, as_sym(i): rng})
            for n, p in enumerate(inds):
                target = solve_for(p, i)
                if target is not None:
                    rest = inds[:n] + inds[n + 1:]
                    kept, b = _subst_all(rest, b, {i: target})
                    return [], kept + range_guards(target, rng, ranges), b
            inside = [p for p in inds if mentions(p, i)]
            outside = [p for p in inds if not mentions(p, i)]
            return [], outside, Sum(i, rng, _wrap(inside, b), typ)
        case Access(base, idx, typ):
            gens, inds, b = _lift(base, ranges)
            if gens:
                i, _ = gens.pop()
                inds, b = _subst_all(inds, b, {i: idx})
                return gens, inds, b
            return gens, inds, Access(b, idx, typ)
        case Indicate(pred, body):
            gens, inds, b = _lift(body, ranges)
            return gens, inds + [pred], b
        case Let() | Pair() | Proj():
            raise ValueError(f"gen_normalize needs a let-flattened, pair-free program, "
                             f"found {type(e).__name__}")
    raise TypeError(f"not an ATL expression: {e!r}")
