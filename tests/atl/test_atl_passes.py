"""The normalization passes: the notebook's printouts after each pass, fixed points, and
the normal form's shape."""

import pytest

from atl_notebook import (
    PROGRAMS,
    A,
    D,
    Rn,
    Rnn,
    Rnnn,
    a,
    b,
    dprod,
    func,
    i,
    j,
    k,
    n,
    qprod,
    x,
)
from einjit.atl import (
    Const,
    Eq,
    Gen,
    Idx,
    Let,
    Pair,
    PairError,
    Proj,
    R,
    Sum,
    TPair,
    TTensor,
    Var,
    typecheck,
)
from einjit.atl.gens import gen_normalize
from einjit.atl.ir import Indicate, Le, Lt
from einjit.atl.lets import lift_lets
from einjit.atl.normalize import check_body, normal_form_of, normalize
from einjit.atl.pairs import eliminate_pairs, typ_has_pairs, typ_soa_transform
from einjit.atl.rewrite import alpha_equal


def test_pair_type_analysis():
    Complex = TPair(R, R)
    Cn = TTensor(n, Complex)
    assert [typ_has_pairs(t) for t in (Rn, Rnn, Complex, Cn)] == [False, False, True, True]
    assert str(typ_soa_transform(Rn)) == "[3]R"
    assert str(typ_soa_transform(Rnn)) == "[3][3]R"
    assert str(Cn) == "[3](R,R)"
    assert str(typ_soa_transform(Cn)) == "([3]R,[3]R)"
    nested = TTensor(2, TPair(TTensor(3, R), TPair(R, R)))
    assert str(typ_soa_transform(nested)) == "([2][3]R,([2]R,[2]R))"


def test_notebook_pair_elimination():
    j_ = "j"
    c3 = Var("c3")
    e = Let("c3", Gen(j_, n, Pair(Pair(a[j_], b[j_]), a[j_] * b[j_])),
            Sum(j_, n, Proj(0, Proj(0, c3[j_])) + Proj(1, Proj(0, c3[j_])) + Proj(1, c3[j_])))
    tf = typecheck([("a", Rn), ("b", Rn)], e)
    assert str(tf) == (
        "Function(a:[3]R, b:[3]R) : R\n"
        "    let c3 : [3]((R,R),R) = Gen(j:3) ((a[j],b[j]),a[j] * b[j]) in\n"
        "    +(j:3) c3[j].0.0 + c3[j].0.1 + c3[j].1")
    assert str(eliminate_pairs(tf)) == (
        "Function(a:[3]R, b:[3]R) : R\n"
        "    let c3_00 : [3]R = Gen(j:3) a[j] in\n"
        "    let c3_01 : [3]R = Gen(j:3) b[j] in\n"
        "    let c3_1 : [3]R = Gen(j:3) a[j] * b[j] in\n"
        "    +(j:3) c3_00[j] + c3_01[j] + c3_1[j]")


def test_pair_elimination_gives_every_copied_binder_its_own_symbol():
    tf = eliminate_pairs(func("ab3").typed)
    binders = []
    e = tf.body
    while isinstance(e, Let):
        binders.append(e.rhs.idx)
        e = e.body
    binders.append(e.idx)
    assert len(set(binders)) == 4


def test_pairs_inside_indicators_and_projections_of_lets():
    p = Let("p", Pair(x, Sum(i, n, x[i])),
            Gen(i, n, Eq(i, 0) * Proj(0, Var("p"))[i] + Proj(1, Var("p"))))
    tf = eliminate_pairs(typecheck([("x", Rn)], p))
    assert str(tf) == ("Function(x:[3]R) : [3]R\n"
                       "    let p_0 : [3]R = x in\n"
                       "    let p_1 : R = +(i:3) x[i] in\n"
                       "    Gen(i:3) [i=0]*p_0[i] + p_1")


def test_pair_typed_interfaces_are_refused():
    with pytest.raises(PairError, match="return type is a pair"):
        eliminate_pairs(typecheck([("x", Rn)], Pair(x, x)))
    with pytest.raises(PairError, match="pair-typed arguments"):
        eliminate_pairs(typecheck([("p", TPair(R, R))], Proj(0, Var("p"))))


