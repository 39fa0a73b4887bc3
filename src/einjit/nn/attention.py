"""Attention with the head as an einsum axis, and the pre-LayerNorm transformer block.

Sequences are `batch, time | -> features`: the time axis is a batch axis, so every per-token
layer (`Linear`, `LayerNorm`, the MLP) applies to it unchanged. Queries, keys and values are
`batch, t | -> head, e`, produced straight from `d_model` by weights of output axes
`[heads, head_dim]`; scores are one einsum over the head axis,

    b,t|->h,e; b,s|->h,e => b,t|->h,s

so there is no Python loop over heads, no reshape and no transpose: the head is an axis the
compiled loops run over like any other. The output projection contracts `[heads, head_dim]`
back to `d_model` (weights of input axes `[heads, head_dim]`).
"""

from __future__ import annotations

import math

from einjit.ir.indexing import StaticSymbol
from einjit.nn import init as nn_init
from einjit.nn.layers import Dropout, Layer, LayerNorm, _auto_label
from einjit.shape import Dim, Kind, ShapeError
from einjit.shape.inference import provisional_row
from einjit.tensor import activations, reductions
from einjit.tensor.indexed_write import write_at
from einjit.tensor.masks import causal_mask, masked_softmax
from einjit.tensor.operation import einsum, param
from einjit.tensor.tensor import Tensor, TensorError

SCORES = "...,t|->h,e; ...,s|->h,e => ...,t|->h,s"
MIX = "...,t|->h,s; ...,s|->h,e => ...,t|->h,e"


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
                                 offset: int | StaticSymbol | None = None, key_padding_mask: Tensor | None = None,
                                 scale: float | None = None,
                                 dropout: Dropout | None = None, label: str | None = None) -> Tensor:
    """`softmax(q kᵀ * scale) v` per head, for `q` of `..., t | -> heads, e` and `k`, `v` of
    `..., s | -> heads, e` (scale defaults to `1/sqrt(e)`). With `causal`, query `t` sees keys
    `s <= t + offset`, where `offset` (an int, or a static symbol bound per call: the decoding
    position) defaults to the number of keys before the queries. `key_padding_mask`, a
    `..., | -> s` tensor (one row of keys per sequence, PyTorch's convention: non-zero = padding),
    hides padded keys from every query; a query that sees no key gets zeros. `dropout` (a
    `Dropout` layer) drops attention weights in training."""
    if scale is None:
        e = q.shape.output.dims[-1] if q.shape.output.dims else None
        if e is None or not hasattr(e, "d"):
            raise ShapeError(f"einjit: scaled_dot_product_attention: the head axis of the queries {q.label_str} "
                             f"(shape {q.shape}) is not known yet; pass scale=")
        scale = 1.0 / math.sqrt(e.d)
    scores = einsum(SCORES, q, k, label=f"{label}.scores" if label else "scores")
    scores = scores * float(scale)
    if causal or key_padding_mask is not None:
        weights = _masked_weights(scores, q, k, causal, offset, key_padding_mask)
    else:
        weights = reductions.softmax(scores, axis=-1)
    if dropout is not None:
        weights = dropout(weights)
    return einsum(MIX, weights, v, label=label or "attention")


def _last_batch_size(x: Tensor, what: str) -> int:
    row = x.shape.batch
    if not row.dims or not isinstance(row.dims[-1], Dim):
        row = provisional_row(x.shape, Kind.BATCH)
    if not row.dims or not isinstance(row.dims[-1], Dim):
        raise ShapeError(f"einjit: attention: the time axis (last batch axis) of the {what} {x.label_str} "
                         f"(shape {x.shape}) is not known yet")
    return row.dims[-1].d


def _masked_weights(scores: Tensor, q: Tensor, k: Tensor, causal: bool, offset: int | StaticSymbol | None,
                    key_padding_mask: Tensor | None) -> Tensor:
    """The masked softmax of `..., t | -> h, s` scores. Causal: key `s` is seen from query `t`
    when `s <= t + offset` (`ej.causal_mask` compares loop indices inside the routine); without
    causality the same mask with an offset of the key count keeps every key. Padding: keys
    where `key_padding_mask` (`..., | -> s`) is non-zero are hidden from every query."""
    n_keys = _last_batch_size(k, "keys")
    if not causal:
        offset = n_keys
    elif offset is None:
        offset = n_keys - _last_batch_size(q, "queries")
    keep = causal_mask(scores, query_axis=-3, key_axis=-1, offset=offset, label="causal")
    if key_padding_mask is not None:
        kept_keys = 1.0 - key_padding_mask
        keep = einsum("...,t|->h,s; ...|->s => ...,t|->h,s", keep, kept_keys, label="attention_mask")
    return masked_softmax(scores, keep, axis=-1, label="attention_weights")


def _projection(layer: Layer, name: str, out_dims: list[int], in_dims: list[int], init: str,
                bias: bool) -> tuple[Tensor, Tensor | None]:
    w = param([layer.label, name, "w"], output_dims=out_dims, input_dims=in_dims)
    fan_in, fan_out = math.prod(in_dims), math.prod(out_dims)
    nn_init.set_init(w, init, lambda p: (fan_in, fan_out))
    b = None
    if bias:
        b = param([layer.label, name, "b"], output_dims=out_dims, input_dims=[])
        nn_init.set_init(b, "zeros", lambda p: (fan_in, fan_out))
    layer._keep(*(p for p in (w, b) if p is not None))
    return w, b


def _apply(w: Tensor, b: Tensor | None, x: Tensor) -> Tensor:
    y = w @ x
    return y if b is None else b + y


