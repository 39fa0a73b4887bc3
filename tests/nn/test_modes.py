"""`train()` / `eval()` on graphs already built and compiled: the mode is a hosted number the
routine reads, so a model trained with Dropout and BatchNorm predicts in evaluation mode (and
back) from the same compiled routines, as a PyTorch module does."""

from __future__ import annotations

import numpy as np

import einjit as ej
from einjit import fit, nn, train


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 8, label="mode_fc1"), nn.BatchNorm(8, momentum=0.3, label="mode_bn"),
                         nn.ReLU(), nn.Dropout(0.5, seed=3, label="mode_drop"), nn.Linear(8, 3, label="mode_fc2"))


def _eval_reference(model: nn.Sequential, x: np.ndarray) -> np.ndarray:
    w1, b1, w2, b2 = (p.value.numpy() for p in (model.layers[0].params() + model.layers[4].params()))
    bn = model.layers[1]
    gamma, beta = (p.value.numpy() for p in bn.params())
    h = x @ w1.T + b1
    h = (h - bn.running_mean.value.numpy()) / np.sqrt(bn.running_var.value.numpy() + bn.eps) * gamma + beta
    return np.maximum(h, 0) @ w2.T + b2


def test_eval_after_training_switches_compiled_routines_and_train_resumes():
    rng = np.random.default_rng(0)
    data = rng.standard_normal((64, 6)).astype(np.float32)
    labels = (data[:, 0] > 0).astype(int) + (data[:, 1] > 0).astype(int)
    model = _model()
    x = ej.input("mode_x", batch_dims=[16], output_dims=[6])
    y = ej.input("mode_y", batch_dims=[16], output_dims=[3])
    loss = nn.cross_entropy(model(x), y, label="mode_loss")
    opt = nn.SGD(loss, 0.1, momentum=0.9)
    train.init_params(loss, seed=1)
    step = fit.train_step(loss, opt.update(), inputs=[x, y], name="mode_train")
    predict = fit.predictor(model, batch_dims=[5], output_dims=[6])  # compiled in training mode
    hot = nn.one_hot(labels, 3)
    for k in range(12):
        opt.step()
        step(data[16 * (k % 4):16 * (k % 4 + 1)], hot[16 * (k % 4):16 * (k % 4 + 1)])
    running = model.layers[1].running_mean.value.numpy()
    assert np.abs(running).max() > 0.01

    model.eval()
    sample = data[:5]
    first, second = predict(sample), predict(sample)
    np.testing.assert_allclose(first, _eval_reference(model, sample), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(model.layers[1].running_mean.value.numpy(), running)

    model.train()
    a, b = predict(sample), predict(sample)
    assert not np.allclose(a, first, atol=1e-3) and not np.allclose(a, b, atol=1e-3)
    assert not np.array_equal(model.layers[1].running_mean.value.numpy(), running)


def test_dropout_mode_switch_on_one_routine():
    drop = nn.Dropout(0.25, seed=5, label="mode_drop2")
    y = drop(ej.ndarray(np.full((300, 400), 3.0, np.float32), batch_axes=1))
    routine = train.to_routine(train.forward(y))
    routine()
    masked = y.value.numpy()
    assert abs(np.mean(masked != 0) - 0.75) < 0.0075
    np.testing.assert_allclose(masked[masked != 0], 4.0, rtol=1e-6)
    drop.eval()
    routine()
    np.testing.assert_array_equal(y.value.numpy(), np.full((300, 400), 3.0, np.float32))
    drop.train()
    routine()
    again = y.value.numpy()
    assert abs(np.mean(again != 0) - 0.75) < 0.0075 and np.mean((again != 0) != (masked != 0)) > 0.3
    assert drop.mode_tensor().label_str == "mode_drop2.training"


def test_batch_norm_graph_built_in_eval_mode_follows_a_later_train():
    x = np.random.default_rng(2).standard_normal((10, 3)).astype(np.float32) * 2 + 1
    bn = nn.BatchNorm(3, momentum=0.5, label="mode_bn2").eval()
    out = bn(ej.ndarray(x, batch_axes=1))
    train.init_params(out)
    routine = train.to_routine(train.forward(out))
    routine()
    np.testing.assert_allclose(out.value.numpy(), x / np.sqrt(1 + 1e-5), rtol=1e-6)
    np.testing.assert_array_equal(bn.running_mean.value.numpy(), np.zeros(3))
    bn.train()
    routine()
    np.testing.assert_allclose(out.value.numpy(), (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bn.running_mean.value.numpy(), 0.5 * x.mean(0), rtol=1e-5)
