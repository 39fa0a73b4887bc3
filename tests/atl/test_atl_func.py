"""``Func``: argument checking with the notebook's messages, binding, backend selection."""

import importlib
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
