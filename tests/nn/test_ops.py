"""Reductions and activations: forward values against NumPy (float32), gradients against finite
differences (float64), and the stability cases of issue 12."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gradcheck import check_gradients, weighted_loss

import einjit as ej
from einjit import train
from einjit.tensor import activations as act
from einjit.tensor import reductions as red

_erf = np.vectorize(math.erf)


def _np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


FORWARD = {
    "max_last": (lambda x: red.max(x, axis=-1), lambda v: v.max(-1)),
    "max_batch": (lambda x: red.amax(x, axis=0), lambda v: v.max(0)),
    "min_last": (lambda x: red.min(x, axis=1), lambda v: v.min(1)),
    "max_spec": (lambda x: red.max(x, "b|->o => b|->"), lambda v: v.max(-1)),
    "max_all": (lambda x: red.max(x), lambda v: np.array([v.max()])),
    "sum_axis0": (lambda x: red.sum(x, axis=0), lambda v: v.sum(0)),
    "sum_keep": (lambda x: red.sum(x, axis=-1, keepdims=True), lambda v: v.sum(-1, keepdims=True)),
    "mean_axis": (lambda x: red.mean(x, axis=-1), lambda v: v.mean(-1)),
    "max_keep": (lambda x: red.max(x, axis=-1, keepdims=True), lambda v: v.max(-1, keepdims=True)),
    "max_positional": (lambda x: red.max(x, -1), lambda v: v.max(-1)),
    "min_positional_batch": (lambda x: red.min(x, np.int64(0)), lambda v: v.min(0)),
    "sum_positional_tuple": (lambda x: red.sum(x, (0, 1)), lambda v: np.array([v.sum()])),
    "mean_positional_list": (lambda x: red.mean(x, [-1]), lambda v: v.mean(-1)),
    "logsumexp": (lambda x: red.logsumexp(x), lambda v: np.log(np.exp(v).sum(-1))),
    "softmax": (lambda x: red.softmax(x), _np_softmax),
    "softmax_batch": (lambda x: red.softmax(x, axis=0), lambda v: _np_softmax(v, 0)),
    "log_softmax": (lambda x: red.log_softmax(x), lambda v: np.log(_np_softmax(v))),
    "softplus": (act.softplus, lambda v: np.log1p(np.exp(v))),
    "gelu": (act.gelu, lambda v: v * 0.5 * (1 + _erf(v / np.sqrt(2)))),
    "gelu_tanh": (lambda x: act.gelu(x, approximate="tanh"),
                  lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))),
    "leaky_relu": (lambda x: act.leaky_relu(x, 0.1), lambda v: np.where(v < 0, 0.1 * v, v)),
    "clip": (lambda x: act.clip(x, -0.5, 0.75), lambda v: np.clip(v, -0.5, 0.75)),
    "abs": (act.abs, np.abs),
    "rsqrt": (lambda x: act.rsqrt(act.abs(x) + 0.1), lambda v: 1 / np.sqrt(np.abs(v) + 0.1)),
}


@pytest.mark.parametrize("name", sorted(FORWARD))
def test_forward_matches_numpy_float32(name):
    build, ref = FORWARD[name]
    v = np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32) * 2
    out = build(ej.ndarray(v, batch_axes=1, label="x"))
    got = train.forward_once(out)
    want = ref(v.astype(np.float64))
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(FORWARD))
def test_gradients_float64(name):
    build, _ = FORWARD[name]
    rng = np.random.default_rng(2)
    with ej.default_precision("double"):
        vals = rng.standard_normal((3, 4)) * 1.5
        # keep values away from the kinks of abs / clip / leaky_relu, where differences are not derivatives
        vals = np.where(np.abs(vals) < 0.05, 0.3, vals)
        vals = np.where(np.abs(vals + 0.5) < 0.05, -0.7, vals)
        vals = np.where(np.abs(vals - 0.75) < 0.05, 0.9, vals)
        x = ej.param("x", values=vals.ravel(), output_dims=[3, 4])
        xb = ej.einsum("a,c => c|->a,", x, label="xb")  # the first axis becomes a batch axis
        loss = weighted_loss(build(xb), rng)
        train.init_params(loss)
        check_gradients(loss, [x])


def test_softmax_of_large_logits_is_finite_and_exact():
    v = np.array([[100.0, 200.0, 300.0]])
    got32 = train.forward_once(red.softmax(ej.ndarray(v.astype(np.float32), batch_axes=1))).ravel()
    e32 = np.exp(v.astype(np.float32) - np.float32(300.0)).ravel()
    np.testing.assert_array_equal(got32, e32 / e32.sum())  # float32's own subnormal exp(-100), and 1 exactly
    with ej.default_precision("double"):
        got64 = train.forward_once(red.softmax(ej.ndarray(v, batch_axes=1))).ravel()
    want = np.exp(np.array([-200.0, -100.0, 0.0]))
    np.testing.assert_allclose(got64, want / want.sum(), rtol=1e-14, atol=0)
    assert np.all(np.isfinite(got32)) and got32[2] == 1.0


def test_log_softmax_and_logsumexp_of_huge_logits():
    v = np.array([[1e4, -1e4, 0.0], [3.0, 3.0, 3.0]], np.float32)
    z = ej.ndarray(v, batch_axes=1)
    lse = train.forward_once(red.logsumexp(z))
    np.testing.assert_allclose(lse, [1e4, 3.0 + np.log(3.0)], rtol=1e-6)
    lsm = train.forward_once(red.log_softmax(ej.ndarray(v, batch_axes=1)))
    np.testing.assert_allclose(lsm, [[0.0, -2e4, -1e4], [-np.log(3.0)] * 3], rtol=1e-6, atol=1e-6)


def test_softplus_of_large_inputs_is_linear_and_finite():
    v = np.array([1e4, -1e4, 50.0, -50.0], np.float32)
    got = train.forward_once(act.softplus(ej.ndarray(v)))
    np.testing.assert_allclose(got, [1e4, 0.0, 50.0, np.exp(-50.0)], rtol=1e-6, atol=0)


def test_reduction_over_a_missing_axis_says_so():
    x = ej.ndarray(np.ones((2, 3), np.float32), batch_axes=1, label="xs")
    with pytest.raises(ej.TensorError, match=r"xs over axis 2.*2 known axes"):
        red.sum(x, axis=2)


def test_spec_and_axis_together_are_refused():
    x = ej.ndarray(np.ones((2, 3), np.float32), batch_axes=1)
    with pytest.raises(ej.TensorError, match="not both"):
        red.max(x, "b|->o => b|->", axis=0)


@pytest.mark.parametrize("second,message", [(1.5, r"spec \(str\) or axes .*got 1.5 \(float\)"),
                                            ([0, "a"], r"got 'a' \(str\)"), (True, r"got True \(bool\)")])
def test_a_second_argument_neither_spec_nor_axes_is_named(second, message):
    x = ej.ndarray(np.ones((2, 3), np.float32), batch_axes=1, label="xs")
    with pytest.raises(ej.TensorError, match=r"reducing tensor xs: .*" + message):
        red.max(x, second)


def test_positional_axes_and_axis_together_are_refused():
    x = ej.ndarray(np.ones((2, 3), np.float32), batch_axes=1, label="xs")
    with pytest.raises(ej.TensorError, match=r"xs: axes given twice \(-1 and axis=0\)"):
        red.sum(x, -1, axis=0)


def test_gelu_matches_torch_values_and_gradients():
    torch = pytest.importorskip("torch")
    v = np.linspace(-6, 6, 49)
    for approximate in ("none", "tanh"):
        with ej.default_precision("double"):
            x = ej.param("x", values=v, output_dims=[49])
            loss = ej.sum(act.gelu(x, approximate=approximate) * ej.ndarray(np.cos(v)))
            train.init_params(loss)
            train.to_routine(train.grad_update(loss), name="gelu_grad")()
        tx = torch.tensor(v, requires_grad=True)
        tl = (torch.nn.functional.gelu(tx, approximate=approximate) * torch.tensor(np.cos(v))).sum()
        tl.backward()
        np.testing.assert_allclose(loss.value.numpy().ravel()[0], tl.item(), rtol=1e-13)
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_gelu_tanh_saturates_without_nan_in_single_precision():
    """The tanh form is computed through `exp` (a sigmoid gate): where the `exp` overflows the
    gate is exactly 0, so far-negative inputs give 0 and a zero gradient, far-positive ones x
    and a gradient of 1, and moderate ones PyTorch's values."""
    torch = pytest.importorskip("torch")
    v = np.array([-1e4, -100.0, -30.0, -3.0, -0.5, 0.0, 0.7, 4.0, 30.0, 1e4], np.float32)
    x = ej.param("x", values=v, output_dims=[v.size])
    loss = ej.sum(act.gelu(x, approximate="tanh"))
    train.init_params(loss)
    train.to_routine(train.grad_update(loss), name="gelu_sat")()
    tx = torch.tensor(v, requires_grad=True)
    ty = torch.nn.functional.gelu(tx, approximate="tanh")
    ty.sum().backward()
    assert np.isfinite(x.grad.numpy()).all()
    np.testing.assert_allclose(loss.value.numpy().ravel()[0], ty.sum().item(), rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(x.grad.numpy()[[0, 1, -1]], [0.0, 0.0, 1.0])


def test_gelu_refuses_an_unknown_approximation():
    with pytest.raises(ej.TensorError, match="approximate must be 'none' or 'tanh', got 'fast'"):
        act.gelu(ej.number(1.0), approximate="fast")


def test_clip_bounds_are_checked():
    with pytest.raises(ej.TensorError, match="lo <= hi"):
        act.clip(ej.number(1.0), 1.0, 0.0)


@pytest.mark.parametrize("name", ["gelu", "leaky_relu", "clip", "softplus"])
def test_activations_keep_the_shape_of_a_tensor_without_output_axes(name):
    """Numbers inside a template are read at their one cell; they add no output axis."""
    build, ref = FORWARD[name]
    v = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    per_row = red.sum(ej.ndarray(v, batch_axes=1), axis=-1)
    out = build(per_row)
    got = train.forward_once(out)
    assert out.dims == (4,)
    np.testing.assert_allclose(got, ref(v.astype(np.float64).sum(-1)), rtol=1e-5, atol=1e-6)
