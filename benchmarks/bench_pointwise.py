"""The GPT step's pointwise and row-reduction layers alone, forward and backward, einjit
against PyTorch eager at the step's sizes (16 x 64 rows, d=128, MLP width 512).

    python benchmarks/bench_pointwise.py [--json] [--threads N]

- LayerNorm with its residual, `y = x + LN(x)` where `x = input * scale` (so that the input
  gradient, LayerNorm's subtracted row sums, is computed): gradients of gamma, beta, scale.
- GELU (tanh approximation, the GPT's) of `input * scale` over 1024 x 512 with the gradient of
  `scale`: one `exp` per element (einjit's own inline `einjit_expf`, `backends/c_math.py`), in
  the forward, which stores the gate `sigmoid(2u)` that the backward reads.
- The MLP's bias and GELU, `gelu(input * scale + bias)`, with the gradients of `scale` and
  `bias`: the GPT step's `+, gelu_gate, gelu` and `+.grad, mlp.fc.b.grad` nests (the bias gradient sums
  the rows of the addition's gradient, which backprop hands on to `input * scale` unchanged).
- Softmax over the attention scores' rows (16 x 4 heads x 64 queries, 64 keys), of
  `input * scale`, with the gradient of `scale`: one `exp` per element.
Every row states its figures; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from threads_env import set_threads, shared_cache

ROWS, D, WIDE = 16 * 64, 128, 512
SCORE_ROWS, KEYS = 16 * 4 * 64, 64


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--threads", type=int, default=1, help="threads for einjit and PyTorch")
    return ap.parse_args()


def _einjit_step(kind: str, threads: int):
    """A routine computing the layer's forward and gradients once per call."""
    import numpy as np

    import einjit as ej
    from einjit import nn, train
    from einjit.backends.cc import toolchain as cc

    rows, width = _shape(kind)
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((rows, width)).astype(np.float32)
    rv = rng.standard_normal((rows, width)).astype(np.float32)
    scale = ej.param(f"bench_{kind}_scale", (rng.standard_normal(width) * 0.5 + 1).astype(np.float32))
    x = ej.ndarray(xv, batch_axes=1, label=f"bench_{kind}_x") * scale
    if kind == "layernorm":
        y = x + nn.LayerNorm(width, label=f"bench_{kind}_ln")(x)
    elif kind == "bias_gelu":
        y = ej.gelu(x + ej.param(f"bench_{kind}_bias", np.zeros(width, dtype=np.float32)), "tanh")
    elif kind == "softmax":
        y = ej.softmax(x)
    else:
        y = ej.gelu(x, "tanh")
    loss = ej.sum(y * ej.ndarray(rv, batch_axes=1, label=f"bench_{kind}_r"), label=f"bench_{kind}_loss")
    train.init_params(loss, seed=0)
    routine = train.to_routine(train.grad_update(loss), name=f"bench_{kind}", options=cc.CcOptions(threads=threads))
    return routine, (xv, rv, scale.value.numpy().copy())


def _shape(kind: str) -> tuple[int, int]:
    return {"layernorm": (ROWS, D), "softmax": (SCORE_ROWS, KEYS)}.get(kind, (ROWS, WIDE))


def _torch_step(kind: str, data, threads: int):
    try:
        import torch
    except ImportError:
        return None
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    xv, rv, sv = (torch.tensor(a) for a in data)
    scale = sv.clone().requires_grad_(True)
    gamma = torch.ones(D, requires_grad=True)
    beta = torch.zeros(D, requires_grad=True)
    bias = torch.zeros(WIDE, requires_grad=True)

    def step():
        for p in (scale, gamma, beta, bias):
            p.grad = None
        x = xv * scale
        if kind == "layernorm":
            y = x + F.layer_norm(x, (D,), gamma, beta)
        elif kind == "softmax":
            y = F.softmax(x, dim=-1)
        else:
            y = F.gelu(x + bias if kind == "bias_gelu" else x, approximate="tanh")
        (y * rv).sum().backward()

    return step


def pointwise_rows(threads: int = 1) -> list[dict]:
    from run import best_times, row

    rows = []
    for kind, name in (("layernorm", f"LayerNorm + residual fwd+bwd, {ROWS}x{D}"),
                       ("gelu", f"GELU (tanh) fwd+bwd, {ROWS}x{WIDE}"),
                       ("bias_gelu", f"bias + GELU (tanh) fwd+bwd, {ROWS}x{WIDE}"),
                       ("softmax", f"softmax fwd+bwd, {SCORE_ROWS}x{KEYS}")):
        routine, data = _einjit_step(kind, threads)
        fns = [routine]
        peer = _torch_step(kind, data, threads)
        if peer is not None:
            fns.append(peer)
        times = best_times(fns)
        rows.append(row(f"{name}, {threads} thread(s)", times[0], {"torch": times[1] if peer else None}))
    return rows


def main() -> None:
    args = _parse()
    set_threads(args.threads, also=("EINJIT_NUM_THREADS",))
    shared_cache()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    rows = pointwise_rows(args.threads)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        peer = ("torch not installed" if r["vs_torch"] is None
                else f"torch {r['torch_s'] * 1e3:.3f} ms ({r['vs_torch']:.2f}x)")
        print(f"{r['workload']:<52} einjit {r['einjit_s'] * 1e3:.3f} ms | {peer}")


if __name__ == "__main__":
    main()
