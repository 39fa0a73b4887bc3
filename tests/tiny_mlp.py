"""The optimizer tests' model: a float32 two-layer tanh net with a squared-error loss whose data
and starting weights come from fixed seeds, so a test can build it twice (fused and unfused
updates, einjit and PyTorch) from the same numbers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import einjit as ej
from einjit import train


@dataclass(frozen=True)
class TinyMlp:
    xs: np.ndarray
    ys: np.ndarray
    w1: np.ndarray
    w2: np.ndarray

    def build(self, tag: str):
        """The loss and its two parameters (a matrix and a vector), named apart by `tag`."""
        w1, w2 = ej.param(f"w1{tag}", values=self.w1), ej.param(f"w2{tag}", values=self.w2)
        x, y = ej.ndarray(self.xs, batch_axes=1), ej.ndarray(self.ys[:, None], batch_axes=1)
        h = ej.tanh(ej.einsum("b|->i; o,i => b|->o", x, w1))
        pred = ej.einsum("b|->o; o => b|->0", h, w2)
        loss = ej.sum((pred - y) * (pred - y))
        train.init_params(loss)
        return loss, (w1, w2)


def tiny_mlp(seed: int, batch: int, inputs: int, hidden: int) -> TinyMlp:
    """Inputs, targets and the two weights drawn from seeds `seed` .. `seed + 3`."""
    shapes = ((batch, inputs), (batch,), (hidden, inputs), (hidden,))
    return TinyMlp(*(np.random.default_rng(seed + k).normal(size=s).astype(np.float32)
                     for k, s in enumerate(shapes)))
