"""A tiny loop evaluator of projections: the oracle for projection inference tests.

It iterates the product space and accumulates `lhs[project_lhs] += rhs1[project_rhs1] * ...`,
the way generated code runs an accumulating assignment.
"""

import itertools
import math

import numpy as np

from einjit.ir.indexing import Affine, FixedIdx, Iterator, Projections


def index_value(idx, env):
    match idx:
        case FixedIdx(i):
            return i
        case Iterator(s):
            return env[s]
        case Affine(symbols, offset):
            return sum(c * env[s] for c, s in symbols) + offset
    raise TypeError(idx)


def _read(a, idcs):
    """A read past either end of an axis (padding) gives 0, as the lowering's guard does."""
    return a[idcs] if all(0 <= i < d for i, d in zip(idcs, a.shape, strict=True)) else 0.0


def run(proj: Projections, args, statics=None, combine=math.prod):
    """Accumulate `combine(args at their projections)` into a zero lhs over the product space."""
    assert tuple(a.shape for a in args) == proj.rhs_dims
    out = np.zeros(proj.lhs_dims)
    env = dict(statics or {})
    for point in itertools.product(*(range(d) for d in proj.product_space)):
        env.update(zip(proj.product_iterators, point, strict=True))
        lhs = tuple(index_value(i, env) for i in proj.project_lhs)
        vals = [_read(a, tuple(index_value(i, env) for i in p)) for a, p in zip(args, proj.project_rhs, strict=True)]
        out[lhs] += combine(vals)
    return out
