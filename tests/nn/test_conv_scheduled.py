"""`nn.Conv2d` → `nn.MaxPool2d` → `nn.Conv2d`, large enough for the scheduler's channel blocking
and window reductions (`ir/sched/schedule_conv.py`): the compiled step's loss and every gradient
against a float64 NumPy reference, with reassociation on (the input gradient's scatter is
blocked too) and off."""

from __future__ import annotations

import numpy as np
import pytest

from einjit import train
from einjit.ir.passes.tracing import VirtualizeSettings

N, H = 16, 30


@pytest.mark.parametrize("reassociate", [True, False], ids=["reassociate", "exact"])
def test_channel_blocked_conv_layers_match_numpy(reassociate, two_conv_model, tmp_path, monkeypatch):
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(tmp_path))
    net = two_conv_model(N, H)
    routine = train.to_routine(train.grad_update(net.loss), name="conv_layers",
                               settings=VirtualizeSettings(reassociate=reassociate))
    routine()
    source = (tmp_path / "conv_layers.c").read_text()
    # conv1 and conv2 forward, both kernel gradients, and conv2's input gradient when reassociating;
    # conv1's kernel gradient (16 * 28 * 28 terms per cell) split into chunks when reassociating
    assert source.count("channel-blocked") == (5 if reassociate else 4)
    assert source.count("sum split into") == (1 if reassociate else 0)
    assert source.count("vectorized across its axis 1") == 1  # the pooling, across its 8 channels
    want_loss, want = net.reference()
    np.testing.assert_allclose(float(net.loss.value.numpy().ravel()[0]), want_loss, rtol=1e-4)
    params = net.params()
    for label, g in want.items():
        np.testing.assert_allclose(params[label].grad.numpy(), g, rtol=1e-4, atol=1e-5 * np.abs(g).max(),
                                   err_msg=label)
