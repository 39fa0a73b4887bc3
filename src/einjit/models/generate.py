"""Text generation from a `GPT`: routines compiled once, sampling on the host.

`Generator(model, batch_size)` compiles the model's forward pass over a whole block
(`block_size` positions, `batch_size` sequences) once. A prompt shorter than the block is
padded at the end: attention is causal, so the padding cannot change the logits of the
positions before it, and the logits at the prompt's last position are the next token's.
Every later token and every later prompt up to `block_size` reuses the same routine — the
compiler never runs during generation (`tests/models/test_generate.py` counts its runs).

Sampling is PyTorch / nanoGPT's: logits divided by `temperature`, all but the `top_k` largest
set to -inf, softmax, one draw from a NumPy generator seeded by `seed`; `temperature=0` is
greedy (argmax).
"""

from __future__ import annotations

import numpy as np

from einjit.models.gpt import GPT
from einjit.tensor.inputs import input as new_input
from einjit.tensor.tensor import TensorError
from einjit.training import fit


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
    """The compiled routines of one model for `batch_size` sequences at a time."""

    def __init__(self, model: GPT, *, batch_size: int = 1):
        self.model, self.batch_size = model, batch_size
        c = model.config
        self.vocab, self.block = c.vocab_size, c.block_size
        self._eye = np.eye(self.vocab, dtype=np.float32)
        tokens = new_input(f"{model.label}_prompt", batch_dims=[batch_size, self.block], output_dims=[self.vocab])
        self.prefill = fit.forward_step(model(tokens), inputs=[tokens], name=f"{model.label}_prefill")

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """The next-token logits `batch x vocab` after `ids` (`batch x n`, `1 <= n <= block_size`)."""
        n = ids.shape[1]
        padded = np.zeros((self.batch_size, self.block), dtype=np.int64)
        padded[:, :n] = ids
        return self.prefill(self._eye[padded])[:, n - 1]

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
        """`ids` followed by `max_new_tokens` sampled tokens; the context is the last
        `block_size` tokens (a longer sequence slides)."""
        ids = np.asarray(ids)
        self._check(ids, max_new_tokens, temperature, top_k)
        rng = np.random.default_rng(seed)
        was_training = self.model.training
        self.model.eval()
        try:
            out = ids.astype(np.int64)
            for _ in range(max_new_tokens):
                nxt = sample_next(self.logits(out[:, -self.block:]), temperature, top_k, rng)
                out = np.concatenate([out, nxt[:, None]], axis=1)
        finally:
            self.model.train(was_training)
        return out
