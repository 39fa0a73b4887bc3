"""One test per rule of `simplify_llc` (input IR -> expected IR), plus a property test that
simplification never changes what the interpreter computes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, FixedIdx, Iterator, get_symbol
from einjit.ir.passes.simplify import MAX_UNROLLED_POWER, simplify_llc, simplify_scalar
from einjit.ir.tnode import Tnode

B, U, T = ops.Binop, ops.Unop, ops.Ternop
C = ll.Constant


def node(label="n", dims=(4,), prec=ops.double):
    return Tnode(label, dims, prec)


A, BN, CN = node("a"), node("b"), node("c")
X, Y, Z = (ll.Get(t, (FixedIdx(0),)) for t in (A, BN, CN))
OUT = node("out")


def simp(sc, prec=ops.double):
    return simplify_scalar(sc, prec, Tnode("ctx", (1,), prec))


def value_of(sc, prec=ops.double, arrays=None):
    """What the interpreter computes for `sc` stored into a node of precision `prec`."""
    out = node("result", (1,), prec)
    arrays = {t: np.array(v, dtype=t.prec.dtype) for t, v in (arrays or {}).items()}
    return interpret.run(ll.Set(out, (FixedIdx(0),), sc), arrays)[out][0]


# ---------------------------------------------------------------- constant folding


def test_folds_binop_of_constants():
    assert simp(ll.Binop(B.ADD, C(2.0), C(3.0))) == C(5.0)


def test_folds_unop_and_nested_expressions():
    assert simp(ll.Unop(U.NEG, ll.Binop(B.MUL, C(2.0), C(4.0)))) == C(-8.0)
    assert simp(ll.Unop(U.EXP, C(0.0))) == C(1.0)


def test_folds_in_the_precision_of_the_context():
    got = simp(ll.Binop(B.ADD, C(0.1), C(0.2)), ops.single)
    assert got == C(float(np.float32(np.float32(0.1) + np.float32(0.2))))
    assert got != C(0.1 + 0.2)
    assert simp(ll.Binop(B.DIV, C(7.0), C(2.0)), ops.int32) == C(3.0)


def test_folds_fma_of_constants_like_the_interpreter():
    e = ll.Ternop(T.FMA, C(1.5), C(2.0), C(0.25))
    assert simp(e) == C(3.25)
    assert simp(e, ops.single) == C(float(value_of(e, ops.single)))


def test_does_not_fold_to_non_finite_constants():
    e = ll.Binop(B.DIV, C(1.0), C(0.0))
    assert simp(e) == e
    assert simp(ll.Unop(U.LOG, C(-1.0))) == ll.Unop(U.LOG, C(-1.0))


def test_fixed_embedded_index_becomes_constant():
    assert simp(ll.EmbedIndex(FixedIdx(3))) == C(3.0)
    i = Iterator(get_symbol())
    assert simp(ll.EmbedIndex(i)) == ll.EmbedIndex(i)


# ---------------------------------------------------------------- identities


@pytest.mark.parametrize("expr", [
    ll.Binop(B.ADD, X, C(0.0)), ll.Binop(B.ADD, C(0.0), X), ll.Binop(B.SUB, X, C(0.0)),
    ll.Binop(B.MUL, X, C(1.0)), ll.Binop(B.MUL, C(1.0), X), ll.Binop(B.DIV, X, C(1.0)),
    ll.Unop(U.NEG, ll.Unop(U.NEG, X)), ll.Unop(U.IDENTITY, X), ll.Binop(B.ARG1, X, Y), ll.Binop(B.ARG2, Y, X),
], ids=["x+0", "0+x", "x-0", "x*1", "1*x", "x/1", "--x", "identity", "arg1", "arg2"])
def test_identity_rules(expr):
    assert simp(expr) == X


def test_negative_zero_minus_x_is_negation():
    assert simp(ll.Binop(B.SUB, C(-0.0), X)) == ll.Unop(U.NEG, X)
    assert simp(ll.Binop(B.SUB, C(0.0), X), ops.int32) == ll.Unop(U.NEG, X)


def test_positive_zero_minus_x_keeps_the_sign_of_a_zero_difference():
    """`0.0 - 0.0` is `0.0` and `-(0.0)` is `-0.0`: as a divisor, `+inf` against `-inf` (a random
    program found `1 / (0 - x)` turned to `-inf`). Nor is `x - (-0.0)` `x` (`-0.0 + 0.0` is
    `0.0`)."""
    for expr in (ll.Binop(B.SUB, C(0.0), X), ll.Binop(B.SUB, X, C(-0.0))):
        assert simp(expr) == expr
    quotient = ll.Binop(B.DIV, C(1.0), ll.Binop(B.SUB, C(0.0), X))
    assert value_of(simp(quotient), arrays={A: [0.0] * 4}) == math.inf == value_of(quotient, arrays={A: [0.0] * 4})


def test_times_zero_is_kept_in_floating_point_because_of_nan_and_inf():
    for e in (ll.Binop(B.MUL, X, C(0.0)), ll.Binop(B.MUL, C(0.0), X)):
        assert simp(e) == e
        for bad in (math.nan, math.inf):
            assert math.isnan(value_of(e, arrays={A: [bad, 0, 0, 0]}))


def test_times_zero_is_dropped_where_no_nan_can_arise():
    assert simp(ll.Binop(B.MUL, X, C(0.0)), ops.int32) == C(0.0)
    assert simp(ll.Binop(B.MUL, C(0.0), ll.EmbedIndex(Iterator(get_symbol())))) == C(0.0)


# ---------------------------------------------------------------- integer powers


def pow_(base, n):
    return ll.Binop(B.TO_POW_OF, base, C(float(n)))


def test_power_zero_and_one():
    assert simp(pow_(X, 0)) == C(1.0)
    assert simp(pow_(X, 1)) == X
    assert value_of(pow_(X, 0), arrays={A: [math.nan, 0, 0, 0]}) == 1.0


def test_small_powers_unroll_to_products():
    assert simp(pow_(X, 2)) == ll.Binop(B.MUL, X, X)
    assert simp(pow_(X, 3)) == ll.Binop(B.MUL, ll.Binop(B.MUL, X, X), X)


def test_negative_power_uses_reciprocal():
    assert simp(pow_(X, -2)) == ll.Unop(U.RECIP, ll.Binop(B.MUL, X, X))
    assert simp(pow_(X, -2), ops.int32) == pow_(X, -2)


def test_large_or_fractional_powers_are_kept():
    assert simp(pow_(X, MAX_UNROLLED_POWER + 1)) == pow_(X, MAX_UNROLLED_POWER + 1)
    half = ll.Binop(B.TO_POW_OF, X, C(2.5))
    assert simp(half) == half


def test_power_of_an_expensive_base_computes_it_once():
    base = ll.Unop(U.EXP, X)
    got = simp(pow_(base, 3))
    assert isinstance(got, ll.LocalScope)
    sid = got.id
    v = ll.GetLocal(sid)
    assert list(ll.flatten(got.body)) == [ll.SetLocal(sid, base),
                                          ll.SetLocal(sid, ll.Binop(B.MUL, ll.Binop(B.MUL, v, v), v))]
    assert sum(isinstance(x, ll.Unop) and x.op is U.EXP
               for s in ll.iter_stmts(got.body) for x in ll.iter_scalars(s.value)) == 1
    arrays = {A: [0.3, 0, 0, 0]}
    assert value_of(got, arrays=arrays) == pytest.approx(math.exp(0.3) ** 3, rel=1e-14)


# ---------------------------------------------------------------- fused multiply-add


def test_fma_detection_both_orders():
    assert simp(ll.Binop(B.ADD, X, ll.Binop(B.MUL, Y, Z))) == ll.Ternop(T.FMA, Y, Z, X)
    assert simp(ll.Binop(B.ADD, ll.Binop(B.MUL, Y, Z), X)) == ll.Ternop(T.FMA, Y, Z, X)


def test_no_fma_in_integer_precision():
    e = ll.Binop(B.ADD, X, ll.Binop(B.MUL, Y, Z))
    assert simp(e, ops.int32) == e


def test_fma_after_power_unrolling():
    assert simp(ll.Binop(B.ADD, Y, pow_(X, 2))) == ll.Ternop(T.FMA, X, X, Y)


# ---------------------------------------------------------------- where and guards


def test_where_with_constant_condition():
    assert simp(ll.Ternop(T.WHERE, C(1.0), X, Y)) == X
    assert simp(ll.Ternop(T.WHERE, C(0.0), X, Y)) == Y
    assert simp(ll.Ternop(T.WHERE, ll.Binop(B.CMPLT, C(1.0), C(2.0)), X, Y)) == X


def test_where_with_equal_branches():
    assert simp(ll.Ternop(T.WHERE, Y, X, X)) == X


def test_bounds_guards_decided_by_loop_ranges():
    i = get_symbol()
    read = ll.Get(A, (Iterator(i),))
    low = ll.Binop(B.CMPLT, C(-1.0), ll.EmbedIndex(Iterator(i)))
    high = ll.Binop(B.CMPLT, ll.EmbedIndex(Iterator(i)), C(4.0))
    tight = ll.Binop(B.CMPLT, ll.EmbedIndex(Affine(((1, i),), 1)), C(4.0))
    code = ll.ForLoop(i, 0, 3, ll.seq(
        ll.Set(OUT, (Iterator(i),), ll.Ternop(T.WHERE, ll.Binop(B.AND, low, high), read, C(0.0))),
        ll.Set(OUT, (Iterator(i),), ll.Ternop(T.WHERE, ll.Binop(B.AND, low, tight), read, C(0.0)))))
    got = list(ll.flatten(simplify_llc(code).body))
    assert got == [ll.Set(OUT, (Iterator(i),), read),
                   ll.Set(OUT, (Iterator(i),), ll.Ternop(T.WHERE, tight, read, C(0.0)))]


# ---------------------------------------------------------------- local scopes


def test_local_scope_with_one_set_becomes_its_value():
    sid = ll.fresh_scope_id(node("tmp"))
    assert simp(ll.LocalScope(sid, ll.SetLocal(sid, ll.Unop(U.EXP, X)), ())) == ll.Unop(U.EXP, X)


def test_local_scope_reading_its_initial_zero():
    sid = ll.fresh_scope_id(node("tmp"))
    body = ll.SetLocal(sid, ll.Binop(B.ADD, ll.GetLocal(sid), X))
    assert simp(ll.LocalScope(sid, body, ())) == X


def test_sequential_sets_of_one_local_are_substituted():
    sid = ll.fresh_scope_id(node("tmp"))
    v = ll.GetLocal(sid)
    body = ll.seq(ll.Comment("inlined"), ll.SetLocal(sid, C(0.0)), ll.SetLocal(sid, X),
                  ll.SetLocal(sid, ll.Binop(B.MUL, v, Y)), ll.SetLocal(sid, ll.Unop(U.TANH, v)))
    assert simp(ll.LocalScope(sid, body, ())) == ll.Unop(U.TANH, ll.Binop(B.MUL, X, Y))


def test_substitution_never_duplicates_an_expensive_value():
    sid = ll.fresh_scope_id(node("tmp"))
    v = ll.GetLocal(sid)
    e = ll.LocalScope(sid, ll.seq(ll.SetLocal(sid, ll.Unop(U.EXP, X)), ll.SetLocal(sid, ll.Binop(B.SUB, v, v))), ())
    assert simp(e) == e


def test_local_of_another_precision_keeps_its_rounding():
    sid = ll.fresh_scope_id(node("tmp", prec=ops.single))
    e = ll.LocalScope(sid, ll.SetLocal(sid, ll.Binop(B.ADD, X, ll.GetLocal(sid))), ())
    got = simp(e)
    assert got == ll.LocalScope(sid, ll.SetLocal(sid, X), ())
    arrays = {A: [0.1, 0, 0, 0]}
    assert value_of(got, arrays=arrays) == value_of(e, arrays=arrays) == float(np.float32(0.1))
    assert simp(e, ops.single) == X


def test_leading_zero_set_of_a_reduction_is_dropped():
    sid = ll.fresh_scope_id(node("tmp"))
    j = get_symbol()
    loop = ll.ForLoop(j, 0, 3, ll.SetLocal(sid, ll.Binop(B.ADD, ll.GetLocal(sid), ll.Get(A, (Iterator(j),)))))
    got = simp(ll.LocalScope(sid, ll.seq(ll.SetLocal(sid, C(0.0)), loop), ()))
    assert got == ll.LocalScope(sid, loop, ())
    assert value_of(got, arrays={A: [1, 2, 3, 4]}) == 10.0


# ---------------------------------------------------------------- statements


def test_statements_and_empty_loops():
    i = get_symbol()
    sid = ll.fresh_scope_id(node("tmp"))
    code = ll.seq(ll.ForLoop(i, 0, 3, ll.Noop()), ll.ForLoop(get_symbol(), 2, 1, ll.Set(OUT, (FixedIdx(0),), X)),
                  ll.Comment("kept"), ll.Set(OUT, (FixedIdx(0),), ll.Binop(B.ADD, X, C(0.0))),
                  ll.SetLocal(sid, ll.Binop(B.MUL, C(2.0), C(3.0))))
    assert list(ll.flatten(simplify_llc(code))) == [ll.Comment("kept"), ll.Set(OUT, (FixedIdx(0),), X),
                                                    ll.SetLocal(sid, C(6.0))]


# ---------------------------------------------------------------- property: same values


SPECIAL = st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 3.0, math.nan, math.inf, -math.inf])
CELLS = st.floats(-3, 3) | SPECIAL


def away_from_zero(x):
    """`1 + x * x`: a denominator that is never zero, so the one inexactness the rules allow —
    the sign of a zero (see `simplify`) — cannot show as an infinity of the other sign."""
    return ll.Binop(B.ADD, C(1.0), ll.Binop(B.MUL, x, x))


def exprs(depth):
    leaf = st.one_of(st.builds(C, SPECIAL), st.integers(0, 3).map(lambda k: ll.Get(A, (FixedIdx(k),))),
                     st.integers(0, 3).map(lambda k: ll.EmbedIndex(FixedIdx(k))))
    if depth == 0:
        return leaf
    sub = exprs(depth - 1)
    binops = st.sampled_from([B.ADD, B.SUB, B.MUL, B.MAX, B.CMPLT, B.AND, B.ARG1])
    unops = st.sampled_from([U.NEG, U.EXP, U.IDENTITY, U.RELU, U.TANH])
    return st.one_of(
        leaf, st.builds(ll.Unop, unops, sub), st.builds(ll.Binop, binops, sub, sub),
        st.builds(lambda a, b: ll.Binop(B.DIV, a, away_from_zero(b)), sub, sub),
        st.builds(lambda a: ll.Unop(U.RECIP, away_from_zero(a)), sub),
        st.builds(lambda c, a, b: ll.Ternop(T.WHERE, c, a, b), sub, sub, sub),
        st.builds(lambda a, b, c: ll.Ternop(T.FMA, a, b, c), sub, sub, sub),
        st.builds(lambda n, b: pow_(b, n), st.integers(0, 5), sub),
        st.builds(lambda n, b: pow_(away_from_zero(b), n), st.integers(-3, -1), sub))


@settings(max_examples=150, deadline=None)
@given(expr=exprs(3), cells=st.lists(CELLS, min_size=4, max_size=4), prec=st.sampled_from([ops.double, ops.single]))
def test_simplification_preserves_values(expr, cells, prec):
    arrays = {A: cells}
    want = value_of(expr, prec, arrays)
    got = value_of(simp(expr, prec), prec, arrays)
    tol = 1e-12 if prec is ops.double else 1e-5
    if math.isnan(want):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(want, rel=tol, abs=tol) or (math.isinf(want) and got == want)
