"""The Halide backend against the notebook, NumPy and the interpreter.

Compiled functions are shared per module: a Halide JIT compile costs far more than a run.
"""

import numpy as np
import pytest

from atl_notebook import PROGRAMS, args_of, func, needs_halide
from atl_stencils import H, W, blur_func, laplacian_func, masked_matvec_func
from einjit.atl import B, Const, Func, Gen, Idx, Let, R, Rel, Sum, TTensor, Var

hl = needs_halide()

i, j = Idx("i"), Idx("j")


@pytest.fixture(scope="module")
def notebook_funcs():
    return {name: func(name) for name in PROGRAMS}


@pytest.fixture(scope="module")
def image_funcs():
    return {"blur": blur_func(), "laplacian": laplacian_func(), "masked": masked_matvec_func()}


def zero_padded(a: np.ndarray) -> np.ndarray:
    return np.pad(a, 1)


def np_blur(a: np.ndarray) -> np.ndarray:
    p = zero_padded(a)
    bx_ = 0.25 * (p[1:-1, :-2] + 2 * p[1:-1, 1:-1] + p[1:-1, 2:])
    q = zero_padded(bx_)
    return 0.25 * (q[:-2, 1:-1] + 2 * q[1:-1, 1:-1] + q[2:, 1:-1])


def np_laplacian(a: np.ndarray) -> np.ndarray:
    p = zero_padded(a)
    return p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * a


@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_notebook_programs_compiled(notebook_funcs, name, order):
    got = notebook_funcs[name].jit_exec(*args_of(name, order))
    expected = PROGRAMS[name][3]
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, PROGRAMS[name][2], rtol=1e-12, atol=1e-12)
    if isinstance(expected, list):
        assert isinstance(got, np.ndarray) and got.flags.c_contiguous
        assert got.dtype == np.float64
    else:
        assert isinstance(got, float)


def test_arrays_of_any_strides_and_dtypes(notebook_funcs):
    f = notebook_funcs["Axc"]
    A, x, c = args_of("Axc", "C")
    expected = f.interpret(A, x, c)
    big = np.zeros((6, 6))
    big[::2, ::2] = A
    strided = big[::2, ::2]
    assert not (strided.flags.c_contiguous or strided.flags.f_contiguous)
    np.testing.assert_allclose(f.jit_exec(strided, x, c), expected, rtol=1e-12)
    np.testing.assert_allclose(f.jit_exec(A.T.copy().T, x, c), expected, rtol=1e-12)
    reversed_ = A[::-1, ::-1].copy()[::-1, ::-1]
    np.testing.assert_allclose(f.jit_exec(reversed_, x[::-1].copy()[::-1], c), expected,
                               rtol=1e-12)
    frozen = A.copy()
    frozen.flags.writeable = False
    np.testing.assert_allclose(f.jit_exec(frozen, x, np.broadcast_to(c[2], (3,))),
                               A @ x + c[2], rtol=1e-12)
    ints = np.array([[5, 2, 0], [2, 0, 4], [0, 6, 3]])
    np.testing.assert_allclose(f.jit_exec(ints, x, c), ints @ x + c, rtol=1e-12)
    assert f.compiled("halide").scheduler == "root"


def test_inputs_are_read_in_place_and_left_alone(notebook_funcs):
    f = notebook_funcs["diag"]
    x = args_of("diag", "C")[0]
    before = x.copy()
    out1 = f.jit_exec(x)
    out2 = f.jit_exec(x)
    assert out1 is not out2
    np.testing.assert_array_equal(x, before)


def test_scalar_arguments_and_float64_constants():
    s, x = Var("s"), Var("x")
    f = Func([("s", R), ("x", TTensor(4, R))],
             Let("t", Sum(i, 4, x[i]), Gen(i, 4, s * x[i] + Var("t") * Const(0.1))))
    xv = np.array([1.0, 2.0, 3.0, 4.0])
    got = f.jit_exec(3, xv)
    np.testing.assert_allclose(got, f.interpret(3, xv), rtol=1e-15)
    # 0.1 is not a float32 number: a float32 constant would be off by ~1e-8
    np.testing.assert_allclose(got, 3 * xv + 10 * 0.1, rtol=1e-15)


