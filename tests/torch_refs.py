"""PyTorch reference modules holding einjit's weights, for the comparison tests (callers skip
without torch)."""

from __future__ import annotations

import numpy as np


def torch_mha(torch, p: dict[str, tuple[np.ndarray, np.ndarray]], d: int, heads: int):
    """`torch.nn.MultiheadAttention` in float64 with the weights and biases of an einjit
    attention layer's projections `p` (`"q"`, `"k"`, `"v"`, `"out"` -> (weight, bias))."""
    ref = torch.nn.MultiheadAttention(d, heads, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.tensor(np.concatenate([p[n][0].reshape(d, d) for n in "qkv"])))
        ref.in_proj_bias.copy_(torch.tensor(np.concatenate([p[n][1].reshape(d) for n in "qkv"])))
        ref.out_proj.weight.copy_(torch.tensor(p["out"][0].reshape(d, d)))
        ref.out_proj.bias.copy_(torch.tensor(p["out"][1]))
    return ref