CONTRACT_BEFORE = ("Function(D:[3][3][3]R, a:[3]R, b:[3]R) : [3]R\n"
                   "    Gen(i:3) +(j:3) (let m : R = +(k:3) D[i][j][k] * a[k] in\n"
                   "    m * b[j])")
CONTRACT_AFTER = ("Function(D:[3][3][3]R, a:[3]R, b:[3]R) : [3]R\n"
                  "    let m : [3][3]R = Gen(i:3) Gen(j:3) +(k:3) D[i][j][k] * a[k] in\n"
                  "    Gen(i:3) +(j:3) m[i][j] * b[j]")


def test_notebook_let_flattening_and_its_fixed_point():
    contract = Gen(i, n, Sum(j, n, Let("m", Sum(k, n, D[i, j, k] * a[k]), Var("m") * b[j])))
    tf = typecheck([("D", Rnnn), ("a", Rn), ("b", Rn)], contract)
    assert str(tf) == CONTRACT_BEFORE
    lifted = lift_lets(tf)
    assert str(lifted) == CONTRACT_AFTER
    again = eliminate_pairs(lifted)
    assert str(again) == CONTRACT_AFTER
    assert str(lift_lets(again)) == CONTRACT_AFTER
    assert alpha_equal(lift_lets(again).body, lifted.body)


def test_let_flattening_closes_over_every_enclosing_binder_in_order():
    e = Gen(i, n, Let("u", x[i], Sum(j, n, Let("v", Var("u") * x[j], Var("v") + Var("u")))))
    tf = lift_lets(typecheck([("x", Rn)], e))
    assert str(tf) == ("Function(x:[3]R) : [3]R\n"
                       "    let u : [3]R = Gen(i:3) x[i] in\n"
                       "    let v : [3][3]R = Gen(i:3) Gen(j:3) u[i] * x[j] in\n"
                       "    Gen(i:3) +(j:3) v[i][j] + u[i]")


def test_let_lifted_out_of_an_indicator_keeps_its_guard():
    ii = Idx("i")
    e = Gen(i, n, (ii + 1 < n) * Let("t", x[ii + 1], Var("t") * Const(2.0)))
    tf = lift_lets(typecheck([("x", Rn)], e))
    assert str(tf) == ("Function(x:[3]R) : [3]R\n"
                       "    let t : [3]R = Gen(i:3) [i+1<3]*x[i+1] in\n"
                       "    Gen(i:3) [i+1<3]*t[i] * 2.0")


def test_notebook_gen_normalization():
    tf = typecheck([("A", Rnn), ("x", Rn)], qprod)
    assert str(tf) == ("Function(A:[3][3]R, x:[3]R) : R\n"
                       "    +(k:3) (Gen(i:3) +(j:3) A[i][j] * x[j])[k] * x[k]")
    assert str(gen_normalize(tf)) == ("Function(A:[3][3]R, x:[3]R) : R\n"
                                      "    +(k:3) (+(j:3) A[k][j] * x[j]) * x[k]")
    tf = typecheck([("x", Rn), ("a", Rn)], dprod)
    assert str(tf) == (
        "Function(x:[3]R, a:[3]R) : R\n"
        "    +(j:3) +(i:3) a[j] * (Gen(i:3) Gen(j:3) [i=j]*x[i])[j][i] * a[i]")
    assert str(gen_normalize(tf)) == ("Function(x:[3]R, a:[3]R) : R\n"
                                      "    +(j:3) a[j] * x[j] * a[j]")


def test_indicators_lift_out_of_products_and_unrelated_sums_but_not_sums():
    e = Gen(i, n, Sum(j, n, (Eq(i, 0) * x[j]) * x[i]) + Sum(j, n, Eq(j, 1) * x[j]))
    tf = gen_normalize(typecheck([("x", Rn)], e))
    assert str(tf) == ("Function(x:[3]R) : [3]R\n"
                       "    Gen(i:3) [i=0]*(+(j:3) x[j] * x[i]) + x[1]")


