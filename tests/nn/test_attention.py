"""Attention and the transformer block: values and gradients against a NumPy reference, finite
differences, and PyTorch (`nn.MultiheadAttention`, `F.scaled_dot_product_attention`) with
copied weights when installed."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_gradients, weighted_loss
from torch_refs import torch_mha

import einjit as ej
from einjit import fit, nn, train
from einjit.nn.attention import MultiHeadAttention, TransformerBlock, scaled_dot_product_attention

B, T, D, H = 2, 5, 8, 2


def _np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_attention(q, k, v, causal=False):
    """q, k, v: (b, t, h, e)."""
    s = np.einsum("bthe,bshe->bths", q, k) / np.sqrt(q.shape[-1])
    if causal:  # the queries are the last t of the n positions
        t, n = q.shape[1], k.shape[1]
        seen = np.arange(n)[None, :] <= np.arange(t)[:, None] + (n - t)
        s = np.where(seen[None, :, None, :], s, -np.inf)
    return np.einsum("bths,bshe->bthe", _np_softmax(s), v)


def np_mha(layer: MultiHeadAttention, x, causal=False):
    p = {name: (w.value.numpy(), b.value.numpy()) for name, (w, b) in layer.proj.items()}
    q, k, v = (np.einsum("hed,btd->bthe", p[n][0], x) + p[n][1] for n in "qkv")
    y = np_attention(q, k, v, causal)
    return np.einsum("dhe,bthe->btd", p["out"][0], y) + p["out"][1]


def _run(layer, xv, *, prec="single"):
    with ej.default_precision(prec):
        x = ej.input("x", batch_dims=[B, T], output_dims=[D])
        y = layer(x)
        train.init_params(y, seed=3)
        step = fit.forward_step(y, inputs=[x])
        return step(xv)


def test_sdpa_matches_numpy():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, T, H, 4)).astype(np.float32) for _ in range(3))
    out = scaled_dot_product_attention(*(ej.ndarray(a, batch_axes=2) for a in (q, k, v)))
    np.testing.assert_allclose(train.forward_once(out), np_attention(q, k, v), rtol=1e-5, atol=1e-6)


def test_mha_matches_numpy_and_heads_are_an_axis():
    xv = np.random.default_rng(1).standard_normal((B, T, D)).astype(np.float32)
    layer = MultiHeadAttention(D, H, label="mha")
    got = _run(layer, xv)
    np.testing.assert_allclose(got, np_mha(layer, xv), rtol=1e-5, atol=1e-5)
    assert layer.proj["q"][0].dims == (H, D // H, D)


def test_mha_gradients_float64():
    rng = np.random.default_rng(2)
    with ej.default_precision("double"):
        layer = MultiHeadAttention(4, 2, label="mha")
        x = ej.ndarray(rng.standard_normal((2, 3, 4)), batch_axes=2, label="x")
        loss = weighted_loss(layer(x), rng)
        train.init_params(loss, seed=1)
        check_gradients(loss, [p for p in layer.params()])


def test_mha_matches_torch_multihead_attention():
    torch = pytest.importorskip("torch")
    xv = np.random.default_rng(4).standard_normal((B, T, D))
    layer = MultiHeadAttention(D, H, label="mha")
    got = _run(layer, xv, prec="double")
    ref = torch.nn.MultiheadAttention(D, H, batch_first=True, dtype=torch.float64)
    p = {name: (w.value.numpy(), b.value.numpy()) for name, (w, b) in layer.proj.items()}
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.tensor(np.concatenate([p[n][0].reshape(D, D) for n in "qkv"])))
        ref.in_proj_bias.copy_(torch.tensor(np.concatenate([p[n][1].reshape(D) for n in "qkv"])))
        ref.out_proj.weight.copy_(torch.tensor(p["out"][0].reshape(D, D)))
        ref.out_proj.bias.copy_(torch.tensor(p["out"][1]))
        xt = torch.tensor(xv)
        want, _ = ref(xt, xt, xt, need_weights=False)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)


def test_heads_must_divide_d_model():
    with pytest.raises(ej.ShapeError, match="n_heads=3 must be a positive divisor of d_model=8"):
        MultiHeadAttention(8, 3)


def test_mha_refuses_a_wrong_feature_size():
    layer = MultiHeadAttention(8, 2, label="att")
    x = ej.input("x", batch_dims=[2, 3], output_dims=[6])
    with pytest.raises(ej.ShapeError, match=r"att: the feature axis of its input x .* is 6, expected d_model=8"):
        layer(x)


def test_causal_sdpa_matches_numpy_and_torch():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((B, T, H, 4)) for _ in range(3))
    with ej.default_precision("double"):
        out = scaled_dot_product_attention(*(ej.ndarray(a, batch_axes=2) for a in (q, k, v)), causal=True)
        got = train.forward_once(out)
    np.testing.assert_allclose(got, np_attention(q, k, v, causal=True), rtol=1e-12, atol=1e-13)
    assert not np.allclose(got, np_attention(q, k, v))
    torch = pytest.importorskip("torch")
    tq, tk, tv = (torch.tensor(a.transpose(0, 2, 1, 3)) for a in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True).numpy().transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


def test_causal_queries_after_cached_keys():
    """3 queries over 5 keys: query j is position 2 + j and sees keys 0 .. 2 + j."""
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 3, H, 4))
    k, v = (rng.standard_normal((1, 5, H, 4)) for _ in range(2))
    with ej.default_precision("double"):
        out = scaled_dot_product_attention(*(ej.ndarray(a, batch_axes=2) for a in (q, k, v)), causal=True)
        got = train.forward_once(out)
    np.testing.assert_allclose(got, np_attention(q, k, v, causal=True), rtol=1e-12, atol=1e-13)


def test_causal_mha_gradients_float64():
    rng = np.random.default_rng(7)
    with ej.default_precision("double"):
        layer = MultiHeadAttention(4, 2, causal=True, label="mha")
        x = ej.ndarray(rng.standard_normal((2, 3, 4)), batch_axes=2, label="x")
        loss = weighted_loss(layer(x), rng)
        train.init_params(loss, seed=1)
        check_gradients(loss, layer.params())


def np_layernorm(x, g, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * g + b


def np_gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def np_block(block: TransformerBlock, x):
    ln = [(layer.params()[0].value.numpy(), layer.params()[1].value.numpy()) for layer in (block.ln1, block.ln2)]
    x = x + np_mha(block.attn, np_layernorm(x, *ln[0]), causal=block.attn.causal)
    (w1, b1), (w2, b2) = ((w.value.numpy(), b.value.numpy()) for w, b in (block.mlp.fc, block.mlp.proj))
    h = np_gelu_tanh(np.einsum("od,btd->bto", w1, np_layernorm(x, *ln[1])) + b1)
    return x + np.einsum("do,bto->btd", w2, h) + b2


def test_transformer_block_matches_numpy():
    xv = np.random.default_rng(8).standard_normal((B, T, D))
    block = TransformerBlock(D, H, label="blk")
    got = _run(block, xv, prec="double")
    assert len(block.params()) == 4 + 8 + 4
    np.testing.assert_allclose(got, np_block(block, xv), rtol=1e-10, atol=1e-12)


def test_transformer_block_gradients_float64():
    rng = np.random.default_rng(9)
    with ej.default_precision("double"):
        block = TransformerBlock(4, 2, mlp_ratio=2, label="blk")
        x = ej.ndarray(rng.standard_normal((1, 3, 4)), batch_axes=2, label="x")
        loss = weighted_loss(block(x), rng)
        train.init_params(loss, seed=2)
        check_gradients(loss, block.params(), rtol=1e-4, atol=1e-6)


def test_gelu_layer():
    v = np.linspace(-3, 3, 7).astype(np.float32)
    for approximate, ref in (("tanh", np_gelu_tanh(v)), ("none", None)):
        got = train.forward_once(nn.GELU(approximate)(ej.ndarray(v)))
        want = ref if ref is not None else train.forward_once(ej.gelu(ej.ndarray(v)))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_mha_key_padding_matches_torch_and_numpy():
    rng = np.random.default_rng(10)
    xv = rng.standard_normal((B, T, D))
    pad = np.zeros((B, T))
    pad[0, 3:] = 1  # the first sequence has 3 tokens, the second all 5
    layer = MultiHeadAttention(D, H, label="mha_pad")
    with ej.default_precision("double"):
        x = ej.input("x", batch_dims=[B, T], output_dims=[D])
        m = ej.input("pad", batch_dims=[B], output_dims=[T])
        y = layer(x, key_padding_mask=m)
        train.init_params(y, seed=4)
        got = fit.forward_step(y, inputs=[x, m])(xv, pad)
    p = {name: (w.value.numpy(), b.value.numpy()) for name, (w, b) in layer.proj.items()}
    q, k, v = (np.einsum("hed,btd->bthe", p[n][0], xv) + p[n][1] for n in "qkv")
    s = np.einsum("bthe,bshe->bths", q, k) / np.sqrt(D // H)
    s = np.where(pad[:, None, None, :] > 0, -np.inf, s)
    want = np.einsum("dhe,bthe->btd", p["out"][0], np.einsum("bths,bshe->bthe", _np_softmax(s), v)) + p["out"][1]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    torch = pytest.importorskip("torch")
    ref = torch_mha(torch, p, D, H)
    with torch.no_grad():
        xt = torch.tensor(xv)
        tw, _ = ref(xt, xt, xt, key_padding_mask=torch.tensor(pad > 0), need_weights=False)
    np.testing.assert_allclose(got, tw.numpy(), rtol=1e-10, atol=1e-12)
