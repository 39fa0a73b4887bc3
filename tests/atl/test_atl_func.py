"""``Func``: argument checking with the notebook's messages, binding, backend selection."""

import importlib
import importlib.util
import sys

import numpy as np
import pytest

from atl_notebook import PROGRAMS, Rn, Rnn, args_of, func, inputs
from einjit.atl import Func, Pair, R, TPair, TTensor, Var
from einjit.atl.values import type_value_match


def test_notebook_type_value_match_messages():
    v = inputs()
    type_value_match(Rnn, v["A"])
    type_value_match(Rn, v["c"])
    type_value_match(R, 3)
    with pytest.raises(TypeError, match=r"^Expected 1 dims, but got an ndarray with 2$"):
        type_value_match(Rn, v["A"])
    with pytest.raises(TypeError, match=r"^expected dimension 0 of tensor shape to be 4, "
                                        r"but it was 3$"):
        type_value_match(TTensor(4, Rn), v["A"])
    with pytest.raises(TypeError, match=r"^Expected 'numpy.ndarray' type value$"):
        type_value_match(Rn, 3.4)
    with pytest.raises(TypeError, match=r"^Expected 'float' or 'int' type value$"):
        type_value_match(R, v["c"])
    with pytest.raises(TypeError, match=r"^Pairs unsupported$"):
        type_value_match(TPair(R, R), (1.0, 2.0))
    with pytest.raises(TypeError, match="real-valued"):
        type_value_match(Rn, np.array(["a", "b", "c"]))


def test_call_errors_name_the_argument():
    f = func("Axc")
    A, x, c = args_of("Axc")
    with pytest.raises(TypeError, match=r"^expected 3 arguments, but was called with 2$"):
        f.interpret(A, x)
    with pytest.raises(TypeError, match=r"^argument 'q' is not an argument of this tensor "
                                        r"function$"):
        f.interpret(A, x, q=c)
    with pytest.raises(TypeError, match=r"^Expected 1 dims, but got an ndarray with 2 "
                                        r"\(argument 'x'\)$"):
        f.interpret(A, A, c)
    with pytest.raises(TypeError, match=r"dimension 0 of tensor shape to be 3, but it was 4"):
        f.interpret(A, np.ones(4), c)
    with pytest.raises(TypeError, match=r"Expected 'numpy.ndarray' type value \(argument 'c'\)"):
        f.jit_exec(A, x, [0.0, 0.0, 1.0])
    with pytest.raises(TypeError, match="could not read a nested list"):
        f.interpret(A, x, [[0.0], 1.0, 2.0])


def test_keyword_arguments_fill_in_around_positional_ones():
    f = func("Axc")
    A, x, c = args_of("Axc")
    expected = PROGRAMS["Axc"][2]
    np.testing.assert_array_equal(f.interpret(A, c=c, x=x), expected)
    np.testing.assert_array_equal(f.interpret(x=x, A=A, c=c), expected)


def test_func_exposes_its_interface_and_normal_form():
    f = func("ctrct")
    assert f.arg_names == ("D", "a", "b")
    assert f.ret_type == Rn and f.out_shape == (3,)
    nf = f.normal_form
    assert nf is f.normal_form
    assert [t for _, t in nf.args] == list(f.arg_types)
    assert repr(f) == "<atl.Func(D:[3][3][3]R, a:[3]R, b:[3]R) : [3]R>"
    assert str(f).startswith("Function(D:[3][3][3]R, a:[3]R, b:[3]R) : [3]R\n")


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown ATL backend 'cuda'"):
        func("tr").jit_exec(args_of("tr")[0], backend="cuda")


def test_pair_results_cannot_be_compiled():
    f = Func([("x", Rn)], Pair(Var("x"), Var("x")))
    with pytest.raises(TypeError, match="return type is a pair"):
        f.jit_exec(np.zeros(3))


def test_missing_halide_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "halide", None)
    from einjit.atl.halide import import_halide
    with pytest.raises(ImportError, match=r"einjit\[halide\]"):
        import_halide()


def test_einjit_backend():
    """Runs the notebook programs when ``to_assignments`` exists; until then the error
    must say what is missing."""
    try:
        importlib.import_module("einjit.atl.to_assignments")
    except ImportError:
        with pytest.raises(ImportError, match="einjit.atl.to_assignments"):
            func("tr").jit_exec(args_of("tr")[0], backend="einjit")
        return
    for name, (_, _, expected, _) in PROGRAMS.items():
        got = func(name).jit_exec(*args_of(name, "C"), backend="einjit")
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ seed 002: run(inputs, output=None)

BACKEND_PARAMS = ["einjit", pytest.param("halide", marks=pytest.mark.skipif(
    importlib.util.find_spec("halide") is None, reason="the Halide backend needs the optional extra einjit[halide]"))]


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_a_supplied_output_buffer_receives_the_result(backend):
    """Seed 002 accepts a pre-allocated output "to prevent possibly unwanted allocations":
    the result is written into it and it is what comes back."""
    f = func("Axc")
    A, x, c = args_of("Axc", "C")
    expected = np.asarray(A) @ np.asarray(x) + np.asarray(c)
    out = np.full(3, np.nan)
    assert f.jit_exec(A, x, c, backend=backend, output=out) is out
    np.testing.assert_allclose(out, expected, rtol=1e-12)
    strided = np.full(6, np.nan)[::2]
    assert f.run({"A": A, "x": x, "c": c}, strided, backend=backend) is strided
    np.testing.assert_allclose(strided, expected, rtol=1e-12)
    scalar = np.zeros(1)
    got = func("tr").run({"A": args_of("tr", "C")[0]}, scalar, backend=backend)
    assert got == scalar[0] == pytest.approx(PROGRAMS["tr"][2])


def test_the_einjit_backend_writes_a_fitting_output_in_place():
    """No copy: a C-contiguous float64 output is the routine's result array for the call,
    so the backend's own result node keeps the previous call's values."""
    f = func("Axc")
    A, x, c = args_of("Axc", "C")
    first = f.jit_exec(A, x, c, backend="einjit")
    compiled = f.compiled("einjit")
    own = compiled._output
    out = np.empty(3)
    f.jit_exec(A, 2 * x, c, backend="einjit", output=out)
    np.testing.assert_allclose(out, np.asarray(A) @ (2 * np.asarray(x)) + np.asarray(c), rtol=1e-12)
    np.testing.assert_array_equal(own, first)
    assert not np.shares_memory(out, own)


@pytest.mark.parametrize("bad, message", [
    (np.zeros(3, dtype=np.float32), r"^output: expected dtype float64, got float32$"),
    (np.zeros(4), r"^output: expected shape \[3\] for the result type \[3\]R, got \[4\]$"),
    (np.zeros((3, 1)), r"^output: expected shape \[3\] for the result type \[3\]R, got \[3, 1\]$"),
    ([0.0, 0.0, 0.0], r"^output: expected a numpy.ndarray of shape \[3\] for the result type \[3\]R, got list$"),
    (np.broadcast_to(np.zeros(1), (3,)), r"^output: the array is read-only$"),
])
def test_a_wrong_output_buffer_is_refused(bad, message):
    from einjit.atl import OutputError
    f = func("Axc")
    with pytest.raises(OutputError, match=message):
        f.jit_exec(*args_of("Axc", "C"), backend="einjit", output=bad)
    with pytest.raises(OutputError, match=r"^output: expected shape \[1\] for an R result, got \[\]$"):
        func("tr").jit_exec(args_of("tr", "C")[0], backend="einjit", output=np.zeros(()))
