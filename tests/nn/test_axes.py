"""`split_axis` / `merge_axes`: values and gradients against NumPy's reshape, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_gradients, weighted_loss

import einjit as ej
from einjit import train


def test_split_is_a_row_major_reshape():
    v = np.arange(2 * 3 * 12, dtype=np.float32).reshape(2, 3, 12)
    y = ej.split_axis(ej.ndarray(v, batch_axes=1, label="x"), 4)
    np.testing.assert_array_equal(train.forward_once(y), v.reshape(2, 3, 4, 3))


def test_split_of_a_middle_axis_and_merge_back():
    v = np.random.default_rng(0).standard_normal((2, 6, 5)).astype(np.float32)
    x = ej.ndarray(v, batch_axes=1, label="x")
    y = ej.split_axis(x, 3, axis=0)
    z = ej.merge_axes(y, axis=0)
    np.testing.assert_array_equal(train.forward_once(z), v)
    np.testing.assert_array_equal(train.forward_once(ej.split_axis(ej.ndarray(v, batch_axes=1), 3, axis=0)),
                                  v.reshape(2, 3, 2, 5))


def test_merge_is_a_row_major_reshape():
    v = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
    z = ej.merge_axes(ej.ndarray(v, batch_axes=1, label="x"))
    np.testing.assert_array_equal(train.forward_once(z), v.reshape(2, 12))


def test_split_and_merge_gradients_float64():
    rng = np.random.default_rng(1)
    with ej.default_precision("double"):
        x = ej.param("x", values=rng.standard_normal(12), output_dims=[12])
        y = ej.split_axis(x, 3)
        loss = weighted_loss(ej.merge_axes(y * y), rng)
        train.init_params(loss)
        check_gradients(loss, [x])


def test_split_gradient_is_the_reshaped_upstream_gradient():
    rng = np.random.default_rng(2)
    r = rng.standard_normal((4, 2))
    with ej.default_precision("double"):
        x = ej.param("x", values=rng.standard_normal(8), output_dims=[8])
        loss = ej.sum(ej.split_axis(x, 4) * ej.ndarray(r))
        train.init_params(loss)
        train.to_routine(train.grad_update(loss), name="split_grad")()
    np.testing.assert_allclose(x.grad.numpy(), r.reshape(8), rtol=0, atol=0)


def test_a_split_that_does_not_divide_is_refused():
    x = ej.ndarray(np.zeros((2, 10), np.float32), batch_axes=1, label="feat")
    with pytest.raises(ej.ShapeError, match=r"split_axis of feat: cannot split output axis -1 of 10 cells into 4"):
        ej.split_axis(x, 4)
    with pytest.raises(ej.ShapeError, match="out of range"):
        ej.split_axis(x, 2, axis=3)
    with pytest.raises(ej.ShapeError, match="needs two output axes"):
        ej.merge_axes(x)
