"""The einjit backend of ATL (``atl/to_assignments.py``): the notebook's programs, guarded
stencils, relations and random programs through einjit's assignments, optimizer and gcc,
against the interpreter and NumPy; and the shape of the code it produces.

Each compile is a gcc call, so compiled functions are shared per module.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atl_notebook import PROGRAMS, args_of, func
from atl_programs import SIGNATURE, programs, random_inputs
from atl_stencils import H, W, blur_func, laplacian_func, masked_matvec_func
from einjit.atl import (
    B,
    Const,
    Eq,
    Func,
    Gen,
    Idx,
    Let,
    Lt,
    Ne,
    NormalForm,
    R,
    Rel,
    Stmt,
    Sum,
    Sym,
    TTensor,
    Var,
    adjoint,
)
from einjit.atl.interpret import interpret
from einjit.atl.ir import Access, IConst, Indicate, IVar, Mul, Pair
from einjit.atl.ir import Gen as GenNode
from einjit.atl.to_assignments import (
    EinjitFunc,
    UnsupportedError,
    compile_normal_form,
    to_assignments,
)
from einjit.atl.values import to_python
from einjit.backends.cc import toolchain as cc
from einjit.ir import assignments as asg
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.passes.tracing import VirtualizeSettings

TOL = dict(rtol=1e-12, atol=1e-12)
i, j, k = Idx("i"), Idx("j"), Idx("k")


def run(f: Func, *args):
    return f.jit_exec(*args, backend="einjit")


def matmul_func(n: int) -> Func:
    A, Bm = Var("A"), Var("B")
    Rnn = TTensor(n, TTensor(n, R))
    return Func([("A", Rnn), ("B", Rnn)], Gen(i, n, Gen(j, n, Sum(k, n, A[i, k] * Bm[k, j]))))


def np_padded_shift(a: np.ndarray, axis: int, by: int) -> np.ndarray:
    """``a`` read at ``index + by`` along ``axis``, zero outside."""
    p = np.pad(a, [(1, 1) if d == axis else (0, 0) for d in range(a.ndim)])
    return np.take(p, np.arange(a.shape[axis]) + 1 + by, axis=axis)


def np_blur(a: np.ndarray) -> np.ndarray:
    b = 0.25 * (np_padded_shift(a, 1, -1) + 2 * a + np_padded_shift(a, 1, 1))
    return 0.25 * (np_padded_shift(b, 0, -1) + 2 * b + np_padded_shift(b, 0, 1))


def np_laplacian(a: np.ndarray) -> np.ndarray:
    return sum(np_padded_shift(a, ax, by) for ax in (0, 1) for by in (-1, 1)) - 4 * a


@pytest.fixture(scope="module")
def notebook_funcs():
    return {name: func(name) for name in PROGRAMS}


@pytest.fixture(scope="module")
def image_funcs():
    return {"blur": blur_func(), "laplacian": laplacian_func(), "masked": masked_matvec_func()}


# ---------------------------------------------------------------- the notebook


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_notebook_programs(notebook_funcs, name):
    f = notebook_funcs[name]
    interpreted = f.interpret(*args_of(name, "C"))
    np.testing.assert_allclose(interpreted, PROGRAMS[name][2], **TOL)
    for order in ("C", "F"):
        got = run(f, *args_of(name, order))
        np.testing.assert_allclose(got, interpreted, **TOL)
        if isinstance(interpreted, np.ndarray):
            assert isinstance(got, np.ndarray) and got.dtype == np.float64
            assert got.flags.c_contiguous
        else:
            assert isinstance(got, float)


def test_arguments_of_any_strides_dtypes_and_writeability(notebook_funcs):
    f = notebook_funcs["Axc"]
    A, x, c = args_of("Axc", "C")
    expected = f.interpret(A, x, c)
    big = np.zeros((6, 6))
    big[::2, ::2] = A
    np.testing.assert_allclose(run(f, big[::2, ::2], x, c), expected, **TOL)
    np.testing.assert_allclose(run(f, A[::-1, ::-1].copy()[::-1, ::-1], x, c), expected, **TOL)
    frozen = A.copy()
    frozen.flags.writeable = False
    np.testing.assert_allclose(run(f, frozen, x, np.broadcast_to(c[2], (3,))), A @ x + c[2], **TOL)
    ints = np.array([[5, 2, 0], [2, 0, 4], [0, 6, 3]])
    np.testing.assert_allclose(run(f, ints, x, c), ints @ x + c, **TOL)


def test_compiled_once_and_results_are_fresh_arrays(notebook_funcs):
    f = notebook_funcs["diag"]
    compiled = f.compiled("einjit")
    assert isinstance(compiled, EinjitFunc) and compiled is f.compiled("einjit")
    x = args_of("diag", "C")[0]
    before = (cc.stats.compiler_invocations, cc.stats.cache_hits)
    out1, out2 = run(f, x), run(f, 2 * x)
    assert (cc.stats.compiler_invocations, cc.stats.cache_hits) == before
    assert out1 is not out2
    np.testing.assert_array_equal(out1, np.diag(x))
    np.testing.assert_array_equal(out2, np.diag(2 * x))
    np.testing.assert_array_equal(x, args_of("diag", "C")[0])


def test_scalar_arguments_statements_and_result():
    s, x, t = Var("s"), Var("x"), Var("t")
    f = Func([("s", R), ("x", TTensor(4, R))],
             Let("t", Sum(i, 4, x[i]), Sum(i, 4, s * x[i] * t + Const(0.1))))
    xv = np.array([1.0, 2.0, 3.0, 4.0])
    got = run(f, 3, xv)
    assert isinstance(got, float)
    assert got == pytest.approx(3 * 10 * 10 + 0.4, rel=1e-15)
    assert got == pytest.approx(f.interpret(3, xv), rel=1e-15)


# ---------------------------------------------------------------- stencils and relations


def test_blur_with_boundary_guards(image_funcs):
    a = np.random.default_rng(0).standard_normal((H, W))
    expected = np_blur(a)
    f = image_funcs["blur"]
    np.testing.assert_allclose(f.interpret(a), expected, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(run(f, a), expected, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(run(f, np.asfortranarray(a)), expected, rtol=1e-13, atol=1e-13)


def test_laplacian(image_funcs):
    a = np.random.default_rng(1).standard_normal((H, W))
    expected = np_laplacian(a)
    np.testing.assert_allclose(image_funcs["laplacian"].interpret(a), expected, rtol=1e-13,
                               atol=1e-13)
    np.testing.assert_allclose(run(image_funcs["laplacian"], a), expected, rtol=1e-13, atol=1e-13)


def test_masked_matvec(image_funcs):
    rng = np.random.default_rng(2)
    M = rng.random((7, 5)) < 0.4
    A, x = rng.standard_normal((7, 5)), rng.standard_normal(5)
    f = image_funcs["masked"]
    np.testing.assert_allclose(run(f, M, A, x), (A * M) @ x, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(run(f, M.astype(np.int8), A, x), (A * M) @ x, rtol=1e-13,
                               atol=1e-13)
    np.testing.assert_allclose(run(f, np.asfortranarray(~M), A, x), (A * ~M) @ x, rtol=1e-13,
                               atol=1e-13)


def test_sparse_matmul_guarded_by_two_relations():
    n, m, p = 4, 5, 3
    A, Bm = Var("A"), Var("B")
    f = Func([("S", TTensor(n, TTensor(m, B))), ("T", TTensor(m, TTensor(p, B))),
              ("A", TTensor(n, TTensor(m, R))), ("B", TTensor(m, TTensor(p, R)))],
             Gen(i, n, Gen(k, p, Sum(j, m, Rel("S", i, j) * A[i, j]
                                     * (Rel("T", j, k) * Bm[j, k])))))
    rng = np.random.default_rng(4)
    S_, T_ = rng.random((n, m)) < 0.5, rng.random((m, p)) < 0.5
    a, b = rng.standard_normal((n, m)), rng.standard_normal((m, p))
    np.testing.assert_allclose(run(f, S_, T_, a, b), (a * S_) @ (b * T_), **TOL)


def test_far_out_of_range_reads_under_guards_are_safe():
    """Guards far outside the data, and relations read outside their extents (not
    members): no read may touch memory there."""
    x = Var("x")
    n = 5
    f = Func([("S", TTensor(n, B)), ("x", TTensor(n, R))],
             Gen(i, n, (i + 1000 < n) * x[i + 1000] + (i - 7 >= 0) * x[i - 7]
                 + Rel("S", i + 1) * x[i + 1] + Rel("S", -1 * i - 1) * x[-1 * i - 1]))
    S_ = np.array([True, False, True, True, True])
    xv = np.arange(1.0, 6.0)
    assert run(f, S_, xv).tolist() == f.interpret(S_, xv).tolist() == [0.0, 3.0, 4.0, 5.0, 0.0]


def test_index_predicates_of_every_kind():
    x = Var("x")
    n = 6
    f = Func([("x", TTensor(n, R))],
             Gen(i, n, Gen(j, n, (((2 * i <= j + 1) | Eq(i, 3)) & ~(i + j >= 7)) * x[j]
                       + (Ne(i, j) & (3 * j - 2 * i < 1)) * x[i])))
    xv = np.random.default_rng(5).standard_normal(n)
    np.testing.assert_allclose(run(f, xv), f.interpret(xv), **TOL)


def test_compiled_adjoint_of_a_guarded_stencil():
    """The zero-padded 3-tap blur is symmetric, so its adjoint is the blur itself."""
    n = 11
    x, t = Var("x"), Var("t")
    blur = Func([("x", TTensor(n, R))],
                Let("t", Gen(i, n, 2.0 * x[i]),
                    Gen(i, n, 0.25 * ((i - 1 >= 0) * x[i - 1] + t[i] + (i + 1 < n) * x[i + 1]))))
    v = np.random.default_rng(9).standard_normal(n)
    np.testing.assert_allclose(run(adjoint(blur, "x"), np.zeros(n), v), blur.interpret(v),
                               rtol=1e-13, atol=1e-14)


# ---------------------------------------------------------------- hand-made normal forms


def test_plain_index_wider_than_the_tensor_is_guarded():
    """``⊞_{i<5} [i<3]·(x[i]·x[i])``: the plain index ``i`` leaves ``x`` (extent 3), which
    lowering cannot see; the read must still never happen out of range, also when the
    product is stored rather than inlined under the indicator."""
    xs, iv, ret = Sym("x"), Sym("i"), Sym("return")
    x = Var(xs, TTensor(3, R))
    read = Access(x, IVar(iv), R)
    body = Indicate(Lt(IVar(iv), IConst(3)), Mul(read, read, R), R)
    nf = NormalForm(((xs, TTensor(3, R)),), (), Stmt(ret, ((iv, 5),), body))
    xv = np.array([1.5, -2.0, 3.0])
    expected = interpret(nf.to_typed_func(), [to_python(TTensor(3, R), xv)])
    assert expected == [2.25, 4.0, 9.0, 0.0, 0.0]
    assert compile_normal_form(nf)(xv).tolist() == expected
    stored = VirtualizeSettings(virtualize=False)
    assert compile_normal_form(nf, settings=stored)(xv).tolist() == expected


def test_constant_index_outside_the_tensor_reads_nothing():
    """``⊞_i [i<0]·x[7]``: the access can only be evaluated under a false predicate."""
    xs, iv, ret = Sym("x"), Sym("i"), Sym("return")
    x = Var(xs, TTensor(3, R))
    body = Indicate(Lt(IVar(iv), IConst(0)), Access(x, IConst(7), R), R)
    nf = NormalForm(((xs, TTensor(3, R)),), (), Stmt(ret, ((iv, 3),), body))
    assert compile_normal_form(nf)(np.ones(3)).tolist() == [0.0, 0.0, 0.0]


def test_unsupported_constructs_are_named():
    xs, ret = Sym("x"), Sym("return")
    x = Var(xs, R)
    with pytest.raises(UnsupportedError, match="Pair"):
        to_assignments(NormalForm(((xs, R),), (), Stmt(ret, (), Mul(x, Pair(x, x), R))))
    iv = Sym("i")
    gen = GenNode(iv, 2, x, TTensor(2, R))
    with pytest.raises(UnsupportedError, match="Gen"):
        to_assignments(NormalForm(((xs, R),), (), Stmt(ret, (), Mul(x, gen, R))))
    with pytest.raises(TypeError, match="unknown options"):
        compile_normal_form(func("tr").normal_form, autoschedule=True)


# ---------------------------------------------------------------- the code produced


def _loops(stmt: ll.LLStmt) -> list[ll.ForLoop]:
    return [s for s in ll.iter_stmts(stmt) if isinstance(s, ll.ForLoop)]


def test_matmul_is_one_vectorizable_assignment():
    n = 8
    f = matmul_func(n)
    tr = to_assignments(f.normal_form)
    (a,) = asg.flatten(tr.asgns)
    assert isinstance(a, asg.AccumBinop) and a.initialize_neutral
    assert (a.accum, a.op) == (ops.Binop.ADD, ops.Binop.MUL)
    compiled = f.compiled("einjit")
    nests = [s for s in ll.flatten(compiled.optimized.llc) if isinstance(s, ll.ForLoop)]
    innermost = _loops(nests[-1])[-1]
    assert innermost.index.name == "j_"  # ikj: unit stride in the result and in B
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    np.testing.assert_allclose(compiled(x, y), x @ y, **TOL)


def test_intermediates_are_virtual(image_funcs):
    """Masks, iotas, constants and sums of terms are inlined: the laplacian is one loop
    nest writing only its result."""
    compiled = image_funcs["laplacian"].compiled("einjit")
    written = {s.tn for s in ll.iter_stmts(compiled.optimized.llc) if isinstance(s, ll.Set)}
    assert written == {compiled.translation.output}
    assert len([s for s in ll.flatten(compiled.optimized.llc)]) == 1


def test_unoptimized_code_agrees():
    """The optimizer's settings pass through: without virtualization every intermediate
    is stored, with the same results."""
    f = blur_func()
    plain = f.compiled("einjit", settings=VirtualizeSettings(virtualize=False, simplify=False))
    a = np.random.default_rng(6).standard_normal((H, W))
    np.testing.assert_allclose(plain(a), np_blur(a), rtol=1e-13, atol=1e-13)


# ---------------------------------------------------------------- random programs


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(max_depth=3), st.integers(0, 2**31))
def test_random_programs_agree_with_the_interpreter(program, seed):
    _, e = program
    f = Func(SIGNATURE, e)
    args = random_inputs(seed)
    expected = f.interpret(*args)
    np.testing.assert_allclose(run(f, *args), expected, rtol=1e-11, atol=1e-11)


def test_fitting_arguments_are_read_in_place_others_copied():
    """A C-contiguous float64 argument of the right shape is handed to the C function as is:
    the input node's host array keeps its old values. Other arguments (strided, another dtype,
    Fortran order) are copied into it first. Every call gives the right product."""
    n = 6
    f = matmul_func(n)
    compiled = f.compiled("einjit")
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    host_a = compiled._inputs[0]
    before = host_a.copy()
    np.testing.assert_allclose(compiled(a, b), a @ b, **TOL)
    np.testing.assert_array_equal(host_a, before)  # read in place, not copied
    for other in (np.asfortranarray(a), a.astype(np.float32), np.repeat(a, 2, axis=1)[:, ::2]):
        np.testing.assert_allclose(compiled(other, b), other.astype(np.float64) @ b, rtol=1e-6)
        np.testing.assert_array_equal(host_a, other)  # copied into the input node
    last = host_a.copy()
    np.testing.assert_allclose(compiled(2 * a, b), 2 * a @ b, **TOL)
    np.testing.assert_array_equal(host_a, last)  # in place again: untouched


def test_an_argument_changed_in_place_or_replaced_reads_its_current_values():
    """The direct call remembers the address of the last array in each slot (`_Address`):
    values changed in place, a new array, an array freed and another allocated, and a
    caller's output array reused or replaced all give the right product."""
    n = 6
    f = matmul_func(n)
    compiled = f.compiled("einjit")
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    np.testing.assert_allclose(compiled(a, b), a @ b, **TOL)
    a *= 3
    np.testing.assert_allclose(compiled(a, b), a @ b, **TOL)
    for _ in range(3):
        fresh = rng.standard_normal((n, n))
        np.testing.assert_allclose(compiled(fresh, b), fresh @ b, **TOL)
        del fresh
    out = np.empty((n, n))
    assert compiled(a, b, output=out) is out
    np.testing.assert_allclose(out, a @ b, **TOL)
    b[0, 0] += 1
    compiled(a, b, output=out)
    np.testing.assert_allclose(out, a @ b, **TOL)
    other = np.empty((n, n))
    compiled(b, a, output=other)
    np.testing.assert_allclose(other, b @ a, **TOL)
    np.testing.assert_allclose(out, a @ b, **TOL)  # the earlier output is left alone