class MultiHeadAttention(Layer):
    """Self-attention of `n_heads` heads over `batch, time | -> d_model`, PyTorch's
    `nn.MultiheadAttention` (batch first, same input for query, key and value) computed with
    the head as an einsum axis. Parameters: `q.w`, `k.w`, `v.w` of `[n_heads, head_dim] x
    [d_model]`, `out.w` of `[d_model] x [n_heads, head_dim]`, and their biases."""

    kind = "MultiHeadAttention"

    def __init__(self, d_model: int, n_heads: int, *, causal: bool = False, dropout: float = 0.0,
                 bias: bool = True, init: str = "xavier_uniform", seed: int = 0, label: str | None = None):
        super().__init__(label)
        if n_heads < 1 or d_model % n_heads:
            raise ShapeError(f"einjit: MultiHeadAttention {self.label}: n_heads={n_heads} must be a positive divisor "
                             f"of d_model={d_model}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.causal, self.bias, self.init = causal, bias, init
        self.attn_dropout = Dropout(dropout, seed=seed, label=f"{self.label}.attn_drop") if dropout else None
        heads = [n_heads, self.head_dim]
        self.proj = {name: _projection(self, name, heads, [d_model], init, bias) for name in "qkv"}
        self.proj["out"] = _projection(self, "out", [d_model], heads, init, bias)

    def __call__(self, x: Tensor, key_padding_mask: Tensor | None = None, *,
                 cache: tuple[Tensor, Tensor] | None = None, pos: StaticSymbol | None = None) -> Tensor:
        """`key_padding_mask`: `batch | -> time`, non-zero where a token is padding (PyTorch's).

        With a KV `cache` (two `ej.buffer`s of `batch, max_time | -> heads, head_dim`) the keys
        and values of `x`'s tokens are written into it at position `pos` (a static symbol bound
        per call: `ej.write_at`), and the queries attend over the cache, token `t` seeing cached
        positions `s <= pos + t`: one compiled routine serves every position."""
        dims = self._expect_axes(x, ("features",))
        if dims[-1] is not None and dims[-1] != self.d_model:
            raise self._error("the feature axis", dims[-1], f"d_model={self.d_model}", x)
        proj = self.proj
        q, k, v = (_apply(*proj[name], x) for name in "qkv")
        offset: StaticSymbol | None = None
        if cache is not None:
            if pos is None:
                raise TensorError(f"einjit: {self.kind} {self.label}: a KV cache needs the write position `pos`")
            k = write_at(cache[0], k, pos, axis=-3, label=f"{self.label}.k_cache")
            v = write_at(cache[1], v, pos, axis=-3, label=f"{self.label}.v_cache")
            offset = pos
        y = scaled_dot_product_attention(q, k, v, causal=self.causal or cache is not None, offset=offset,
                                         key_padding_mask=key_padding_mask, dropout=self.attn_dropout,
                                         label=f"{self.label}.heads")
        return _apply(*proj["out"], y)

    def train(self, mode: bool = True) -> MultiHeadAttention:
        super().train(mode)
        if self.attn_dropout is not None:
            self.attn_dropout.train(mode)
        return self


class MLP(Layer):
    """`Linear(d, ratio*d) -> GELU -> Linear(ratio*d, d)` per token (the transformer's MLP)."""

    kind = "MLP"

    def __init__(self, d_model: int, ratio: int = 4, *, approximate: str = "tanh", bias: bool = True,
                 init: str = "xavier_uniform", label: str | None = None):
        super().__init__(label)
        self.approximate = approximate
        self.fc = _projection(self, "fc", [ratio * d_model], [d_model], init, bias)
        self.proj = _projection(self, "proj", [d_model], [ratio * d_model], init, bias)

    def __call__(self, x: Tensor) -> Tensor:
        return _apply(*self.proj, activations.gelu(_apply(*self.fc, x), approximate=self.approximate))


class TransformerBlock(Layer):
    """Pre-LayerNorm block: `x + attn(ln1(x))`, then `+ mlp(ln2(x))` (GPT-2's order), with
    dropout on both residual branches in training."""

    kind = "TransformerBlock"

    def __init__(self, d_model: int, n_heads: int, *, mlp_ratio: int = 4, causal: bool = True, dropout: float = 0.0,
                 approximate: str = "tanh", eps: float = 1e-5, init: str = "xavier_uniform", seed: int = 0,
                 label: str | None = None):
        super().__init__(label or _auto_label("block"))
        self.ln1 = LayerNorm(d_model, eps=eps, label=f"{self.label}.ln1")
        self.attn = MultiHeadAttention(d_model, n_heads, causal=causal, dropout=dropout, init=init, seed=seed,
                                       label=f"{self.label}.attn")
        self.ln2 = LayerNorm(d_model, eps=eps, label=f"{self.label}.ln2")
        self.mlp = MLP(d_model, mlp_ratio, approximate=approximate, init=init, label=f"{self.label}.mlp")
        self.drops = [Dropout(dropout, seed=seed + k + 1, label=f"{self.label}.drop{k + 1}") for k in range(2)]

    def __call__(self, x: Tensor, *, cache: tuple[Tensor, Tensor] | None = None,
                 pos: StaticSymbol | None = None) -> Tensor:
        """`cache` / `pos`: a KV cache written and read by the attention (`MultiHeadAttention`)."""
        x = x + self.drops[0](self.attn(self.ln1(x), cache=cache, pos=pos))
        return x + self.drops[1](self.mlp(self.ln2(x)))

    def layers(self) -> list[Layer]:
        return [self.ln1, self.attn, self.ln2, self.mlp, *self.drops]

    def params(self) -> list[Tensor]:
        return [p for layer in self.layers() for p in layer.params()]

    def train(self, mode: bool = True) -> TransformerBlock:
        self.training = bool(mode)
        for layer in self.layers():
            layer.train(mode)
        return self
