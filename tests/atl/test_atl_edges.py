"""ATL edges of issue 14: static bounds, relations as guards past their extent, gradients of
guarded shifted reads, prefix reads under reverse-mode AD, and one message per bad range."""

from __future__ import annotations

import numpy as np
import pytest

from einjit.atl import B, Func, Gen, Idx, R, Rel, Sum, TCError, TTensor, Var, grad

i, t = Idx("i"), Idx("t")
x, y = Var("x"), Var("y")
N = 4


def test_a_relation_guards_a_read_past_its_own_extent_on_every_backend():
    f = Func([("M", TTensor(N, B)), ("x", TTensor(N + 1, R))], Gen(i, N, Rel("M", i + 1) * x[i + 1]))
    mv, xv = np.array([True, False, True, True]), np.arange(1.0, 6.0)
    want = [mv[k + 1] * xv[k + 1] if k + 1 < N else 0.0 for k in range(N)]
    np.testing.assert_array_equal(f.interpret(mv, xv), want)
    np.testing.assert_array_equal(f.jit_exec(mv, xv, backend="einjit"), want)


def test_gradient_of_a_relation_guarded_shifted_read():
    g = Func([("M", TTensor(N, B)), ("x", TTensor(N, R))], Sum(i, N, Rel("M", i + 1) * (x[i + 1] * x[i + 1])))
    mv, xv = np.array([True, False, True, True]), np.array([1.5, -2.0, 3.0, 0.5])
    want = np.zeros(N)
    for k in range(N - 1):
        if mv[k + 1]:
            want[k + 1] += 2 * xv[k + 1]
    dg = grad(g, "x")
    np.testing.assert_allclose(dg.interpret(mv, xv), want)
    np.testing.assert_allclose(dg.jit_exec(mv, xv, backend="einjit"), want)


def test_reverse_mode_of_a_prefix_read_typechecks():
    h = Func([("y", TTensor(N, R))], Sum(t, 2, y[t + 0] * y[t + 0]))
    yv = np.array([1.0, 2.0, 3.0, 4.0])
    dh = grad(h, "y")
    np.testing.assert_allclose(dh.interpret(yv), [2.0, 4.0, 0.0, 0.0])
    np.testing.assert_allclose(dh.jit_exec(yv, backend="einjit"), [2.0, 4.0, 0.0, 0.0])


def test_a_range_of_size_zero_gives_one_message():
    with pytest.raises(TCError) as err:
        Func([("y", TTensor(N, R))], Gen(i, 0, y[i]))
    assert err.value.errors == ["range of 'i' must be a positive integer, got 0"]


def test_unguarded_shift_is_refused_naming_the_access():
    with pytest.raises(TCError) as err:
        Func([("x", TTensor(N, R))], Gen(i, N, x[i + 1]))
    assert err.value.errors == [f"index i+1 ranges over [1, {N}], outside the extent {N} of the tensor it "
                                f"reads, with no guard: x[i+1]; guard it, e.g. (i+1 < {N}) * ..."]


def _executors():
    out = ["interpret", "einjit", "einjit-stored"]
    try:
        import halide  # noqa: F401
    except ImportError:
        return out
    return out + ["halide"]


def _run(f: Func, how: str, *args):
    from einjit.ir.optimize import VirtualizeSettings
    if how == "interpret":
        return f.interpret(*args)
    if how == "einjit-stored":
        return f.compiled("einjit", settings=VirtualizeSettings(virtualize=False))(*args)
    return f.jit_exec(*args, backend=how)


@pytest.mark.parametrize("how", _executors())
def test_a_relation_read_past_its_extent_has_no_members_there(how):
    """Issue 23: `M[i+0]` with `i` ranging past `M`'s extent (2 of 3) is false there, on every
    executor, and so is the gradient of the read it guards (reference: [0, 1, 0])."""
    f = Func([("M", TTensor(2, B)), ("x", TTensor(3, R))], Gen(i, 3, Rel("M", i + 0) * x[i]))
    s = Func([("M", TTensor(2, B)), ("x", TTensor(3, R))], Sum(i, 3, Rel("M", i + 0) * (x[i] * x[i])))
    mv, xv = np.array([False, True]), np.array([1.0, 0.5, 2.0])
    np.testing.assert_array_equal(_run(f, how, mv, xv), [0.0, 0.5, 0.0])
    assert float(_run(s, how, mv, xv)) == 0.25
    np.testing.assert_array_equal(_run(grad(s, "x"), how, mv, xv), [0.0, 1.0, 0.0])


@pytest.mark.parametrize("how", _executors())
def test_a_matrix_relation_read_past_its_rows(how):
    """`m[i+0, j]` where `i` runs past `m`'s rows: rows 2.. are outside, no members."""
    M2, X3 = TTensor(2, TTensor(2, B)), TTensor(3, TTensor(2, R))
    j = Idx("j")
    f = Func([("m", M2), ("x", X3)], Sum(i, 3, Sum(j, 2, Rel("m", i + 0, j) * x[i, j])))
    mv = np.array([[False, True], [True, True]])
    xv = np.arange(1.0, 7.0).reshape(3, 2)
    padded = np.vstack([mv, [[False, False]]])
    assert float(_run(f, how, mv, xv)) == float((padded * xv).sum())
    np.testing.assert_array_equal(_run(grad(f, "x"), how, mv, xv), padded.astype(float))
