"""The reference interpreter: the notebook's results to the last bit, through every pass,
and the semantics of guards, literal and affine indices, and relations."""

import numpy as np
import pytest

from atl_notebook import PROGRAMS, Rn, Rnn, args_of, func, i, j, n, x
from einjit.atl import (
    B,
    Const,
    Eq,
    Func,
    Gen,
    Idx,
    Let,
    Ne,
    Pair,
    Proj,
    R,
    Rel,
    Sum,
    TCError,
    TPair,
    TTensor,
    Var,
)
from einjit.atl.gens import gen_normalize
from einjit.atl.interpret import interpret
from einjit.atl.lets import lift_lets
from einjit.atl.normalize import normal_form_of
from einjit.atl.pairs import eliminate_pairs
from einjit.atl.values import to_python


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_notebook_results_on_nested_lists_are_exact(name):
    expected = PROGRAMS[name][2]
    got = func(name).interpret(*[v.tolist() for v in args_of(name)])
    assert got == expected
    assert type(got) is type(expected)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_notebook_results_on_arrays(name):
    got = func(name).interpret(*args_of(name))
    expected = PROGRAMS[name][2]
    if isinstance(expected, list):
        assert isinstance(got, np.ndarray) and got.dtype == np.float64
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_pass_preserves_the_value(name):
    f = func(name)
    vals = [to_python(t, v) for t, v in zip(f.arg_types, args_of(name), strict=True)]
    tf = f.typed
    reference = interpret(tf, vals)
    for p in (eliminate_pairs, lift_lets, gen_normalize):
        tf = p(tf)
        np.testing.assert_allclose(interpret(tf, vals), reference, rtol=1e-15)
    nf_value = interpret(normal_form_of(f.typed).to_typed_func(), vals)
    np.testing.assert_allclose(nf_value, reference, rtol=1e-15)


def test_guarded_out_of_range_reads_are_never_evaluated():
    ii = Idx(i)
    shift = Gen(i, n, (ii + 1 < n) * x[ii + 1] + (ii - 1 >= 0) * x[ii - 1])
    f = Func([("x", Rn)], shift)
    assert f.interpret([1.0, 2.0, 4.0]) == [2.0, 5.0, 2.0]


def test_unguarded_out_of_range_reads_are_refused_at_typecheck():
    """Issue 14: bounds are static in ATL; `x[i-1]`, `x[i+1]` and `x[2*i]` over the whole extent
    are refused naming the access, where the interpreter, Halide and einjit used to disagree."""
    for index, span in ((Idx(i) - 1, "[-1, 1]"), (Idx(i) + 1, "[1, 3]"), (2 * Idx(i), "[0, 4]")):
        with pytest.raises(TCError, match=rf"index .* ranges over \{span[:-1]}\], outside the extent 3 .*"
                                          rf"with no guard: x\["):
            Func([("x", Rn)], Gen(i, n, x[index]))
    guarded = Func([("x", Rn)], Gen(i, n, (Idx(i) - 1 >= 0) * x[Idx(i) - 1]))
    assert guarded.interpret([1.0, 2.0, 4.0]) == [0.0, 1.0, 2.0]


def test_literal_and_strided_indices():
    A = Var("A")
    f = Func([("A", Rnn)], Gen(i, n, A[0, i] + A[i, 2]))
    Av = np.arange(9.0).reshape(3, 3)
    np.testing.assert_array_equal(f.interpret(Av), Av[0, :] + Av[:, 2])
    g = Func([("x", TTensor(6, R))], Gen(i, n, x[2 * Idx(i) + 1]))
    assert g.interpret([0., 1., 2., 3., 4., 5.]) == [1.0, 3.0, 5.0]


def test_comparison_predicates():
    ii, jj = Idx(i), Idx(j)
    tri = Func([("x", Rn)], Gen(i, n, Gen(j, n, ((ii <= jj) & Ne(i, 1) | Eq(j, 0)) * x[j])))
    out = tri.interpret(np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(out, [[1, 2, 3], [1, 0, 0], [1, 0, 3]])


def test_relations_guard_reads_and_contain_nothing_outside_their_extents():
    S = TTensor(n, B)
    f = Func([("S", S), ("x", Rn)], Gen(i, n, Rel("S", Idx(i) + 1) * x[Idx(i) + 1]))
    assert f.interpret([True, False, True], [1.0, 2.0, 4.0]) == [0.0, 4.0, 0.0]
    mask = np.array([0, 1, 1])
    np.testing.assert_array_equal(f.interpret(mask, np.array([1.0, 2.0, 4.0])), [2.0, 4.0, 0.0])


def test_pairs_in_and_out_of_the_interpreter():
    p = Var("p")
    f = Func([("p", TTensor(2, TPair(R, R)))],
             Pair(Sum(i, 2, Proj(0, p[i])), Gen(i, 2, Proj(1, p[i]) * Proj(0, p[i]))))
    assert f.interpret([(1.0, 2.0), (3.0, 4.0)]) == (4.0, [2.0, 12.0])


def test_scalar_arguments_and_lets():
    s = Var("s")
    f = Func([("s", R), ("x", Rn)], Let("y", Gen(i, n, s * x[i]), Sum(i, n, Var("y")[i])))
    assert f.interpret(2, [1.0, 2.0, 3.0]) == 12.0
    assert f.interpret(np.float64(0.5), np.array([1.0, 2.0, 3.0])) == 3.0
    assert Func([], Const(1.5)).interpret() == 1.5
