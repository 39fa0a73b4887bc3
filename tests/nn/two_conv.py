"""The model the convolution tests share: `nn.Conv2d(1, 8, 3)` → `nn.MaxPool2d(2)` →
`nn.Conv2d(8, 16, 3)` on `n` images of `h`×`h`, loss `sum(r * out)` for a random `r`, and its
loss and gradients by hand in float64 NumPy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import einjit as ej
from einjit import nn, train

PARAMS = ("conv1.w", "conv1.b", "conv2.w", "conv2.b")


@dataclass
class TwoConv:
    model: nn.Sequential
    loss: ej.Tensor
    x: np.ndarray
    r: np.ndarray

    def params(self) -> dict:
        return {p.label_str: p for p in self.model.params()}

    def reference(self) -> tuple[float, dict[str, np.ndarray]]:
        """The loss and the gradients of `PARAMS` at the parameters' current values."""
        by_label = self.params()
        vals = [by_label[k].value.numpy().astype(np.float64) for k in PARAMS]
        return reference(self.x.astype(np.float64), *vals, self.r.astype(np.float64))


def build(n: int, h: int) -> TwoConv:
    """The model and its loss, parameters initialized (seed 1)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 1, h, h)).astype(np.float32)
    r = rng.standard_normal((n, 16, (h - 2) // 2 - 2, (h - 2) // 2 - 2)).astype(np.float32)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, label="conv1"), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, label="conv2"))
    out = model(ej.ndarray(x, batch_axes=1, label="x"))
    loss = ej.sum(out * ej.ndarray(r, batch_axes=1, label="r"), label="loss")
    train.init_params(loss, seed=1)
    return TwoConv(model, loss, x, r)


def _conv(x, w):
    k = w.shape[-1]
    oh = x.shape[-1] - k + 1
    cols = np.stack([np.stack([x[:, :, u:u + oh, v:v + oh] for v in range(k)], -1) for u in range(k)], -2)
    return np.einsum("ncyxuv,ocuv->noyx", cols, w), cols


def reference(x, w1, b1, w2, b2, r):
    """`loss = sum(r * conv2(maxpool(conv1(x))))` and its gradients, by hand in float64."""
    z1, cols1 = _conv(x, w1)
    z1 += b1[:, None, None]
    n, c, h, _ = z1.shape
    windows = z1.reshape(n, c, h // 2, 2, h // 2, 2)
    p1 = windows.max(axis=(3, 5))
    z2, cols2 = _conv(p1, w2)
    z2 += b2[:, None, None]
    gp = np.zeros_like(p1)
    for u in range(3):
        for v in range(3):
            gp[:, :, u:u + z2.shape[2], v:v + z2.shape[3]] += np.einsum("noyx,oc->ncyx", r, w2[:, :, u, v])
    g1 = ((windows == p1[:, :, :, None, :, None]) * gp[:, :, :, None, :, None]).reshape(z1.shape)
    grads = {"conv2.w": np.einsum("ncyxuv,noyx->ocuv", cols2, r), "conv2.b": r.sum((0, 2, 3)),
             "conv1.w": np.einsum("ncyxuv,noyx->ocuv", cols1, g1), "conv1.b": g1.sum((0, 2, 3))}
    return float((r * z2).sum()), grads
