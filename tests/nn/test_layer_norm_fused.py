"""A pre-LayerNorm residual block's LayerNorm, forward and backward, at GPT row sizes: its row
sums are split into partial sums (`schedule._split_reduction`, the backward's subtracted ones
included) and fused with the passes over their rows (`fusion`). Compiled fused and unfused, at
1 and 2 threads, for AVX2 and AVX-512 register files: every variant gives the same bits, and
they match NumPy's LayerNorm and its gradients."""

from __future__ import annotations

import re

import numpy as np
import pytest

import einjit as ej
from einjit import nn, train
from einjit.backends.cc import toolchain as cc
from einjit.ir import optimize
from einjit.ir.optimize import VirtualizeSettings

B, T, D = 4, 32, 128
EPS = 1e-5


def _reference(xin, w, r):
    """x = xin * w, y = x + LN(x) (gamma 1, beta 0), and the gradients of sum(y * r), in float64."""
    x = xin * w
    c = x - x.mean(-1, keepdims=True)
    inv = 1 / np.sqrt((c * c).mean(-1, keepdims=True) + EPS)
    xhat = c * inv
    dx = r + inv * (r - r.mean(-1, keepdims=True) - xhat * (r * xhat).mean(-1, keepdims=True))
    grads = {"gamma": (r * xhat).sum(axis=(0, 1)), "beta": r.sum(axis=(0, 1)), "scale": (dx * xin).sum(axis=(0, 1))}
    return x + xhat, grads


def _run(fuse, threads, tmp_path, monkeypatch, recompute=True):
    """y and the gradients of gamma, beta and the input scale `w` (whose gradient needs the
    LayerNorm's input gradient, where its backward subtracts row sums), and the C source."""
    settings = VirtualizeSettings(fuse=fuse, inline_broadcast_arithmetic=recompute)
    monkeypatch.setattr(optimize, "virtualize_settings", settings)
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(tmp_path))
    rng = np.random.default_rng(7)
    xv = (rng.standard_normal((B, T, D)) * 2 + 1).astype(np.float32)
    rv = rng.standard_normal((B, T, D)).astype(np.float32)
    wv = (rng.standard_normal(D) * 0.5 + 1).astype(np.float32)
    ln = nn.LayerNorm(D, label="lnf")
    w = ej.param("scale", wv)
    x = ej.ndarray(xv, batch_axes=2, label="x") * w
    y = x + ln(x)
    y.hosted()
    loss = ej.sum(y * ej.ndarray(rv, batch_axes=2, label="r"), label="loss")
    train.init_params(loss, seed=4)
    name = f"ln_fused{int(fuse)}_{threads}_{int(recompute)}"
    routine = train.to_routine(train.grad_update(loss), name=name, options=cc.CcOptions(threads=threads))
    routine()
    grads = {p.label_str.split(".")[-1]: p.grad.numpy().copy() for p in [*ln.params(), w]}
    inputs = (xv.astype(np.float64), wv.astype(np.float64), rv.astype(np.float64))
    return y.value.numpy().copy(), grads, (tmp_path / f"{name}.c").read_text(), inputs


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
def test_layer_norm_fused_and_unfused_give_the_same_bits_at_one_and_two_threads(machine, tmp_path, monkeypatch):
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    base_y, base_g, source, inputs = _run(False, 1, tmp_path, monkeypatch)
    assert "partial sums into" in source
    unfused_calls = source.count("(int ")
    want_y, want_g = _reference(*inputs)
    np.testing.assert_allclose(base_y, want_y, rtol=1e-5, atol=1e-5)
    assert set(base_g) == set(want_g)
    for k, g in want_g.items():
        np.testing.assert_allclose(base_g[k], g, rtol=1e-4, atol=1e-4 * np.abs(g).max(), err_msg=k)
    for fuse, threads in ((True, 1), (True, 2), (False, 2)):
        y, g, source, _ = _run(fuse, threads, tmp_path, monkeypatch)
        np.testing.assert_array_equal(y, base_y, err_msg=f"fuse={fuse} threads={threads}")
        for k in want_g:
            np.testing.assert_array_equal(g[k], base_g[k], err_msg=f"{k} fuse={fuse} threads={threads}")
        if fuse and threads == 1:
            assert source.count("(int ") < unfused_calls


@pytest.mark.parametrize("threads", [1, 2])
def test_layer_norm_recomputing_its_centred_and_normed_values_gives_the_same_bits(threads, tmp_path, monkeypatch):
    """`x - mean` and `(x - mean) * rsqrt`, recomputed from `x` at every read
    (`ir/passes/recompute.py`), not stored: the forward writes `x` and `y` only, and every value
    and gradient keeps its bits."""
    want_y, want_g, stored, _ = _run(True, threads, tmp_path, monkeypatch, recompute=False)
    y, g, source, _ = _run(True, threads, tmp_path, monkeypatch)
    np.testing.assert_array_equal(y, want_y)
    for k in want_g:
        np.testing.assert_array_equal(g[k], want_g[k], err_msg=k)
    centred = re.compile(r"\] = \(\w+\[[^\]]+\] - (mean|row)\w*\[[^\]]+\]\);")  # a store of x - mean
    assert centred.search(stored) and not centred.search(source)
    assert source.count("(int ") <= stored.count("(int ")