def test_indicator_on_a_generator_moves_inside_it():
    e = Gen(i, n, Lt(Idx(i), 2) * Gen(j, n, x[j]))
    assert str(gen_normalize(typecheck([("x", Rn)], e))) == (
        "Function(x:[3]R) : [3][3]R\n"
        "    Gen(i:3) Gen(j:3) [i<2]*x[j]")


def test_sum_collapse_solves_affine_equalities_and_adds_needed_guards():
    jj = Idx(j)
    e = Gen(j, n, Sum(i, n, Eq(jj, Idx(i) + 1) * x[i]))
    assert str(gen_normalize(typecheck([("x", Rn)], e))) == (
        "Function(x:[3]R) : [3]R\n"
        "    Gen(j:3) [0<=j-1]*x[j-1]")
    e = Gen(j, 2, Sum(i, n, Eq(i, jj + 1) * x[i]))
    assert str(gen_normalize(typecheck([("x", Rn)], e))) == (
        "Function(x:[3]R) : [2]R\n"
        "    Gen(j:2) x[j+1]")
    e = Gen(j, n, Sum(i, n, Eq(2 * Idx(i), jj) * x[i]))
    assert "+(i:3) [2*i=j]*x[i]" in str(gen_normalize(typecheck([("x", Rn)], e)))


def test_tensor_valued_bodies_are_eta_expanded():
    tf = gen_normalize(typecheck([("A", Rnn)], Let("r", A[1], Var("r"))))
    assert str(tf) == ("Function(A:[3][3]R) : [3]R\n"
                       "    let r : [3]R = Gen(k0:3) A[1][k0] in\n"
                       "    Gen(k0:3) r[k0]")


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_pass_is_a_fixed_point_after_normalization(name):
    tf = normalize(func(name).typed)
    for p in (eliminate_pairs, lift_lets, gen_normalize, normalize):
        assert alpha_equal(p(tf).body, tf.body), p.__name__


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_normal_form_statements(name):
    nf = normal_form_of(func(name).typed)
    names = {s for s, _ in nf.args}
    for s in nf.stmts + (nf.ret,):
        check_body(s.body, {g for g, _ in s.gens}, names)
        names.add(s.name)
    assert nf.ret.typ == func(name).ret_type


def test_normal_form_of_the_notebook_programs():
    assert str(normal_form_of(func("ab3").typed)) == (
        "Function(a:[3]R, b:[3]R) : R\n"
        "    let x_00 : [3]R = Gen(j:3) a[j] in\n"
        "    let x_01 : [3]R = Gen(j:3) b[j] in\n"
        "    let x_1 : [3]R = Gen(j:3) a[j] * b[j] in\n"
        "    +(j:3) x_00[j] + x_01[j] + x_1[j]")
    nf = normal_form_of(func("ctrct").typed)
    assert [(str(s.name), s.shape) for s in nf.stmts] == [("x", (3, 3))]
    assert nf.ret.shape == (3,) and str(nf.ret.body) == "+(j:3) x[i][j] * b[j]"
    nf = normal_form_of(func("diag").typed)
    assert nf.stmts == () and str(nf.ret.body) == "[i=j]*x[i]"
    assert isinstance(nf.ret.body, Indicate)


def test_alpha_equal_distinguishes_structure():
    f1 = typecheck([("x", Rn)], Sum(i, n, x[i]))
    f2 = typecheck([("x", Rn)], Sum(j, n, x[j]))
    f3 = typecheck([("x", Rn)], Sum(i, n, x[0]))
    args = {f1.args[0][0]: f2.args[0][0]}
    assert alpha_equal(f1.body, f2.body, args)
    assert not alpha_equal(f1.body, f2.body)
    assert not alpha_equal(f1.body, f3.body, {f1.args[0][0]: f3.args[0][0]})
    assert not alpha_equal(Le(Idx(i), 1) * x[i], Lt(Idx(i), 1) * x[i])
