"""Causal self-attention alone: einjit against PyTorch on the GPT benchmark's attention.

    python benchmarks/bench_attention.py [--json] [--threads N]

One causal multi-head attention layer of `bench_gpt`'s shape (B=16 sequences of T=64 tokens,
d=128, 4 heads of 32): the forward pass and the gradients of its weights and biases, for a
loss `sum(y * r)`. einjit's step is the routine `train.grad_update` compiles (its scores, masked
softmax, `P v` and their gradients clipped to the causal triangle, `ir/sched/causal.py`);
PyTorch's is `nn.MultiheadAttention` with the causal mask, forward and `backward()`, the same
weights, at the same thread count. The row states its figures; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys

from print_rows import print_rows
from threads_env import set_threads, shared_cache


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--threads", type=int, default=1, help="threads for einjit and PyTorch")
    return ap.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    set_threads(ARGS.threads, also=("EINJIT_NUM_THREADS",))
shared_cache()

import numpy as np  # noqa: E402  (after the thread settings)

B, T, D, HEADS = 16, 64, 128, 4


def _threads(threads: int | None) -> int:
    return threads if threads is not None else int(os.environ.get("EINJIT_NUM_THREADS", "1"))


def einjit_attention_step(threads: int | None = None):
    """(layer, step, x, r): the gradients of a causal attention layer as one compiled routine."""
    import einjit as ej
    from einjit import train
    from einjit.backends.cc import toolchain as cc
    from einjit.nn.attention import MultiHeadAttention

    rng = np.random.default_rng(0)
    xv = rng.standard_normal((B, T, D)).astype(np.float32)
    rv = rng.standard_normal((B, T, D)).astype(np.float32)
    layer = MultiHeadAttention(D, HEADS, causal=True, label="bench_attn")
    x = ej.ndarray(xv, batch_axes=2, label="x")
    r = ej.ndarray(rv, batch_axes=2, label="r")
    loss = ej.sum(layer(x) * r, label="loss")
    train.init_params(loss, seed=0)
    routine = train.to_routine(train.grad_update(loss), name="bench_attention_step",
                               options=cc.CcOptions(threads=_threads(threads)))
    return layer, routine, xv, rv


def torch_attention_step(layer, xv: np.ndarray, rv: np.ndarray, threads: int | None = None):
    """PyTorch's causal `nn.MultiheadAttention` with `layer`'s weights: forward and backward."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(_threads(threads))
    ref = torch.nn.MultiheadAttention(D, HEADS, batch_first=True)
    p = {name: (w.value.numpy(), b.value.numpy()) for name, (w, b) in layer.proj.items()}
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.tensor(np.concatenate([p[n][0].reshape(D, D) for n in "qkv"])))
        ref.in_proj_bias.copy_(torch.tensor(np.concatenate([p[n][1].reshape(D) for n in "qkv"])))
        ref.out_proj.weight.copy_(torch.tensor(p["out"][0].reshape(D, D)))
        ref.out_proj.bias.copy_(torch.tensor(p["out"][1]))
    x, r = torch.tensor(xv), torch.tensor(rv)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(T)

    def step():
        ref.zero_grad(set_to_none=True)
        y, _ = ref(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)
        (y * r).sum().backward()
    return step


def attention_rows(threads: int | None = None) -> list[dict]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from run import best_times

    layer, routine, xv, rv = einjit_attention_step(threads)
    fns = [routine]
    peer = torch_attention_step(layer, xv, rv, threads)
    if peer is not None:
        fns.append(peer)
    times = best_times(fns, 7, 1.0)
    torch_s = times[1] if peer is not None else None
    return [{"workload": f"causal attention layer, forward + weight gradients, B={B} T={T} d={D} h={HEADS}, "
                         f"{_threads(threads)} thread(s)",
             "einjit_s": times[0], "torch_s": torch_s, "vs_torch": None if torch_s is None else torch_s / times[0]}]


def main() -> None:
    assert ARGS is not None  # parsed when run as a script
    rows = attention_rows(ARGS.threads)
    print_rows(rows, ARGS.threads, ARGS.json)


if __name__ == "__main__":
    main()
