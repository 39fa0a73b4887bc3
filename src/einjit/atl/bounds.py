"""Proof that a guarded affine index stays inside its tensor.

ATL's extents are static, so whether `x[i+1]` can leave `x` under a guard is a question about
affine inequalities over the index variables, decided before any backend runs. A guard is
turned into the inequalities it implies (in disjunctive form: each alternative a
conjunction), the binders add `0 <= v < range`, and the index leaving the tensor on one side
(`ix <= -1` or `ix >= extent`) is added to each alternative: the index stays inside when every
such system has no solution. Fourier–Motzkin elimination decides that over the rationals,
which is sound for integers (no rational solution, no integer one); integer tightening of
each derived inequality (dividing by the coefficients' gcd and rounding the constant)
recovers the integer cases that guards like `i < 3` need.

What a predicate implies: a comparison its inequality (`a < b` as `a - b + 1 <= 0`); a
relation test that its indices lie in the relation's extents (a tuple outside is not a
member); `and`, `or` and `not` by their logic. A guard whose form grows beyond
`MAX_ALTERNATIVES` alternatives implies nothing, and an access under it is refused.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .index import to_affine
from .ir import And, Eq, IConst, Index, Le, Lt, Ne, Not, Or, Pred, Rel

__all__ = ["Inequality", "Alternatives", "implied", "stays_inside", "variables", "MAX_ALTERNATIVES"]

#: `sum(coeff * var) + const <= 0`.
Inequality = tuple[tuple[tuple[Any, int], ...], int]
#: A disjunction of conjunctions of inequalities; `[[]]` is "true", `[]` is "false".
Alternatives = list[list[Inequality]]

#: Beyond this many alternatives a guard is taken to imply nothing.
MAX_ALTERNATIVES = 64
#: Beyond this many inequalities during an elimination, the system is taken as feasible.
_MAX_INEQUALITIES = 4096


def _ineq(terms: Mapping[Any, int], const: int) -> Inequality:
    """`terms + const <= 0`, normalized: sorted terms, integer tightening."""
    kept = {v: c for v, c in terms.items() if c}
    g = math.gcd(*kept.values()) if kept else 0
    if g > 1:
        kept = {v: c // g for v, c in kept.items()}
        const = -((-const) // g)  # ceil(const / g): the tightest integer bound
    return tuple(sorted(kept.items(), key=lambda vc: str(vc[0]))), const


def _le(a: Index, b: Index, plus: int = 0) -> Inequality:
    """`a + plus <= b`."""
    (at, ac), (bt, bc) = to_affine(a), to_affine(b)
    terms = dict(at)
    for v, c in bt.items():
        terms[v] = terms.get(v, 0) - c
    return _ineq(terms, ac - bc + plus)


def _and(xs: Alternatives, ys: Alternatives) -> Alternatives:
    out = [x + y for x, y in itertools.product(xs, ys)]
    return out if len(out) <= MAX_ALTERNATIVES else [[]]


def _or(xs: Alternatives, ys: Alternatives) -> Alternatives:
    out = xs + ys
    return out if len(out) <= MAX_ALTERNATIVES else [[]]


def implied(p: Pred, extents: Mapping[Any, tuple[int, ...]], negated: bool = False) -> Alternatives:
    """The inequalities `p` (or `not p`) implies; `extents` gives each relation's dims."""
    match p:
        case Lt(a, b):
            return [[_le(b, a)]] if negated else [[_le(a, b, 1)]]
        case Le(a, b):
            return [[_le(b, a, 1)]] if negated else [[_le(a, b)]]
        case Eq(a, b) | Ne(a, b) if isinstance(p, Eq) != negated:
            return [[_le(a, b), _le(b, a)]]
        case Eq(a, b) | Ne(a, b):
            return [[_le(a, b, 1)], [_le(b, a, 1)]]
        case Rel(rel, args) if not negated and rel in extents:
            return [[ineq for a, d in zip(args, extents[rel], strict=True)
                     for ineq in (_le(IConst(0), a), _le(a, IConst(d - 1)))]]
        case And(lhs, rhs):
            combine = _or if negated else _and
            return combine(implied(lhs, extents, negated), implied(rhs, extents, negated))
        case Or(lhs, rhs):
            combine = _and if negated else _or
            return combine(implied(lhs, extents, negated), implied(rhs, extents, negated))
        case Not(arg):
            return implied(arg, extents, not negated)
    return [[]]


def variables(alternatives: Alternatives) -> set:
    """The index variables the inequalities mention."""
    return {v for conj in alternatives for terms, _ in conj for v, _ in terms}


def _infeasible(system: list[Inequality]) -> bool:
    """True when no rational point satisfies every inequality (Fourier–Motzkin)."""
    current = set(system)
    while True:
        if any(not terms and const > 0 for terms, const in current):
            return True
        variables = {v for terms, _ in current for v, _ in terms}
        if not variables:
            return False
        var = min(variables, key=lambda v: _pairs(current, v))
        lower: list[tuple[dict[Any, int], int, int]] = []
        upper: list[tuple[dict[Any, int], int, int]] = []
        derived: set[Inequality] = set()
        for ineq in current:
            c = dict(ineq[0]).get(var, 0)
            if c == 0:
                derived.add(ineq)
            else:
                (upper if c > 0 else lower).append((dict(ineq[0]), ineq[1], c))
        for (ut, uc, ucoef), (lt, lc, lcoef) in itertools.product(upper, lower):
            combined = {v: -lcoef * ut.get(v, 0) + ucoef * lt.get(v, 0) for v in set(ut) | set(lt)}
            combined.pop(var, None)
            derived.add(_ineq(combined, -lcoef * uc + ucoef * lc))
        if len(derived) > _MAX_INEQUALITIES:
            return False
        current = derived


def _pairs(system: set[Inequality], var: Any) -> int:
    pos = sum(1 for terms, _ in system if dict(terms).get(var, 0) > 0)
    neg = sum(1 for terms, _ in system if dict(terms).get(var, 0) < 0)
    return pos * neg - pos - neg


def stays_inside(ix: Index, extent: int, guards: Sequence[Alternatives], ranges: Mapping[Any, int]) -> bool:
    """Whether `0 <= ix < extent` follows from the enclosing guards (all of them hold) and
    the binders' ranges."""
    alternatives: Alternatives = [[]]
    for g in guards:
        alternatives = [x + y for x, y in itertools.product(alternatives, g)]
        if len(alternatives) > MAX_ALTERNATIVES:
            return False
    terms, const = to_affine(ix)
    for conj in alternatives:
        variables = set(terms) | {v for ineq in conj for v, _ in ineq[0]}
        if any(v not in ranges for v in variables):
            return False
        box = [ineq for v in variables for ineq in (_ineq({v: -1}, 0), _ineq({v: 1}, 1 - ranges[v]))]
        below = _ineq(terms, const + 1)  # ix <= -1
        above = _ineq({v: -c for v, c in terms.items()}, extent - const)  # ix >= extent
        if not (_infeasible([*conj, *box, below]) and _infeasible([*conj, *box, above])):
            return False
    return True
