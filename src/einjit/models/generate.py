"""Text generation from a `GPT`: a prefill routine and a KV-cache decode routine, each
compiled once, and sampling on the host.

`Generator(model, batch_size)` builds two forward graphs of the model sharing its weights and
one key / value buffer pair per block (`GPT.kv_caches`):

- prefill: a whole block of `block_size` tokens (a shorter prompt padded at the end: attention
  is causal, so padding cannot change the logits before it); it writes every position's keys
  and values into the caches and gives the logits at the prompt's last position;
- decode: one token per sequence at position `pos`, a static symbol bound per call: its keys
  and values are written into the caches at `pos` (`ej.write_at`) and it attends over cached
  positions `<= pos`, so a token costs one token's work, not a block's.

Every token and every prompt up to `block_size` reuses these two routines — the compiler never
runs during generation (`tests/models/test_generate.py` counts its runs). Past `block_size`
tokens the context slides (the last `block_size` tokens, as nanoGPT crops): each further token
is a prefill of that window.

Sampling is PyTorch / nanoGPT's: logits divided by `temperature`, all but the `top_k` largest
set to -inf, softmax, one draw from a NumPy generator seeded by `seed`; `temperature=0` is
greedy (argmax).
"""

from __future__ import annotations

import numpy as np

from einjit.ir.indexing import IntRef, StaticSymbol, get_static_symbol
from einjit.models.gpt import GPT
from einjit.tensor.inputs import input as new_input
from einjit.tensor.tensor import TensorError
from einjit.training import fit, train


def sample_next(logits: np.ndarray, temperature: float, top_k: int | None, rng: np.random.Generator) -> np.ndarray:
    """One token per row of `logits` (`batch x vocab`)."""
    if temperature == 0.0:
        return logits.argmax(-1)
    z = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.sort(z, axis=-1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.array([rng.choice(len(row), p=row) for row in p])


class Generator:
    """The compiled prefill and decode routines of one model for `batch_size` sequences."""

    def __init__(self, model: GPT, *, batch_size: int = 1):
        self.model, self.batch_size = model, batch_size
        c = model.config
        self.vocab, self.block = c.vocab_size, c.block_size
        name = f"{model.label}_b{batch_size}"
        caches = model.kv_caches(batch_size, f"{name}.cache")
        start, self._pos = get_static_symbol(name="prefill_pos"), get_static_symbol(name="pos")
        prompt = new_input(f"{name}_prompt", batch_dims=[batch_size, self.block], prec="int32")
        self.prefill = _step(model(prompt, caches=caches, pos=start), [prompt], {start: IntRef(0)}, f"{name}_prefill")
        token = new_input(f"{name}_token", batch_dims=[batch_size, 1], prec="int32")
        where = new_input(f"{name}_position", batch_dims=[1, 1], prec="int32")
        self._pos_ref = IntRef(0)
        self.decode = _step(model(token, positions=where, caches=caches, pos=self._pos), [token, where],
                            {self._pos: self._pos_ref}, f"{name}_decode")

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """The next-token logits `batch x vocab` after `ids` (`batch x n`, `1 <= n <= block_size`),
        from the prefill routine, which also fills the caches with the keys and values of `ids`."""
        n = ids.shape[1]
        padded = np.zeros((self.batch_size, self.block), dtype=np.int32)
        padded[:, :n] = ids
        return self.prefill(padded)[:, n - 1]

    def prompt_logits(self, ids: np.ndarray) -> np.ndarray:
        """`logits(ids)`, filling the caches the same way; a prompt of at most a quarter block
        runs through the decode routine one position at a time instead, since the prefill
        computes a whole block whatever the prompt's length (a 4-token prompt in a 64-token
        block cost as much as 40 decoded tokens)."""
        n = ids.shape[1]
        if 4 * n > self.block:
            return self.logits(ids)
        for pos in range(n):
            logits = self.next_logits(ids[:, pos], pos)
        return logits

    def next_logits(self, token: np.ndarray, pos: int) -> np.ndarray:
        """The logits after `token` (`batch`) placed at position `pos`, the caches holding the
        positions before it; its keys and values join the caches."""
        self._pos_ref.value = pos
        return self.decode(token.astype(np.int32).reshape(self.batch_size, 1),
                           np.array([[pos]], dtype=np.int32))[:, 0]

    def _check(self, ids: np.ndarray, max_new_tokens: int, temperature: float, top_k: int | None) -> None:
        if ids.ndim != 2 or ids.shape[0] != self.batch_size or ids.shape[1] < 1:
            raise TensorError(f"einjit: generate: ids must be ({self.batch_size}, n >= 1) token ids, got shape "
                              f"{ids.shape}")
        if ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= self.vocab:
            raise TensorError(f"einjit: generate: token ids must be integers in 0..{self.vocab - 1}")
        if max_new_tokens < 0 or temperature < 0 or (top_k is not None and top_k < 1):
            raise TensorError(f"einjit: generate: max_new_tokens ({max_new_tokens}) and temperature ({temperature}) "
                              f"must be >= 0 and top_k ({top_k}) >= 1")

    def generate(self, ids, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
                 seed: int = 0) -> np.ndarray:
        """`ids` followed by `max_new_tokens` sampled tokens."""
        ids = np.asarray(ids)
        self._check(ids, max_new_tokens, temperature, top_k)
        rng = np.random.default_rng(seed)
        was_training = self.model.training
        self.model.eval()
        try:
            out = ids.astype(np.int64)
            if max_new_tokens:
                logits = self.prompt_logits(out[:, -self.block:])
            for k in range(max_new_tokens):
                nxt = sample_next(logits, temperature, top_k, rng)
                out = np.concatenate([out, nxt[:, None]], axis=1)
                if k + 1 == max_new_tokens:
                    break
                n = out.shape[1]
                logits = self.next_logits(nxt, n - 1) if n <= self.block else self.logits(out[:, -self.block:])
        finally:
            self.model.train(was_training)
        return out


def _step(logits, inputs, bindings: dict[StaticSymbol, IntRef], name: str) -> fit.ForwardStep:
    routine = train.to_routine(fit.forward_code(logits), bindings=bindings, name=name)
    return fit.ForwardStep(routine, inputs, name, [logits])
