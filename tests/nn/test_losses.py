"""Losses against NumPy (float32), their gradients against finite differences (float64), and
their stability for logits of 1e4."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_gradients

import einjit as ej
from einjit import nn, train


def _lse(z):
    m = z.max(-1, keepdims=True)
    return (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[:, 0]


Z = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32) * 3
LABELS = np.array([0, 3, 1, 1, 2, 0])
HOT = np.eye(4, dtype=np.float32)[LABELS]
Y01 = (np.random.default_rng(1).uniform(size=(6, 4)) > 0.5).astype(np.float32)
PM1 = 2 * Y01 - 1


def _ce_ref(z, hot):
    return _lse(z.astype(np.float64)) - (hot * z).sum(-1)


def _softplus(z):
    return np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))


CASES = {
    "ce_int_mean": (lambda z: nn.cross_entropy(z, LABELS), lambda z: _ce_ref(z, HOT).mean()),
    "ce_int_sum": (lambda z: nn.cross_entropy(z, LABELS, reduction="sum"), lambda z: _ce_ref(z, HOT).sum()),
    "ce_onehot": (lambda z: nn.cross_entropy(z, ej.ndarray(HOT, batch_axes=1)), lambda z: _ce_ref(z, HOT).mean()),
    "mse": (lambda z: nn.mse(z, ej.ndarray(Y01, batch_axes=1)), lambda z: ((z - Y01) ** 2).mean()),
    "mse_sum": (lambda z: nn.mse(z, ej.ndarray(Y01, batch_axes=1), reduction="sum"), lambda z: ((z - Y01) ** 2).sum()),
    "bce": (lambda z: nn.bce_with_logits(z, ej.ndarray(Y01, batch_axes=1)), lambda z: (_softplus(z) - z * Y01).mean()),
    "hinge": (lambda z: nn.hinge(z, ej.ndarray(PM1, batch_axes=1)), lambda z: np.maximum(0, 1 - PM1 * z).mean()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_forward_float32(name):
    build, ref = CASES[name]
    got = train.forward_once(build(ej.ndarray(Z, batch_axes=1, label="logits")))
    np.testing.assert_allclose(got.ravel()[0], ref(Z.astype(np.float64)), rtol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_gradients_float64(name):
    build, _ = CASES[name]
    with ej.default_precision("double"):
        z = ej.param("z", values=Z.astype(np.float64).ravel() * 0.5 + 0.013, output_dims=[6, 4])
        loss = build(ej.einsum("b,c => b|->c", z))
        train.init_params(loss)
        check_gradients(loss, [z])


@pytest.mark.parametrize("name", ["ce_int_mean", "bce"])
def test_losses_of_huge_logits_are_finite_with_finite_gradients(name):
    build, _ = CASES[name]
    big = np.where(Z > 0, 1e4, -1e4).astype(np.float32)
    z = ej.param("zbig", values=big.ravel(), output_dims=[6, 4])
    loss = build(ej.einsum("b,c => b|->c", z))
    train.init_params(loss)
    routine = train.to_routine(train.grad_update(loss))
    routine()
    assert np.isfinite(loss.value.numpy()).all() and np.isfinite(z.grad.numpy()).all()
    np.testing.assert_allclose(loss.value.numpy()[0], CASES[name][1](big.astype(np.float64)), rtol=1e-5)


def test_labels_outside_the_class_range_are_errors():
    z = ej.ndarray(Z, batch_axes=1)
    with pytest.raises(ej.TensorError, match=r"class label 4 at index \(1,\) is outside the class range 0..3"):
        nn.cross_entropy(z, np.array([0, 4, 1, 1, 2, 0]))
    with pytest.raises(ej.TensorError, match="class label -1"):
        nn.one_hot([-1], 3)
    with pytest.raises(ej.TensorError, match="must be integers"):
        nn.one_hot([0.5], 3)


def test_unknown_reduction_is_an_error():
    with pytest.raises(ej.TensorError, match="reduction must be one of"):
        nn.mse(ej.ndarray(Z, batch_axes=1), 0.0, reduction="avg")


def test_per_sample_cross_entropy_times_weights_keeps_the_logits_shape():
    """`reduction="none"` gives one loss per sample; weighting it must not reach back through
    shape inference and give the logits (still open when the loss is built) a size-1 axis."""
    rng = np.random.default_rng(3)
    xv, wv, weights = rng.standard_normal((6, 5)), rng.standard_normal((4, 5)), rng.uniform(size=6)
    with ej.default_precision("double"):
        x = ej.input("x", batch_dims=[6], output_dims=[5], values=xv)
        w = ej.param("w", input_dims=[5], output_dims=[4], values=wv.ravel())
        logits = w @ x
        per_sample = nn.cross_entropy(logits, LABELS, reduction="none").hosted()
        weighted = (per_sample * ej.ndarray(weights, batch_axes=1, label="weights")).hosted()
        loss = ej.sum(weighted, "...|...->... => 0")
        train.init_params(loss)
        routine = train.to_routine(train.grad_update(loss))
        w.value_tn.host_array()[...] = wv.reshape(w.value_tn.host_array().shape)
        routine()
    z = xv @ wv.T
    assert logits.dims == (6, 4) and per_sample.dims == (6,)
    np.testing.assert_allclose(per_sample.value.numpy(), _ce_ref(z, HOT), rtol=1e-12)
    np.testing.assert_allclose(weighted.value.numpy().ravel(), _ce_ref(z, HOT) * weights, rtol=1e-12)
    softmax = np.exp(z - _lse(z)[:, None])
    np.testing.assert_allclose(w.grad.numpy().reshape(4, 5), ((softmax - HOT) * weights[:, None]).T @ xv,
                               rtol=1e-10)
