"""Training loops keep their promises: `fit.fit` follows the optimizers' LR schedules step by
step, an empty loader is refused, gradient clipping matches PyTorch (and a NumPy reference),
BatchNorm refuses one value per channel in training, and bad arguments are `EinjitError`s."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import data, fit, nn, train
from einjit.errors import EinjitError
from einjit.nn import schedules


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def _linear_loss(n_batch: int = 4):
    """A loss whose gradient with respect to `p` is exactly 1 per cell: each SGD step moves `p`
    by exactly the learning rate of that step."""
    p = ej.param("lin_p", values=[0.0])
    x = ej.input("lin_x", batch_dims=[n_batch])
    loss = ej.sum(p + 0 * x, label="lin_loss") / n_batch
    return p, x, loss


@pytest.mark.parametrize("manual", [False, True])
def test_fit_gives_the_schedules_lr_at_every_step(manual):
    p, x, loss = _linear_loss()
    schedule = schedules.cosine(0.5, 12, 0.01)
    opt = nn.SGD(loss, lr=schedule)
    step = fit.train_step(loss, opt.update(), inputs=[x])
    loader = data.Loader(np.zeros(16), batch_size=4, seed=0)
    trajectory = []
    if manual:  # a hand-written loop that also calls opt.step() advances the schedule once, not twice
        for epoch in range(3):
            for (xb,) in loader.epoch(epoch):
                opt.step()
                step(xb)
                trajectory.append(p.numpy()[0])
    else:
        for epoch in range(3):
            fit.fit(step, loader, epochs=1, start_epoch=epoch, progress=False)
            trajectory.extend([None] * 3 + [p.numpy()[0]])
    lrs = [schedule(k) for k in range(12)]
    expected = -np.cumsum(lrs)
    got = [v for v in trajectory if v is not None]
    np.testing.assert_allclose(got, expected[3::4] if not manual else expected, rtol=0, atol=1e-12)
    assert opt.steps == 12 and opt.lr.numpy()[0] == lrs[-1]


def test_every_step_of_fit_uses_its_own_lr():
    p, x, loss = _linear_loss()
    schedule = schedules.linear_warmup(schedules.step_decay(0.3, 3, 0.5), 2)
    opt = nn.SGD(loss, lr=schedule)
    step = fit.train_step(loss, opt.update(), inputs=[x])
    seen = []
    for epoch in range(8):
        fit.fit(step, data.Loader(np.zeros(4), batch_size=4), epochs=1, start_epoch=epoch, progress=False)
        seen.append(p.numpy()[0])
    np.testing.assert_allclose(-np.diff([0.0, *seen]), [schedule(k) for k in range(8)], rtol=0, atol=1e-12)


def test_a_loader_without_batches_is_an_error():
    _, x, loss = _linear_loss(16)
    step = fit.train_step(loss, train.sgd_update(loss, 0.1), inputs=[x])
    with pytest.raises(data.DataError, match=r"batch_size 16 with drop_last=True drops all 10 rows"):
        data.Loader(np.zeros(10), batch_size=16)
    with pytest.raises(data.DataError, match=r"the loader yields no batch: 0 rows"):
        fit.fit(step, data.Loader(np.zeros(0), batch_size=16), epochs=1, progress=False)


@pytest.mark.parametrize("bad", [2.5, "4", True, None])
def test_loader_batch_size_must_be_an_integer(bad):
    with pytest.raises(data.DataError, match="batch_size must be an integer"):
        data.Loader(np.zeros(10), batch_size=bad)


def test_predict_without_arrays_names_the_inputs():
    x = ej.input("pred_x", batch_dims=[2], output_dims=[3])
    step = fit.forward_step(ej.sum(x, "b|->i => b|->0", label="pred_sum"), inputs=[x])
    with pytest.raises(EinjitError, match=r"takes 1 arrays \(for \['pred_x'\]\), got 0"):
        fit.predict(step)
    np.testing.assert_array_equal(fit.predict(step, np.ones((3, 3))).ravel(), [3.0, 3.0, 3.0])


def test_cross_entropy_labels_of_the_wrong_shape_are_an_einjit_error():
    logits = ej.input("ce_logits", batch_dims=[4], output_dims=[3])
    with pytest.raises(EinjitError, match=r"labels of shape \(3,\) do not fit the batch axes \[4\]"):
        nn.cross_entropy(logits, np.array([0, 1, 2]))
    with pytest.raises(EinjitError, match=r"labels of shape \(4, 2\)"):
        nn.cross_entropy(logits, np.zeros((4, 2), dtype=int))
    loss = nn.cross_entropy(logits, np.array([[0], [1], [2], [1]]))
    logits.set_values(np.log(np.array([[1, 1, 2], [1, 2, 1], [3, 1, 1], [1, 1, 1]], dtype=float)))
    expected = -np.mean(np.log([1 / 4, 2 / 4, 1 / 5, 1 / 3]))
    np.testing.assert_allclose(train.forward_once(loss).ravel(), [expected], rtol=1e-12)


# ------------------------------------------------------------------ gradient clipping


def _clip_reference(grads: list[np.ndarray], max_norm: float) -> list[np.ndarray]:
    """torch.nn.utils.clip_grad_norm_ in NumPy: one global L2 norm, scaled by at most 1."""
    total = np.sqrt(sum(float(np.sum(g * g)) for g in grads))
    return [g * min(1.0, max_norm / (total + 1e-6)) for g in grads]


@pytest.mark.parametrize("max_norm", [0.05, 1.0, 1e6])
def test_clip_grad_norm_matches_the_reference_and_torch(max_norm):
    rng = np.random.default_rng(7)
    w0, b0 = rng.standard_normal((5, 3)), rng.standard_normal(5)
    xs = rng.standard_normal((8, 3))
    w = ej.param("clip_w", output_dims=[5], input_dims=[3])
    b = ej.param("clip_b", values=b0)
    x = ej.input("clip_x", batch_dims=[8], output_dims=[3])
    h = w @ x + b
    loss = ej.mean(h * h, label="clip_loss")
    w.set_values(w0)
    clip = nn.ClipGradNorm(loss, max_norm)
    step = fit.train_step(loss, clip.code(), inputs=[x])
    step(xs)
    pre = 2 * (xs @ w0.T + b0) / (8 * 5)  # d mean(h^2) / dh
    grads = [pre.T @ xs, pre.sum(0)]
    expected = _clip_reference(grads, max_norm)
    np.testing.assert_allclose(w.grad.numpy(), expected[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), expected[1], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(clip.total_norm(), np.sqrt(sum(np.sum(g * g) for g in grads)), rtol=1e-12)
    torch = pytest.importorskip("torch", reason="the PyTorch comparison needs torch")
    tw, tb = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    th = torch.tensor(xs) @ tw.T + tb
    (th * th).mean().backward()
    norm = torch.nn.utils.clip_grad_norm_([tw, tb], max_norm)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(clip.total_norm(), float(norm), rtol=1e-6)


def test_clipping_runs_before_the_update():
    w = ej.param("cu_w", values=[3.0, 4.0])
    x = ej.input("cu_x", batch_dims=[1])
    loss = ej.sum(w * 1 + 0 * x, label="cu_loss")  # gradient (1, 1), norm sqrt(2)
    step = fit.train_step(loss, [nn.clip_grad_norm(loss, 0.5), train.sgd_update(loss, 1.0)], inputs=[x])
    step(np.zeros(1))
    np.testing.assert_allclose(w.numpy(), [3.0 - 0.5 / (np.sqrt(2) + 1e-6), 4.0 - 0.5 / (np.sqrt(2) + 1e-6)],
                               rtol=1e-12)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1", None])
def test_clip_max_norm_must_be_positive(bad):
    w = ej.param("cb_w", values=[1.0])
    with pytest.raises(EinjitError, match="max_norm must be a positive finite number"):
        nn.clip_grad_norm(ej.sum(w * w), bad)


# ------------------------------------------------------------------ BatchNorm on one value per channel


def test_batchnorm_refuses_one_value_per_channel_in_training_like_pytorch():
    bn = nn.BatchNorm(3, label="bn_one")
    x = ej.input("bn_one_x", batch_dims=[1], output_dims=[3])
    y = bn(x)
    train.init_params(y)
    with pytest.raises(EinjitError, match=r"BatchNorm bn_one: Expected more than 1 value per channel when training"):
        fit.forward_step(y, inputs=[x])
    torch = pytest.importorskip("torch", reason="the PyTorch comparison needs torch")
    with pytest.raises(ValueError, match=r"Expected more than 1 value per channel when training"):
        torch.nn.BatchNorm1d(3)(torch.zeros(1, 3))


def test_batchnorm_of_one_sample_in_eval_predicts_and_keeps_its_statistics():
    bn = nn.BatchNorm(3, label="bn_eval")
    bn.running_mean.set_values([1.0, 2.0, 3.0])
    bn.running_var.set_values([4.0, 1.0, 0.25])
    bn.eval()
    x = ej.input("bn_eval_x", batch_dims=[1], output_dims=[3])
    y = bn(x)
    train.init_params(y)
    step = fit.forward_step(y, inputs=[x])
    np.testing.assert_allclose(step(np.array([[3.0, 3.0, 3.0]])).ravel(),
                               [2 / np.sqrt(4 + 1e-5), 1 / np.sqrt(1 + 1e-5), 0.0], rtol=1e-9)
    bn.train()  # switched to training after compiling: the running statistics stay finite and unchanged
    step(np.array([[5.0, 6.0, 7.0]]))
    np.testing.assert_array_equal(bn.running_var.numpy(), [4.0, 1.0, 0.25])
    np.testing.assert_array_equal(bn.running_mean.numpy(), [1.0, 2.0, 3.0])


def test_data_parallel_steps_follow_the_schedule():
    from einjit.ir.indexing import get_static_symbol
    from einjit.training import parallel
    devices, shard, n_batches = 2, 3, 4
    batch_n = get_static_symbol(n_batches, "dp_batch")
    x = ej.batch_slice(ej.ndarray(np.ones((n_batches, shard, 1)), batch_axes=2), batch_n)
    p = ej.param("dp_p", values=[0.0])
    loss = ej.div(ej.sum(p + 0 * x, "...|... => 0"), devices * shard)  # summed over replicas: gradient 1
    schedule = schedules.cosine(0.4, 6, 0.02)
    opt = nn.SGD([p], lr=schedule)
    seen = []
    with parallel.parallel_update(loss, opt.update(), num_devices=devices, bindings=[batch_n], shard=batch_n) as dp:
        for k in range(6):
            dp.bindings[batch_n].value = k % (n_batches // devices)
            dp.step()
            dp.sync()
            seen.append(p.numpy()[0])
    np.testing.assert_allclose(-np.diff([0.0, *seen]), [schedule(k) for k in range(6)], rtol=0, atol=1e-12)
