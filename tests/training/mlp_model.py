"""The small model the data tests share: a 2 → 8 → 1 ReLU MLP with a hinge loss, in einjit
and as a NumPy reference with hand-written gradients (float64)."""

from __future__ import annotations

import numpy as np

import einjit as ej
from einjit import train

HIDDEN = 8


def dataset(n: int = 1000, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((n, 2))
    ys = np.where(xs[:, 0] * xs[:, 1] + 0.3 * xs[:, 0] > 0, 1.0, -1.0)
    return xs, ys


def make_mlp():
    @ej.op
    def mlp(x: ej.Tensor) -> ej.Tensor:
        h = ej.relu(ej.param("b1", output_dims=[HIDDEN], init="uniform") + ej.param("w1", output_dims=[HIDDEN]) @ x)
        return ej.param("b2", output_dims=[1], init="zeros") + ej.param("w2", output_dims=[1]) @ h

    return mlp


def build(batch: int, *, weighted: bool = False, seed: int = 0, init: bool = True):
    """Inputs, loss and learning-rate scalar of the training graph; parameters initialized."""
    mlp = make_mlp()
    x = ej.input("x", batch_dims=[batch], output_dims=[2])
    y = ej.input("y", batch_dims=[batch])
    margin = ej.relu(1 - y * mlp(x), label="margin")
    inputs = [x, y]
    if weighted:
        w = ej.input("w", batch_dims=[batch])
        loss = ej.sum(w * margin, label="loss")
        inputs.append(w)
    else:
        loss = ej.mean(margin, label="loss")
    lr = ej.scalar(0.1, label="lr")
    if init:
        train.init_params(loss, seed=seed)
    return mlp, inputs, loss, lr


def params_of(loss: ej.Tensor) -> dict[str, np.ndarray]:
    """Writable copies of the parameters (`numpy()` is a read-only snapshot)."""
    return {p.label_str: p.numpy().copy() for p in loss.params()}


def reference_step(p: dict[str, np.ndarray], xb: np.ndarray, yb: np.ndarray, wb: np.ndarray, lr: float) -> float:
    """One SGD step of the weighted hinge loss sum(w * relu(1 - y * mlp(x))), in place."""
    pre = xb @ p["w1"].T + p["b1"]
    h = np.maximum(pre, 0)
    out = (h @ p["w2"].T)[:, 0] + p["b2"][0]
    margin = 1 - yb * out
    loss = float(np.sum(wb * np.maximum(margin, 0)))
    d_out = np.where(margin > 0, -yb * wb, 0.0)
    g_w2 = d_out @ h
    g_b2 = d_out.sum()
    d_h = np.outer(d_out, p["w2"][0]) * (pre > 0)
    g_w1 = d_h.T @ xb
    g_b1 = d_h.sum(axis=0)
    p["w2"] -= lr * g_w2[None, :]
    p["b2"] -= lr * g_b2
    p["w1"] -= lr * g_w1
    p["b1"] -= lr * g_b1
    return loss
