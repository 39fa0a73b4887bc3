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


def _routine_values(seed: int, before: int = 0) -> list[np.ndarray]:
    """The model's parameters initialized inside a routine from `seed`, after `before` other
    random tensors were drawn from the same seed."""
    _, _, out = _model()
    rnd.reset_streams()
    for _ in range(before):
        rnd.uniform(ej.ndarray(np.zeros(4, np.float32)), seed=seed)
    code = nn_init.init_code(out, seed=seed)
    sh.finish_inference()
    train.to_routine(code, name=f"init_{seed}_{before}")()
    return [p.value.numpy().copy() for p in out.params()]


def _host_values(seed: int) -> list[np.ndarray]:
    _, _, out = _model()
    train.init_params(out, seed=seed)
    return [p.value.numpy().copy() for p in out.params()]


def test_host_and_routine_init_share_distributions_not_values():
    """What `nn/init.py` documents: for one seed, each generator reproduces itself and both
    draw every scheme with the same bounds and moments, but not the same values — the
    routine's draws depend on the random tensor's place in the seed's stream, which the host's
    parameter order cannot follow (two routine inits from one seed differ by what was drawn
    before them)."""
    host, again = _host_values(5), _host_values(5)
    routine, rerun, shifted = _routine_values(5), _routine_values(5), _routine_values(5, before=1)
    for h, h2, r, r2, s in zip(host, again, routine, rerun, shifted, strict=True):
        np.testing.assert_array_equal(h, h2)
        np.testing.assert_array_equal(r, r2)
        assert not np.allclose(h, r) and not np.allclose(r, s)
    bounds = [math.sqrt(6.0 / 27), 1 / math.sqrt(27), None, 1 / math.sqrt(2560)]
    std = math.sqrt(2.0 / (2560 + 300))
    for h, r, bound in zip(host, routine, bounds, strict=True):
        if bound is None:  # xavier_normal: the same standard deviation and mean
            for v in (h, r):
                assert abs(v.std() - std) < 0.02 * std and abs(v.mean()) < 0.02 * std
            continue
        for v in (h, r):  # uniform on [-bound, bound]: its extremes near the bound, its std bound / sqrt(3)
            assert np.abs(v).max() <= bound and np.abs(v).max() > 0.8 * bound
            if v.size > 1000:
                assert abs(v.std() - bound / math.sqrt(3)) < 0.03 * bound
