"""Per-argument precision (seed 000: `scalar_arg = scalar_t * prec`): arguments are read in
their own precision and combined in the widest one, rounded once where the result is stored.
Checked against NumPy, and the compiled C against the IR interpreter, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.ir import assignments as asg
from einjit.ir import interpret, ops


def both(t, literals):
    """`t`'s value from the IR interpreter and from compiled C."""
    code = train.forward(t)
    arrays = interpret.run(asg.to_low_level(code), {x.value_tn: x.value_tn.array.copy() for x in literals})
    interpreted = np.array(arrays[t.value_tn])
    train.to_routine(code, name="mixed")()
    return interpreted, t.value.numpy()


def test_double_inputs_to_a_single_result_are_not_rounded_first():
    av, bv = np.array([1 + 3 * 2.0**-25, 2.0 + 2.0**-30]), np.array([1.0, 2.0])
    a = ej.ndarray(av, label="a", prec=ops.double)
    b = ej.ndarray(bv, label="b", prec=ops.double)
    c = ej.sub(a, b, label="c")
    assert c.value_tn.prec is ops.single
    interpreted, compiled = both(c, [a, b])
    want = (av - bv).astype(np.float32)
    rounded_first = av.astype(np.float32) - bv.astype(np.float32)
    assert not np.array_equal(want, rounded_first)
    np.testing.assert_array_equal(compiled, want)
    np.testing.assert_array_equal(interpreted, want)


def test_single_inputs_to_a_double_result_are_widened_exactly():
    with ej.default_precision("double"):
        av = np.array([1 + 2.0**-20, 3.0], dtype=np.float32)
        a = ej.ndarray(av, label="a", prec=ops.single)
        b = ej.ndarray(av, label="b", prec=ops.single)
        c = ej.mul(a, b, label="c")
    assert c.value_tn.prec is ops.double
    interpreted, compiled = both(c, [a, b])
    want = av.astype(np.float64) ** 2
    assert not np.array_equal(want, (av * av).astype(np.float64))
    np.testing.assert_array_equal(compiled, want)
    np.testing.assert_array_equal(interpreted, want)


def test_a_single_sum_of_double_terms_rounds_once_per_step():
    """The second term is just above half an ulp of 1 in single precision: rounded first it is
    a tie (to even: 1), added in double it rounds up."""
    xv = np.array([1.0, 2.0**-24 + 2.0**-50])
    x = ej.ndarray(xv, label="x", prec=ops.double)
    s = ej.sum(x, "i, => ", label="s")
    interpreted, compiled = both(s, [x])
    acc = np.float32(0.0)
    for v in xv:
        acc = np.float32(np.float64(acc) + v)
    naive = np.float32(0.0)
    for v in xv.astype(np.float32):
        naive = np.float32(naive + v)
    assert acc != naive
    np.testing.assert_array_equal(compiled, [acc])
    np.testing.assert_array_equal(interpreted, [acc])


@pytest.mark.parametrize("prec", [ops.half, ops.single])
@pytest.mark.parametrize("build, ref", [
    (lambda a, b: ej.exp(a), lambda a, b: np.exp(a)),
    (lambda a, b: a * b, lambda a, b: a * b),
    (lambda a, b: ej.maximum(a, b), np.maximum),
])
def test_narrow_results_of_double_arguments(prec, build, ref):
    rng = np.random.default_rng(3)
    av, bv = rng.standard_normal(16), rng.standard_normal(16) + 3.0
    a, b = ej.ndarray(av, label="a", prec=ops.double), ej.ndarray(bv, label="b", prec=ops.double)
    with ej.default_precision(prec):
        c = build(a, b)
    interpreted, compiled = both(c, [a, b])
    np.testing.assert_array_equal(interpreted, compiled)
    np.testing.assert_array_equal(compiled, ref(av, bv).astype(prec.dtype))


@pytest.mark.parametrize("prec", [ops.half, ops.single])
def test_inlined_narrow_intermediates_keep_their_rounding(prec):
    """The optimized C inlines `exp(a)` (stored in `prec` without optimization): it must round
    where the stored node would, so that C and the unoptimized interpreter agree bit for bit."""
    rng = np.random.default_rng(5)
    av, bv = rng.standard_normal(16), rng.standard_normal(16)
    a, b = ej.ndarray(av, label="a", prec=ops.double), ej.ndarray(bv, label="b", prec=ops.double)
    with ej.default_precision(prec):
        c = ej.exp(a) * b - a
    interpreted, compiled = both(c, [a, b])
    np.testing.assert_array_equal(interpreted, compiled)
    e = np.exp(av).astype(prec.dtype).astype(np.float64)
    want = ((e * bv).astype(prec.dtype).astype(np.float64) - av).astype(prec.dtype)
    np.testing.assert_array_equal(compiled, want)
