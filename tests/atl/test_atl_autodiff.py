"""Forward and reverse derivatives: finite differences, the adjoint dot-product identity
⟨adjoint(dout), din⟩ = ⟨dout, D(din)⟩, closed forms, and compiled adjoints."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atl_notebook import PROGRAMS, args_of, func
from atl_programs import SIGNATURE, programs, random_inputs
from einjit.atl import B, Func, Gen, Idx, Let, R, Rel, Sum, TTensor, Var, adjoint, deriv, grad


def as_array(v) -> np.ndarray:
    return np.asarray(v, dtype=np.float64)


def random_like(v, rng) -> object:
    if isinstance(v, np.ndarray):
        return rng.standard_normal(v.shape)
    return float(rng.standard_normal())


def dot(u, v) -> float:
    return float(np.sum(as_array(u) * as_array(v)))


def dot_product_gap(f: Func, wrt: str, args: list, rng) -> tuple[float, float]:
    """⟨adjoint(dout), din⟩ and ⟨dout, deriv(din)⟩ through the interpreter."""
    k = f.arg_names.index(wrt)
    din = random_like(args[k], rng)
    forward = deriv(f, [wrt]).interpret(*args, din)
    dout = random_like(forward if isinstance(forward, np.ndarray) else 0.0, rng)
    backward = adjoint(f, wrt).interpret(*args, dout)
    return dot(backward, din), dot(dout, forward)


DIFFERENTIABLE = [(name, arg) for name, (sig, _, _, _) in sorted(PROGRAMS.items())
                  for arg, _ in sig]


@pytest.mark.parametrize("name,wrt", DIFFERENTIABLE)
def test_adjoint_is_the_transpose_of_the_derivative(name, wrt):
    rng = np.random.default_rng(7)
    lhs, rhs = dot_product_gap(func(name), wrt, args_of(name, "C"), rng)
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("name,wrt", DIFFERENTIABLE)
def test_derivative_matches_finite_differences(name, wrt):
    f = func(name)
    args = args_of(name, "C")
    k = f.arg_names.index(wrt)
    d = np.random.default_rng(8).standard_normal(args[k].shape)
    h = 1e-6
    plus = list(args)
    minus = list(args)
    plus[k], minus[k] = args[k] + h * d, args[k] - h * d
    fd = (as_array(f.interpret(*plus)) - as_array(f.interpret(*minus))) / (2 * h)
    exact = as_array(deriv(f, [wrt]).interpret(*args, d))
    np.testing.assert_allclose(exact, fd, rtol=1e-7, atol=1e-6)


def test_deriv_signature_and_form():
    f = func("Axc")
    d = deriv(f)
    assert d.arg_names == ("A", "x", "c", "dA", "dx", "dc")
    assert str(d).endswith("Gen(i:3) dc[i] + (+(j:3) dA[i][j] * x[j] + A[i][j] * dx[j])")


def test_gradients_in_closed_form():
    A, x = args_of("qprod", "C")
    g = grad(func("qprod"), "x")
    assert g.arg_names == ("A", "x")
    np.testing.assert_allclose(g.interpret(A, x), (A + A.T) @ x, rtol=1e-14)
    adj = adjoint(func("Axc"), "A")
    dout = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(adj.interpret(*args_of("Axc", "C"), dout), np.outer(dout, x))
    assert str(adj.normal_form).endswith("Gen(j5:3) Gen(j6:3) dout[j5] * x[j6]")


def test_adjoint_through_lets_and_pairs():
    a, b = args_of("ab3", "C")
    np.testing.assert_allclose(grad(func("ab3"), "a").interpret(a, b), 1 + b, rtol=1e-14)
    np.testing.assert_allclose(grad(func("ab3"), "b").interpret(a, b), 1 + a, rtol=1e-14)


def test_differentiation_errors():
    with pytest.raises(TypeError, match="grad needs a function with result R"):
        grad(func("Axc"), "x")
    with pytest.raises(ValueError, match="not an argument"):
        adjoint(func("Axc"), "q")
    masked = Func([("M", TTensor(3, B)), ("x", TTensor(3, R))],
                  Sum("i", 3, Rel("M", "i") * Var("x")["i"]))
    with pytest.raises(ValueError, match="relation 'M'"):
        adjoint(masked, "M")
    assert deriv(masked).arg_names == ("M", "x", "dx")


def test_compiled_adjoint_of_a_guarded_stencil():
    """The zero-padded 3-tap blur is symmetric, so its adjoint is the blur itself."""
    pytest.importorskip("halide", reason="the Halide backend needs einjit[halide]")
    n = 11
    i = Idx("i")
    x, t = Var("x"), Var("t")
    blur = Func([("x", TTensor(n, R))],
                Let("t", Gen(i, n, 2.0 * x[i]),
                    Gen(i, n, 0.25 * ((i - 1 >= 0) * x[i - 1] + t[i] + (i + 1 < n) * x[i + 1]))))
    adj = adjoint(blur, "x")
    v = np.random.default_rng(9).standard_normal(n)
    expected = blur.interpret(v)
    np.testing.assert_allclose(adj.jit_exec(np.zeros(n), v), expected, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(adj.interpret(np.zeros(n), v), expected, rtol=1e-13, atol=1e-14)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(max_depth=3), st.integers(0, 2**31), st.sampled_from(["s", "x", "A"]))
def test_dot_product_identity_on_random_programs(program, seed, wrt):
    _, e = program
    f = Func(SIGNATURE, e)
    args = random_inputs(seed)
    lhs, rhs = dot_product_gap(f, wrt, args, np.random.default_rng(seed))
    assert lhs == pytest.approx(rhs, rel=1e-10, abs=1e-10)
