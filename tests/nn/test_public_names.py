"""The new operations are reachable from the top-level `einjit` namespace and compute there."""

from __future__ import annotations

import numpy as np

import einjit as ej
from einjit import train


def test_top_level_names():
    for name in ("amax", "amin", "max", "min", "sum", "mean", "logsumexp", "softmax", "log_softmax", "abs", "clip",
                 "gelu", "leaky_relu", "rsqrt", "softplus", "uniform", "normal"):
        assert callable(getattr(ej, name)), name
    x = ej.ndarray(np.array([[1.0, 5.0, -2.0], [0.5, 0.25, 4.0]], np.float32), batch_axes=1)
    out = ej.amax(x, axis=-1) + ej.sum(x, axis=-1) + ej.mean(x, axis=-1)
    np.testing.assert_allclose(train.forward_once(out), [5 + 4 + 4 / 3, 4 + 4.75 + 4.75 / 3], rtol=1e-6)


def test_sum_keeps_its_einsum_form():
    x = ej.ndarray(np.arange(6, dtype=np.float32).reshape(2, 3), batch_axes=1)
    np.testing.assert_allclose(train.forward_once(ej.sum(x, "b|->o => b|->")), [3.0, 12.0])
