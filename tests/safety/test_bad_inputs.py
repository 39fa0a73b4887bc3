"""Every bad input of issue 15 gets an einjit exception naming what is wrong, never a NumPy or
Python exception from inside, nor a silently changed value."""

from __future__ import annotations

import datetime
import sys

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.shape.einsum import MAX_NUMBER, parse_einsum
from einjit.tensor import cd_syntax


def x3():
    return ej.ndarray(np.array([1.0, 2.0, 3.0]))


BAD = {
    "complex literal": (lambda: ej.ndarray([1 + 2j, 3.0]), ej.TensorError, "element [0] is complex"),
    "complex array": (lambda: ej.ndarray(np.array([1 + 2j])), ej.TensorError, "complex dtype"),
    "complex number": (lambda: ej.number(1 + 2j), ej.TensorError, "must be a real number"),
    "complex as operand": (lambda: x3() + (1 + 2j), ej.TensorError, "cannot use a complex"),
    "datetime array": (lambda: ej.ndarray(np.array(["2020-01-01"], dtype="datetime64[D]")), ej.TensorError,
                       "datetime dtype"),
    "timedelta array": (lambda: ej.ndarray(np.array([1], dtype="timedelta64[s]")), ej.TensorError,
                        "timedelta dtype"),
    "datetime element": (lambda: ej.ndarray([datetime.datetime(2020, 1, 1)]), ej.TensorError,
                         "element [0] is datetime"),
    "None element": (lambda: ej.ndarray([[1.0, 2.0], [None, 4.0]]), ej.TensorError, "element [1][0] is NoneType"),
    "object array with a string": (lambda: ej.ndarray(np.array([1, "a"], dtype=object)), ej.TensorError,
                                   "element [1] is str"),
    "string elements": (lambda: ej.ndarray(["a", "b"]), ej.TensorError, "element [0] is str"),
    "string array": (lambda: ej.ndarray(np.array(["a"])), ej.TensorError, "string dtype"),
    "bytes array": (lambda: ej.ndarray(np.array([b"a"])), ej.TensorError, "bytes dtype"),
    "ragged rows": (lambda: ej.ndarray([[1.0, 2.0], [3.0]]), ej.TensorError, "[1] has 1 elements, expected 2"),
    "ragged depth": (lambda: ej.ndarray([[1.0, 2.0], 3.0]), ej.TensorError, "[1] is 3.0 where a sequence"),
    "ragged deeper": (lambda: ej.ndarray([[1.0, [2.0]], [3.0, 4.0]]), ej.TensorError,
                      "[0][1] is a sequence where a number"),
    "nested too deep": (lambda: ej.ndarray(_deep(40)), ej.TensorError, "nested more than 32 levels"),
    "negative batch axes": (lambda: ej.ndarray(np.zeros((2, 3)), batch_axes=-1), ej.TensorError,
                            "batch_axes must be at least 0, got -1"),
    "negative input axes": (lambda: ej.ndarray(np.zeros((2, 3)), input_axes=-2), ej.TensorError,
                            "input_axes must be at least 0, got -2"),
    "float axis count": (lambda: ej.ndarray(np.zeros((2, 3)), batch_axes=1.5), ej.TensorError,
                         "batch_axes must be an int"),
    "too many axes": (lambda: ej.ndarray(np.zeros((2, 3)), batch_axes=2, input_axes=1), ej.TensorError,
                      "cannot have 2 batch and 1 input axes"),
    "negative range": (lambda: ej.range(-3), ej.TensorError, "range's length must be at least 1, got -3"),
    "float range": (lambda: ej.range(2.5), ej.TensorError, "range's length must be an int"),
    "string number": (lambda: ej.number("3"), ej.TensorError, "must be a real number"),
    "None number": (lambda: ej.number(None), ej.TensorError, "got NoneType None"),
    "unknown precision": (lambda: ej.ndarray([1.0], prec="float128"), ej.ops.PrecisionError,
                          "unknown or unsupported precision 'float128'; use one of bf16, bfloat16, byte, double"),
    "param complex values": (lambda: ej.param("pc", values=[1 + 1j]), ej.TensorError,
                             "initial values of parameter pc: element [0] is complex"),
    "param ragged values": (lambda: ej.param("pr", values=[[1.0], [2.0, 3.0]]), ej.TensorError,
                            "initial values of parameter pr is ragged"),
    "param None values": (lambda: ej.param("pn", values=[1.0, None]), ej.TensorError, "element [1] is NoneType"),
    "einsum None": (lambda: ej.einsum(None, x3()), ej.TensorError, "einsum spec must be a str"),
    "einsum int": (lambda: ej.einsum(3, x3()), ej.TensorError, "einsum spec must be a str"),
    "sum with a list of specs": (lambda: ej.sum(x3(), ["i=>"]), ej.TensorError,
                                 "einsum spec (str) or axes (int or sequence of ints), got 'i=>' (str)"),
    "max with a float axis": (lambda: ej.max(x3(), 1.0), ej.TensorError, "got 1.0 (float)"),
    "einsum non-ASCII digit": (lambda: ej.einsum("i=>\u0663", x3()), ej.ShapeError, "unexpected character"),
    "einsum non-ASCII digit, multi": (lambda: ej.einsum("i=>\u0663,j", x3()), ej.ShapeError,
                                      "unexpected character"),
    "einsum superscript digit": (lambda: ej.einsum("i=>\u00b2", x3()), ej.ShapeError, "unexpected character"),
    "einsum non-ASCII letter": (lambda: ej.einsum("\u00e9=>\u00e9", x3()), ej.ShapeError, "unexpected character"),
    "einsum 5000 digits": (lambda: ej.einsum("i=>" + "9" * 5000, x3()), ej.ShapeError, "5000 digits) is too large"),
    "einsum huge coefficient": (lambda: ej.einsum("i=>99999999999*i,", x3()), ej.ShapeError, "is too large"),
    "batch_slice of an int": (lambda: ej.batch_slice(x3(), 3), ej.TensorError, "takes a StaticSymbol"),
    "embed_symbol of a str": (lambda: ej.embed_symbol("s"), ej.TensorError, "takes a StaticSymbol"),
    "static range -1": (lambda: ej.get_static_symbol(-1), ej.EinjitError, "must be None or an int at least 1, got -1"),
    "static range str": (lambda: ej.get_static_symbol("3"), ej.EinjitError, "got '3'"),
    "static name": (lambda: ej.get_static_symbol(3, "a b"), ej.EinjitError, "must be an identifier"),
    "param label int": (lambda: ej.param(3), ej.TensorError, "label must be a str or a list of str"),
    "param dims int": (lambda: ej.param("pd", output_dims=3), ej.TensorError, "output_dims must be a list"),
    "label int": (lambda: ej.relu(x3(), label=3), ej.TensorError, "label of a relu must be a str or a list of str"),
    "label list of int": (lambda: ej.add(x3(), 1.0, label=[1]), ej.TensorError, "must be a str or a list of str"),
    "dict literal": (lambda: ej.ndarray({"a": 1}), ej.TensorError, "it is a dict"),
    "unknown default precision": (lambda: ej.set_default_precision("quad"), ej.ops.PrecisionError,
                                  "unknown or unsupported precision 'quad'"),
    "cd None": (lambda: ej.cd(None), ej.CdSyntaxError, "must be a str"),
    "cd bytes": (lambda: ej.cd(b'"t" =: a'), ej.CdSyntaxError, "got bytes"),
    "cd list (unhashable)": (lambda: ej.cd(['"t" =: a']), ej.CdSyntaxError, "got list"),
    "cd nested parentheses": (lambda: ej.cd('"t" =: ' + "(" * 5000 + "a" + ")" * 5000, a=x3()), ej.CdSyntaxError,
                              "nested more than 64 levels"),
    "cd nested calls": (lambda: ej.cd('"t" =: ' + "exp(" * 100 + "a" + ")" * 100, a=x3()), ej.CdSyntaxError,
                        "nested more than 64 levels"),
    "cd prefix minus chain": (lambda: ej.cd('"t" =: ' + "- " * 3000 + "a", a=x3()), ej.CdSyntaxError,
                              "nested more than 64 levels"),
    "cd power chain": (lambda: ej.cd('"t" =: ' + " ** ".join(["a"] * 500), a=x3()), ej.CdSyntaxError,
                       "nested more than 64 levels"),
    "cd long sum": (lambda: ej.cd('"t" =: ' + " + ".join(["a"] * 3000), a=x3()), ej.CdSyntaxError,
                    "more than 256 operations deep"),
    "cd nested blocks": (lambda: ej.cd('~~("c"; ' * 100 + '"t" =: a' + ")" * 100, a=x3()), ej.CdSyntaxError,
                         "nested more than 64 levels"),
    "cd non-ASCII digit": (lambda: ej.cd('"t" =: a * \u0663', a=x3()), ej.CdSyntaxError, "unexpected character"),
}


