"""Shape-inference semantics that follow OCANNL (issue 14 item 1): fixed indices bound their
axis from below and give the result a dimension-1 axis, and a strided read of a convolution's
result does not decide the convolution's size."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def test_fixed_index_on_the_result_keeps_a_dimension_one_axis():
    xs = np.array([1.0, 2.0, 4.0])
    x = ej.ndarray(xs, label="x")
    total = ej.sum(x, "i => 0")
    y = x - total
    np.testing.assert_array_equal(train.forward_once(y), xs - 7.0)
    assert str(total.shape) == "1"


def test_keepdims_reduction_with_a_batch_row():
    xs = np.arange(6.0).reshape(2, 3)
    x = ej.ndarray(xs, label="x", batch_axes=1)
    row_sums = ej.sum(x, "...|i => ...|0")
    y = x - row_sums
    np.testing.assert_array_equal(train.forward_once(y), xs - xs.sum(axis=1, keepdims=True))
    assert str(row_sums.shape) == "2|1"


def test_a_fixed_index_grows_an_unknown_axis_to_fit():
    x = ej.param("x")
    y = ej.einsum("i2 => i", x) + ej.ndarray(np.zeros(4), label="z")
    got = train.forward_once(y)
    assert str(x.shape) == "4,3"
    np.testing.assert_array_equal(got, x.value.numpy()[:, 2])


def test_a_fixed_index_on_the_result_past_zero_sizes_the_axis():
    x = ej.ndarray(np.array([1.0, 2.0]), label="x")
    y = ej.sum(x, "i, => 2,")
    np.testing.assert_array_equal(train.forward_once(y), [0.0, 0.0, 3.0])


def test_a_fixed_index_out_of_a_known_axis_is_still_an_error():
    x = ej.ndarray(np.array([1.0, 2.0]), label="x")
    with pytest.raises(ej.ShapeError, match="fixed index 5 is out of range"):
        train.forward_once(ej.einsum("5, => ", x))


@pytest.mark.parametrize("n, expect", [(8, 3), (9, 4)])
def test_strided_read_after_a_convolution_takes_the_convolutions_size(n, expect):
    """`2*p+0` after a valid convolution: p is ceil(conv/2); with p known from elsewhere, the
    convolution's extent comes from its own input, not from the strided read."""
    img, ker = np.arange(float(n)), np.array([1.0, -1.0, 2.0])
    conv = ej.einsum("o+k, ;k, => o,", ej.ndarray(img, label="img"), ej.ndarray(ker, label="k"))
    pooled = ej.einsum("2*p+0, => p,", conv)
    y = pooled + ej.ndarray(np.zeros(expect), label="z")
    ref = np.array([img[o:o + 3] @ ker for o in range(n - 2)])
    np.testing.assert_allclose(train.forward_once(y), ref[::2])
    assert str(conv.shape) == str(n - 2)


def test_strided_read_alone_sizes_an_unknown_argument_minimally():
    x = ej.param("x")
    y = ej.einsum("2*p+1, => p,", x) + ej.ndarray(np.zeros(3), label="z")
    train.forward_once(y)
    assert str(x.shape) == "6"
