"""A GPT (decoder-only transformer) from a small config, in GPT-2's layout.

`GPT(config)(tokens)` maps token ids `batch, time | -> 1` (an integer input, e.g.
`ej.input("ids", batch_dims=[B, T], prec="int32")`; one-hot float rows work too) to logits
`batch, time | -> vocab`:
token embedding + position embedding, `n_layer` pre-LayerNorm `TransformerBlock`s (causal
attention, GELU MLP), a final LayerNorm and the language-model head, which by default is the
token embedding itself (tied). Parameter labels follow GPT-2's names under the model's label
(`gpt.wte`, `gpt.h0.attn.q.w`, `gpt.ln_f.gamma`), so checkpoints read like the model.

The token table is `[vocab] x [d_model]` (output axis vocab, input axis d_model), GPT-2's own
layout: the tied head is `wte @ h`, one contraction over `d_model`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from einjit.ir import ops
from einjit.ir.indexing import StaticSymbol
from einjit.nn import init as nn_init
from einjit.nn.attention import TransformerBlock
from einjit.nn.layers import Dropout, Layer, LayerNorm
from einjit.shape import ShapeError
from einjit.tensor.gather import take
from einjit.tensor.indexed_write import buffer
from einjit.tensor.notation import Template, make_op
from einjit.tensor.operation import ndarray, param, transpose
from einjit.tensor.tensor import Tensor, TensorError

POSITIONS = ("learned", "sinusoidal")
_ROWS = (Template("t =: t1"), Template("g1 =+ g"))
#: `wte` is `[vocab] x [d_model]`: the gathered axis is its output axis.
_TOKEN_ROWS = "d->v; ...|->v => ...|->d"
#: The position table is `[block_size, d_model]` output axes: gathered along the first.
_POSITION_ROWS = "p,d; ...|->p => ...|->d"


@dataclass(frozen=True)
class GPTConfig:
    """GPT-2's hyper-parameters under nanoGPT's names (`d_model` is GPT-2's `n_embd`)."""

    vocab_size: int
    block_size: int
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    dropout: float = 0.0
    tied: bool = True
    bias: bool = True
    mlp_ratio: int = 4
    positions: str = "learned"
    approximate: str = "tanh"
    eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise TensorError(f"einjit: GPTConfig: {name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head:
            raise ShapeError(f"einjit: GPTConfig: n_head={self.n_head} must divide d_model={self.d_model}")
        if self.positions not in POSITIONS:
            raise TensorError(f"einjit: GPTConfig: positions must be one of {POSITIONS}, got {self.positions!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise TensorError(f"einjit: GPTConfig: dropout must be in [0, 1), got {self.dropout}")


def sinusoidal_table(n_positions: int, d_model: int) -> np.ndarray:
    """`sin(p / 10000^(2i/d))` at even features and `cos` at odd ones ("Attention is all you need")."""
    pos = np.arange(n_positions)[:, None]
    freq = np.exp(-math.log(10000.0) * np.arange(0, d_model, 2) / d_model)
    table = np.zeros((n_positions, d_model))
    table[:, 0::2] = np.sin(pos * freq)
    table[:, 1::2] = np.cos(pos * freq[: d_model // 2])
    return table


class GPT(Layer):
    """The model; `params()` lists every parameter, `named_params()` them by GPT-2 name."""

    kind = "GPT"

    def __init__(self, config: GPTConfig, *, seed: int = 0, label: str = "gpt"):
        super().__init__(label)
        self.config = c = config
        self.wte = param([label, "wte"], output_dims=[c.vocab_size], input_dims=[c.d_model])
        nn_init.set_init(self.wte, "gpt2_normal", lambda p: (c.d_model, c.vocab_size))
        self._keep(self.wte)
        self.wpe: Tensor | None = None
        if c.positions == "learned":
            self.wpe = param([label, "wpe"], output_dims=[c.block_size, c.d_model], input_dims=[])
            nn_init.set_init(self.wpe, "gpt2_normal", lambda p: (c.d_model, c.block_size))
            self._keep(self.wpe)
        self.drop = Dropout(c.dropout, seed=seed, label=f"{label}.drop")
        self.blocks = [TransformerBlock(c.d_model, c.n_head, mlp_ratio=c.mlp_ratio, causal=True, dropout=c.dropout,
                                        approximate=c.approximate, eps=c.eps, init="gpt2_normal",
                                        seed=seed + 10 * (k + 1), label=f"{label}.h{k}")
                       for k in range(c.n_layer)]
        self.ln_f = LayerNorm(c.d_model, eps=c.eps, label=f"{label}.ln_f")
        self.lm_head: Tensor | None = None
        if not c.tied:
            self.lm_head = param([label, "lm_head"], output_dims=[c.vocab_size], input_dims=[c.d_model])
            nn_init.set_init(self.lm_head, "gpt2_normal", lambda p: (c.d_model, c.vocab_size))
            self._keep(self.lm_head)

    # ---------------------------------------------------------------- pieces

    def embed(self, tokens: Tensor) -> Tensor:
        """Token embeddings `batch, time | -> d_model`: rows of `wte` gathered at integer ids
        (`batch, time | -> 1`, an integer precision; `ej.take`), or one-hot rows (`batch,
        time | -> vocab`, float) multiplied by the table."""
        if tokens.value_tn.prec.is_float:
            return transpose(self.wte) @ tokens
        return take(self.wte, tokens, spec=_TOKEN_ROWS, label=f"{self.label}.tokens")

    def position_table(self, n: int) -> Tensor:
        """The first `n` position embeddings as `time | -> d_model`: the whole learned table
        read row for row, or for a shorter sequence its first `n` rows gathered (as PyTorch
        and Hugging Face index `wpe[:n]`), the gradient landing in those rows only."""
        c = self.config
        if not 1 <= n <= c.block_size:
            raise ShapeError(f"einjit: GPT {self.label}: a sequence of {n} tokens does not fit block_size="
                             f"{c.block_size}")
        if self.wpe is None:
            return ndarray(sinusoidal_table(n, c.d_model), batch_axes=1, label=f"{self.label}.sinusoid")
        if n < c.block_size:
            first = ndarray(np.arange(n, dtype=np.int32).reshape(n, 1), batch_axes=1, prec=ops.int32,
                            label=f"{self.label}.first_positions")
            return self.position_rows(first)
        fwd, bwd = _ROWS
        return make_op("rows", [self.wpe], logic="t,d => t|->d", forward=fwd, backprop=bwd,
                       label=f"{self.label}.positions")

    def head(self, h: Tensor) -> Tensor:
        return (self.wte if self.lm_head is None else self.lm_head) @ h

    def hidden(self, x: Tensor, caches: list[tuple[Tensor, Tensor]] | None = None,
               pos: StaticSymbol | None = None) -> Tensor:
        """The blocks and the final LayerNorm over embedded tokens `batch, time | -> d_model`."""
        for k, block in enumerate(self.blocks):
            x = block(x, cache=None if caches is None else caches[k], pos=pos)
        return self.ln_f(x)

    def kv_caches(self, batch_size: int, prefix: str) -> list[tuple[Tensor, Tensor]]:
        """One pair of zeroed key / value buffers per block, `batch, block_size | -> heads, head_dim`."""
        c = self.config
        batch, heads = [batch_size, c.block_size], [c.n_head, c.d_model // c.n_head]
        return [(buffer(f"{prefix}.h{k}.k", batch_dims=batch, output_dims=heads),
                 buffer(f"{prefix}.h{k}.v", batch_dims=batch, output_dims=heads)) for k in range(c.n_layer)]

    def position_rows(self, positions: Tensor) -> Tensor:
        """Position embeddings gathered at integer positions (`..., time | -> 1`)."""
        c = self.config
        table = self.wpe if self.wpe is not None else ndarray(sinusoidal_table(c.block_size, c.d_model),
                                                              label=f"{self.label}.sinusoid")
        return take(table, positions, spec=_POSITION_ROWS, label=f"{self.label}.position_rows")

    def _sequence_length(self, tokens: Tensor) -> int:
        dims = tokens.shape.batch.dims
        if len(dims) < 2 or not hasattr(dims[-1], "d"):
            raise ShapeError(f"einjit: GPT {self.label}: tokens {tokens.label_str} (shape {tokens.shape}) need "
                             f"batch axes `batch, time` of known size")
        return int(dims[-1].d)

    def __call__(self, tokens: Tensor, *, positions: Tensor | None = None,
                 caches: list[tuple[Tensor, Tensor]] | None = None, pos: StaticSymbol | None = None) -> Tensor:
        """Logits of `tokens`. Without `positions` the tokens are positions `0 .. n-1` (any
        `n` up to `block_size`); `positions` (integer ids, one per token)
        places them anywhere, e.g. at the decoding position. `caches` / `pos`: KV caches
        (`kv_caches`) written at the static-symbol position `pos` and attended over."""
        n = self._sequence_length(tokens)
        where = self.position_rows(positions) if positions is not None else self.position_table(n)
        x = self.drop(self.embed(tokens) + where)
        return self.head(self.hidden(x, caches, pos))

    # ---------------------------------------------------------------- parameters and modes

    def layers(self) -> list[Layer]:
        return [self.drop, *self.blocks, self.ln_f]

    def params(self) -> list[Tensor]:
        own = [p for p in (self.wte, self.wpe) if p is not None]
        head = [self.lm_head] if self.lm_head is not None else []
        return own + [p for layer in self.layers() for p in layer.params()] + head

    def named_params(self) -> dict[str, Tensor]:
        """Parameters by label without the model's prefix (`h0.attn.q.w`, `ln_f.gamma`)."""
        prefix = f"{self.label}."
        return {p.label_str.removeprefix(prefix): p for p in self.params()}

    def num_params(self) -> int:
        return sum(int(np.prod(p.dims)) for p in self.params())

    def train(self, mode: bool = True) -> GPT:
        self.training = bool(mode)
        for layer in self.layers():
            layer.train(mode)
        return self