def _deep(n):
    v = 1.0
    for _ in range(n):
        v = [v]
    return v


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_gets_a_named_error(case):
    make, error, fragment = BAD[case]
    with pytest.raises(error) as info:
        make()
    assert isinstance(info.value, ej.EinjitError)
    assert fragment in str(info.value)


@pytest.mark.parametrize("data_prec", ["single", None], ids=["single data", "float64 data"])
def test_nesting_limits_leave_room_below_them(data_prec):
    """Exactly at the limits the text parses and compiles, well inside Python's recursion
    limit even from a deep stack; one more level is refused. With float64 data (the default
    for a NumPy float64 array) the results are single: a chain of mixed-precision operations."""
    a = ej.ndarray(np.array([1.0, 2.0, 3.0]), prec=data_prec)
    ok = '"t" =: ' + "(" * cd_syntax.MAX_NESTING + "a" + ")" * cd_syntax.MAX_NESTING
    code = ej.cd(ok, a=a)
    chain = ej.cd('"u" =: ' + " + ".join(["a"] * (cd_syntax.MAX_DEPTH + 1)), a=a)
    code.t.hosted()
    chain.u.hosted()

    def deep_stack(k):
        return deep_stack(k - 1) if k else train.to_routine([code, chain], name="at_limits")()

    deep_stack(sys.getrecursionlimit() // 4)
    np.testing.assert_array_equal(code.t.value.numpy(), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(chain.u.value.numpy(), [257.0, 514.0, 771.0])
    too_deep = '"t" =: ' + "(" * (cd_syntax.MAX_NESTING + 1) + "a" + ")" * (cd_syntax.MAX_NESTING + 1)
    with pytest.raises(ej.CdSyntaxError, match="column 72: nested"):
        ej.cd(too_deep, a=a)


def test_einsum_numbers_up_to_the_bound_parse():
    assert parse_einsum(f"i=>{MAX_NUMBER}").lhs.output.axes[0].index == MAX_NUMBER
    assert parse_einsum("i=>000000000000007").lhs.output.axes[0].index == 7
    with pytest.raises(ej.ShapeError, match="column 4: number 2147483648 is too large"):
        parse_einsum(f"i=>{MAX_NUMBER + 1}")


def test_accepted_literals_keep_their_values():
    """Validation does not change what is valid: bools, ints (even beyond 2**63), NumPy
    scalars, integer and boolean arrays, nested tuples and lists, inf and NaN."""
    t = ej.ndarray([[True, 2], [np.float32(0.5), 2**70]], prec="double")
    np.testing.assert_array_equal(t.value_tn.array, [[1.0, 2.0], [0.5, 2.0**70]])
    u = ej.ndarray(np.array([[1, 2, 3]], dtype=np.int16), input_axes=1)
    assert u.value_tn.array.dtype == np.float32 and u.value_tn.array.ravel().tolist() == [1.0, 2.0, 3.0]
    v = ej.ndarray(np.array([1.0, np.nan, np.inf], dtype=object), prec=ej.ops.double)
    np.testing.assert_array_equal(v.value_tn.array, [1.0, np.nan, np.inf])
    assert ej.number(np.float64(2.5)).own_forward is not None


def test_the_root_class_catches_everything_above():
    """`except einjit.EinjitError` is enough for all of them."""
    for make, _, _ in BAD.values():
        try:
            make()
        except ej.EinjitError:
            continue
        pytest.fail("no error")
