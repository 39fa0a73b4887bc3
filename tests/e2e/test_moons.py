"""The main job, checked against an independent NumPy implementation of the same training."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import einjit as ej
from einjit import datasets, train
from einjit.demos.moons import make_mlp, run_moons
from einjit.ir.indexing import IntRef, get_static_symbol


def numpy_training(params: list[np.ndarray], data: np.ndarray, labels: np.ndarray, steps: int, n_batches: int,
                   batch: int, total_steps: int, weight_decay: float) -> list[np.ndarray]:
    """The moons step by hand: forward, hinge loss, backprop, SGD with weight decay."""
    w1, b1, w2, b2, w3, b3 = [p.astype(np.float64) for p in params]
    for step in range(steps):
        x = data[step % n_batches].astype(np.float64)      # (batch, 2)
        y = labels[step % n_batches].astype(np.float64)    # (batch, 1)
        z1 = x @ w1.T + b1
        h1 = np.maximum(z1, 0)
        z2 = h1 @ w2.T + b2
        h2 = np.maximum(z2, 0)
        out = h2 @ w3.T + b3
        margin = 1 - y * out
        d_out = np.where(margin > 0, -y, 0.0) / batch
        g_w3, g_b3 = d_out.T @ h2, d_out.sum(0)
        d_h2 = d_out @ w3 * (z2 > 0)
        g_w2, g_b2 = d_h2.T @ h1, d_h2.sum(0)
        d_h1 = d_h2 @ w2 * (z1 > 0)
        g_w1, g_b1 = d_h1.T @ x, d_h1.sum(0)
        lr = 0.1 * (2 * total_steps - step) / total_steps
        new = []
        for p, g in zip((w1, b1, w2, b2, w3, b3), (g_w1, g_b1, g_w2, g_b2, g_w3, g_b3), strict=True):
            new.append(p - lr * (g + weight_decay * p))
        w1, b1, w2, b2, w3, b3 = new
    return [w1, b1, w2, b2, w3, b3]


def test_training_steps_match_numpy():
    batch, n_batches, steps = 10, 8, 24
    coords, labels = datasets.shuffled(*datasets.half_moons(40, seed=3), seed=3)
    data = coords.reshape(n_batches, batch, 2)
    ys = labels.reshape(n_batches, batch, 1)
    with ej.default_precision("double"):
        batch_n, step_n = get_static_symbol(n_batches, "batch"), get_static_symbol(None, "step")
        flat = ej.ndarray(data, batch_axes=2, label="xs")
        classes = ej.ndarray(ys, batch_axes=2, label="ys")
        mlp = make_mlp()
        x, y = ej.batch_slice(flat, batch_n), ej.batch_slice(classes, batch_n)
        loss = ej.div(ej.sum(ej.relu(1 - y * mlp(x)), "...|... => 0"), batch)
        params = [mlp.params()[k] for k in (1, 0, 3, 2, 5, 4)]
        lr = ej.mul(0.1, (2 * steps - ej.embed_symbol(step_n)) / steps)
        train.init_params(loss, seed=5)
        start = [p.value.numpy() for p in params]
        refs = {batch_n: IntRef(0), step_n: IntRef(0)}
        routine = train.to_routine([train.grad_update(loss), train.sgd_update(loss, lr, weight_decay=1e-4)],
                                   bindings=refs, name="moons_check")
        for step in range(steps):
            refs[batch_n].value, refs[step_n].value = step % n_batches, step
            routine()
    want = numpy_training(start, data, ys, steps, n_batches, batch, steps, 1e-4)
    for p, w in zip(params, want, strict=True):
        np.testing.assert_allclose(p.value.numpy(), w.reshape(p.value.numpy().shape), rtol=1e-10, atol=1e-12,
                                   err_msg=p.label_str)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_demo_reaches_high_accuracy(seed):
    result = run_moons(seed=seed, quiet=True)
    assert result.accuracy >= 0.97
    assert result.steps == 80 * 40
    assert result.losses[-1] < result.losses[0] / 5


def test_demo_command_line_json():
    out = subprocess.run([sys.executable, "-m", "einjit", "demo", "moons", "--json", "--epochs", "10"],
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(result) >= {"final_loss", "accuracy", "epochs", "steps", "seconds", "compile_seconds"}
    assert result["epochs"] == 10 and result["steps"] == 400
    assert 0.0 <= result["accuracy"] <= 1.0
