"""Initializers: host draws with PyTorch's bounds, and the same distributions drawn inside a
compiled routine from the in-graph random numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

import einjit as ej
from einjit import nn, ops, train
from einjit import shape as sh
from einjit.nn import init as nn_init
from einjit.tensor import random as rnd


def _model():
    x = ej.ndarray(np.zeros((2, 3, 10, 10), np.float32), batch_axes=1)
    conv, fc = nn.Conv2d(3, 40, 3, label="iconv"), nn.Linear(40 * 64, 300, init="xavier_normal", label="ifc")
    return conv, fc, fc(conv(x))


def test_host_initializers_follow_pytorch_bounds():
    conv, fc, out = _model()
    train.init_params(out, seed=3)
    w, b = (p.value.numpy() for p in conv.params())
    bound = math.sqrt(6.0 / 27)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound
    assert np.abs(b).max() <= 1 / math.sqrt(27)
    fw = fc.params()[0].value.numpy()
    assert abs(fw.std() - math.sqrt(2.0 / (2560 + 300))) < 0.02 * math.sqrt(2.0 / (2560 + 300))


def test_initialization_inside_a_routine():
    _, _, out = _model()
    rnd.reset_streams()
    code = nn_init.init_code(out, seed=5)
    sh.finish_inference()
    routine = train.to_routine(code, name="init")
    routine()
    w, b, fw, fb = (p.value.numpy() for p in out.params())
    bound = math.sqrt(6.0 / 27)
    u = np.array(ops.uniform_hash(rnd.stream_base(5, 0), w.size)).reshape(w.shape)
    np.testing.assert_allclose(w, bound * (2 * u - 1), rtol=1e-5, atol=1e-6)
    assert np.abs(b).max() <= 1 / math.sqrt(27) and np.abs(b).max() > 0.8 / math.sqrt(27)
    std = math.sqrt(2.0 / (2560 + 300))
    assert abs(fw.std() - std) < 0.02 * std and abs(fw.mean()) < 0.02 * std
    assert np.abs(fb).max() <= 1 / math.sqrt(2560)


def test_in_graph_init_needs_an_nn_initializer():
    p = ej.param("plain", output_dims=[3])
    with pytest.raises(ej.TensorError, match="plain has no einjit.nn initializer"):
        nn_init.init_code([p])
