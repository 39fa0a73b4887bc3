"""From shape logic through `derive_projections`, assignments, low-level code and the C backend,
to values equal to NumPy: matmul, a reduction, a transpose and strided convolutions."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


rng = np.random.default_rng(11)


def test_compose_is_numpy_matmul_with_batch_axes():
    a = rng.standard_normal((4, 3, 5))   # batch 4, output 3, input 5
    b = rng.standard_normal((4, 5, 2))   # batch 4, output 5, input 2
    ta, tb = ej.ndarray(a, batch_axes=1, input_axes=1), ej.ndarray(b, batch_axes=1, input_axes=1)
    c = ta @ tb
    np.testing.assert_allclose(train.forward_once(c), a @ b, rtol=1e-12)
    assert str(c.shape).startswith("4|2->3")


def test_reduction_over_chosen_axes():
    a = rng.standard_normal((3, 4, 5))
    s = ej.einsum("ijk=>ik", ej.ndarray(a))
    np.testing.assert_allclose(train.forward_once(s), a.sum(axis=1), rtol=1e-12)


def test_transpose_swaps_input_and_output_axes():
    a = rng.standard_normal((2, 3, 4))
    t = ej.transpose(ej.ndarray(a, batch_axes=1, input_axes=1))
    np.testing.assert_allclose(train.forward_once(t), np.transpose(a, (0, 2, 1)), rtol=0)


@pytest.mark.parametrize("stride,dilation", [(1, 1), (2, 1), (2, 2), (3, 1)])
def test_strided_dilated_convolution(stride, dilation):
    n, k = 13, 3
    x, w = rng.standard_normal(n), rng.standard_normal(k)
    y = ej.einsum(f"{stride}*o+{dilation}*k,;k,=>o,", ej.ndarray(x), ej.ndarray(w))
    out = train.forward_once(y)
    n_out = (n - dilation * (k - 1) - 1) // stride + 1
    want = np.array([sum(x[stride * o + dilation * j] * w[j] for j in range(k)) for o in range(n_out)])
    assert out.shape == (n_out,)
    np.testing.assert_allclose(out, want, rtol=1e-12)


def test_two_dimensional_convolution_with_channels():
    img = rng.standard_normal((2, 9, 8))       # channels, height, width
    kern = rng.standard_normal((4, 2, 3, 3))   # out channels, in channels, kh, kw
    y = ej.einsum("c,2*h+p,2*w+q;o,c,p,q=>o,h,w", ej.ndarray(img), ej.ndarray(kern))
    out = train.forward_once(y)
    oh, ow = (9 - 3) // 2 + 1, (8 - 3) // 2 + 1
    want = np.zeros((4, oh, ow))
    for o in range(4):
        for h in range(oh):
            for w_ in range(ow):
                want[o, h, w_] = np.sum(img[:, 2 * h:2 * h + 3, 2 * w_:2 * w_ + 3] * kern[o])
    np.testing.assert_allclose(out, want, rtol=1e-12)
