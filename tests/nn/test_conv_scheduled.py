"""`nn.Conv2d` → `nn.MaxPool2d` → `nn.Conv2d`, large enough for the scheduler's channel blocking
and window reductions (`ir/sched/schedule_conv.py`): the compiled step's loss and every gradient
against a float64 NumPy reference, with reassociation on (the input gradient's scatter is
blocked too) and off."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import nn, train
from einjit.ir.passes.tracing import VirtualizeSettings

N, H = 16, 30


def _conv(x, w):
    k = w.shape[-1]
    oh = x.shape[-1] - k + 1
    cols = np.stack([np.stack([x[:, :, u:u + oh, v:v + oh] for v in range(k)], -1) for u in range(k)], -2)
    return np.einsum("ncyxuv,ocuv->noyx", cols, w), cols


def _reference(x, w1, b1, w2, b2, r):
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


@pytest.mark.parametrize("reassociate", [True, False], ids=["reassociate", "exact"])
def test_channel_blocked_conv_layers_match_numpy(reassociate, tmp_path, monkeypatch):
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(tmp_path))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, 1, H, H)).astype(np.float32)
    r = rng.standard_normal((N, 16, (H - 2) // 2 - 2, (H - 2) // 2 - 2)).astype(np.float32)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, label="conv1"), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, label="conv2"))
    out = model(ej.ndarray(x, batch_axes=1, label="x"))
    loss = ej.sum(out * ej.ndarray(r, batch_axes=1, label="r"), label="loss")
    train.init_params(loss, seed=1)
    routine = train.to_routine(train.grad_update(loss), name="conv_layers",
                               settings=VirtualizeSettings(reassociate=reassociate))
    routine()
    source = (tmp_path / "conv_layers.c").read_text()
    # conv1 and conv2 forward, both kernel gradients, and conv2's input gradient when reassociating
    assert source.count("channel-blocked") == (5 if reassociate else 4)
    assert source.count("vectorized across its axis 1") == 1  # the pooling, across its 8 channels
    params = {p.label_str: p for p in model.params()}
    vals = [params[k].value.numpy().astype(np.float64) for k in ("conv1.w", "conv1.b", "conv2.w", "conv2.b")]
    want_loss, want = _reference(x.astype(np.float64), *vals, r.astype(np.float64))
    np.testing.assert_allclose(float(loss.value.numpy().ravel()[0]), want_loss, rtol=1e-4)
    for label, g in want.items():
        np.testing.assert_allclose(params[label].grad.numpy(), g, rtol=1e-4, atol=1e-5 * np.abs(g).max(),
                                   err_msg=label)