def test_blur_with_boundary_guards(image_funcs):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((H, W))
    expected = np_blur(a)
    f = image_funcs["blur"]
    np.testing.assert_allclose(f.interpret(a), expected, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(f.jit_exec(a), expected, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(f.jit_exec(np.asfortranarray(a)), expected, rtol=1e-13, atol=1e-13)


def test_laplacian(image_funcs):
    a = np.random.default_rng(1).standard_normal((H, W))
    expected = np_laplacian(a)
    f = image_funcs["laplacian"]
    np.testing.assert_allclose(f.interpret(a), expected, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(f.jit_exec(a), expected, rtol=1e-13, atol=1e-13)


def test_masked_matvec(image_funcs):
    rng = np.random.default_rng(2)
    M = rng.random((7, 5)) < 0.4
    A = rng.standard_normal((7, 5))
    x = rng.standard_normal(5)
    expected = (A * M) @ x
    f = image_funcs["masked"]
    np.testing.assert_allclose(f.interpret(M, A, x), expected, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(f.jit_exec(M, A, x), expected, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(f.jit_exec(M.astype(np.int8), A, x), expected, rtol=1e-13)


def test_sparse_matmul_guarded_by_two_relations():
    """The notebook's closing example: M = ⊞_{i,k} Σ_j [S(i,j)]A[i,j]·[T(j,k)]B[j,k]."""
    n, m, p = 4, 5, 3
    A, Bm = Var("A"), Var("B")
    k = Idx("k")
    f = Func([("S", TTensor(n, TTensor(m, B))), ("T", TTensor(m, TTensor(p, B))),
              ("A", TTensor(n, TTensor(m, R))), ("B", TTensor(m, TTensor(p, R)))],
             Gen(i, n, Gen(k, p, Sum(j, m, Rel("S", i, j) * A[i, j]
                                     * (Rel("T", j, k) * Bm[j, k])))))
    # both guards lifted out of the product, kept inside the sum that they mention
    assert str(f.normal_form.ret.body) == "+(j:5) [T(j,k)]*[S(i,j)]*A[i][j] * B[j][k]"
    rng = np.random.default_rng(4)
    S_, T_ = rng.random((n, m)) < 0.5, rng.random((m, p)) < 0.5
    a, b = rng.standard_normal((n, m)), rng.standard_normal((m, p))
    expected = (a * S_) @ (b * T_)
    np.testing.assert_allclose(f.interpret(S_, T_, a, b), expected, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(f.jit_exec(S_, T_, a, b), expected, rtol=1e-13, atol=1e-13)


def test_far_out_of_range_reads_under_guards_are_safe():
    """A guard far outside the data: Halide must clamp the read, not touch memory."""
    x = Var("x")
    n = 5
    f = Func([("S", TTensor(n, B)), ("x", TTensor(n, R))],
             Gen(i, n, (i + 1000 < n) * x[i + 1000] + (i - 7 >= 0) * x[i - 7]
                 + Rel("S", i + 1) * x[i + 1] + Rel("S", -1 * i - 1) * x[-1 * i - 1]))
    S_ = np.array([True, False, True, True, True])
    xv = np.arange(1.0, 6.0)
    expected = [0.0, 3.0, 4.0, 5.0, 0.0]
    assert f.interpret(S_, xv).tolist() == expected
    assert f.jit_exec(S_, xv).tolist() == expected


def test_one_compile_per_layout():
    f = func("qprod")
    compiled = f.compiled("halide")
    assert compiled is f.compiled("halide")
    A, x = args_of("qprod", "C")
    f.jit_exec(A, x)
    f.jit_exec(A + 1.0, x)
    f.jit_exec(np.asfortranarray(A), x)
    assert sorted(compiled._compiled) == [("C", "C"), ("F", "C")]


def test_missing_autoschedulers_fall_back_to_the_plain_schedule(monkeypatch):
    import einjit.atl.halide as backend
    monkeypatch.setattr(backend, "_AUTOSCHEDULERS", ("NoSuchScheduler",))
    f = Func([("x", TTensor(4, R))], Gen(i, 4, Sum(j, 4, Var("x")[j]) * Var("x")[i]))
    compiled = f.compiled("halide", autoschedule=True)
    x = np.arange(4.0)
    np.testing.assert_allclose(compiled(x), x.sum() * x)
    assert compiled.scheduler == "root"


def test_autoscheduled_pipeline_is_correct():
    """A matrix product plus a term is not a bare contraction: it goes to an autoscheduler."""
    n = 64
    A, Bm = Var("A"), Var("B")
    k = Idx("k")
    mm = Func([("A", TTensor(n, TTensor(n, R))), ("B", TTensor(n, TTensor(n, R)))],
              Gen(i, n, Gen(j, n, Sum(k, n, A[i, k] * Bm[k, j]) + A[i, j])))
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    compiled = mm.compiled("halide", autoschedule=True)
    got = compiled(a, b)
    np.testing.assert_allclose(got, a @ b + a, rtol=1e-12, atol=1e-12)
    assert compiled.scheduler in ("Adams2019", "Mullapudi2016", "root")


@pytest.mark.parametrize("m, kk, n, transposed", [
    (64, 32, 48, False),   # whole tiles
    (50, 7, 70, False),    # edge tiles shift inwards
    (9, 3, 25, True),      # A @ B.T: the vectorized axis is B's strided one
])
def test_contractions_get_the_register_blocked_schedule(m, kk, n, transposed):
    A, Bm = Var("A"), Var("B")
    k = Idx("k")
    b_type = TTensor(n, TTensor(kk, R)) if transposed else TTensor(kk, TTensor(n, R))
    read = Bm[j, k] if transposed else Bm[k, j]
    f = Func([("A", TTensor(m, TTensor(kk, R))), ("B", b_type)], Gen(i, m, Gen(j, n, Sum(k, kk, A[i, k] * read))))
    rng = np.random.default_rng(m + n)
    a = rng.standard_normal((m, kk))
    b = rng.standard_normal((n, kk) if transposed else (kk, n))
    want = a @ (b.T if transposed else b)
    compiled = f.compiled("halide", autoschedule=True)
    np.testing.assert_allclose(compiled(a, b), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(compiled(np.asfortranarray(a), b[:, :]), want, rtol=1e-12, atol=1e-12)
    assert compiled.scheduler == "contraction"


def test_a_result_narrower_than_a_tile_is_not_blocked():
    A, Bm = Var("A"), Var("B")
    k = Idx("k")
    f = Func([("A", TTensor(4, TTensor(3, R))), ("B", TTensor(3, TTensor(5, R)))],
             Gen(i, 4, Gen(j, 5, Sum(k, 3, A[i, k] * Bm[k, j]))))
    a, b = np.arange(12.0).reshape(4, 3), np.arange(15.0).reshape(3, 5)
    compiled = f.compiled("halide", autoschedule=True)
    np.testing.assert_allclose(compiled(a, b), a @ b)
    assert compiled.scheduler != "contraction"
