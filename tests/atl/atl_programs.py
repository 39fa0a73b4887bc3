"""A Hypothesis strategy for random well-typed ATL programs.

Programs use lets, pairs and projections, indicators with comparison predicates and a
relation, nested sums and generators, literal indices, and shifted indices under
range guards, over a fixed signature whose arguments and result are pair-free (so every
pass and backend accepts them).
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import strategies as st

from einjit.atl import (
    And,
    B,
    Const,
    Eq,
    Gen,
    Idx,
    Le,
    Let,
    Lt,
    Ne,
    Not,
    Or,
    Pair,
    Proj,
    R,
    Rel,
    Sum,
    TPair,
    TTensor,
    Var,
)
from einjit.atl.ir import Access, Indicate

T2, T3 = TTensor(2, R), TTensor(3, R)
T23 = TTensor(2, T3)
SIGNATURE = [("s", R), ("x", T3), ("y", T2), ("A", T23), ("M", TTensor(2, TTensor(3, B)))]
RESULT_TYPES = [R, T2, T3, T23]
LOCAL_TYPES = [R, T2, T3, T23, TPair(R, T3), TTensor(2, TPair(R, R))]


def random_inputs(seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [float(rng.uniform(-2, 2)), rng.uniform(-2, 2, 3), rng.uniform(-2, 2, 2),
            rng.uniform(-2, 2, (2, 3)), rng.random((2, 3)) < 0.5]


class _Builder:
    def __init__(self, draw) -> None:
        self.draw = draw
        self.names = itertools.count()

    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self.names)}"

    def pred(self, idx: list[tuple[str, int]]):
        draw = self.draw
        i, n = draw(st.sampled_from(idx))
        same = [v for v, m in idx if m == n]
        kind = draw(st.sampled_from(["eq", "lt", "le", "ne", "rel", "and", "or", "not"]))
        c = draw(st.integers(0, n - 1))
        if kind == "eq":
            return Eq(i, draw(st.sampled_from(same)))
        if kind == "lt":
            return Lt(i, c)
        if kind == "le":
            return Le(c, i)
        if kind == "ne":
            return Ne(i, c)
        if kind == "rel":
            rows = [v for v, m in idx if m == 2] or [0]
            cols = [v for v, m in idx if m == 3] or [2]
            return Rel("M", draw(st.sampled_from(rows)), draw(st.sampled_from(cols)))
        if kind == "not":
            return Not(Lt(i, c))
        pair = (Lt(i, c), Eq(i, draw(st.sampled_from(same))))
        return And(*pair) if kind == "and" else Or(*pair)

    def index_into(self, base, n: int, idx: list[tuple[str, int]]):
        """Access ``base`` (extent ``n``): a variable of range n, a literal, or a
        shifted variable under a guard."""
        draw = self.draw
        same = [v for v, m in idx if m == n]
        options = ["literal"] + (["var"] * 3 if same else []) + (["shifted"] if idx else [])
        kind = draw(st.sampled_from(options))
        if kind == "var":
            return Access(base, Idx(draw(st.sampled_from(same))))
        if kind == "literal":
            return Access(base, draw(st.integers(0, n - 1)))
        v, _ = draw(st.sampled_from(idx))
        shifted = Idx(v) + draw(st.sampled_from([-1, 1]))
        return Indicate(And(Le(0, shifted), Lt(shifted, n)), Access(base, shifted))

    def expr(self, t, vals: list, idx: list, depth: int):
        draw = self.draw
        options = []
        if any(vt == t for _, vt in vals):
            options += ["var"] * (1 if depth > 0 else 3)
        if t == R:
            options += ["const"]
        if isinstance(t, TTensor):
            options += ["gen"]
        if isinstance(t, TPair):
            options += ["pair"]
        if depth > 0:
            options += ["let", "let", "proj", "access", "access"] + (["ind"] * 2 if idx else [])
            if t == R:
                options += ["add", "mul", "mul", "sum", "sum"]
        kind = draw(st.sampled_from(options))
        d = depth - 1
        if kind == "var":
            return Var(draw(st.sampled_from([v for v, vt in vals if vt == t])))
        if kind == "const":
            return Const(draw(st.sampled_from([0.0, 1.0, -0.5, 2.0, 3.25])))
        if kind == "gen":
            i = self.fresh("i")
            return Gen(i, t.range, self.expr(t.typ, vals, idx + [(i, t.range)], d))
        if kind == "pair":
            return Pair(self.expr(t.lhs, vals, idx, d), self.expr(t.rhs, vals, idx, d))
        if kind == "let":
            v = self.fresh("v")
            vt = draw(st.sampled_from(LOCAL_TYPES))
            rhs = self.expr(vt, vals, idx, d)
            return Let(v, rhs, self.expr(t, vals + [(v, vt)], idx, d))
        if kind == "proj":
            other = draw(st.sampled_from([R, T2]))
            k = draw(st.integers(0, 1))
            pt = TPair(t, other) if k == 0 else TPair(other, t)
            return Proj(k, self.expr(pt, vals, idx, d))
        if kind == "access":
            n = draw(st.sampled_from([2, 3]))
            return self.index_into(self.expr(TTensor(n, t), vals, idx, d), n, idx)
        if kind == "ind":
            return Indicate(self.pred(idx), self.expr(t, vals, idx, d))
        if kind in ("add", "mul"):
            left, right = self.expr(R, vals, idx, d), self.expr(R, vals, idx, d)
            return left + right if kind == "add" else left * right
        i = self.fresh("k")
        n = draw(st.sampled_from([2, 3]))
        return Sum(i, n, self.expr(R, vals, idx + [(i, n)], d))


@st.composite
def programs(draw, max_depth: int = 4):
    """``(result type, expression)`` over ``SIGNATURE``."""
    t = draw(st.sampled_from(RESULT_TYPES))
    vals = [(name, typ) for name, typ in SIGNATURE if name != "M"]
    return t, _Builder(draw).expr(t, vals, [], draw(st.integers(2, max_depth)))
