"""An optimizer's update over many small tensors: AdamW over tensors of the GPT step's parameter
shapes (`bench_gpt.py`'s 2 blocks, d=128: embeddings, attention and MLP matrices, biases and
LayerNorm vectors), einjit against PyTorch eager's `torch.optim.AdamW` (its default multi-tensor
`foreach` path).

    python benchmarks/bench_optim.py [--json] [--threads N]

Each side's step is the same: the gradients of `sum_k sum(p_k * r_k)` (each `p_k.grad` is the
constant `r_k`: one pass writing it), then AdamW. einjit's update is one `~fused` loop nest per
parameter (`train.adam_one`); run the script with another checkout's `src` on `PYTHONPATH` to
compare that checkout's update on the same row. Every row states its figures; nothing here is
asserted.
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


def gpt_param_shapes(n_layer: int = 2) -> list[tuple[int, ...]]:
    """The shapes of the benchmark GPT's parameters (shape inference only, nothing compiled)."""
    import einjit as ej
    from bench_gpt import HEADS, B, D, T, V
    from einjit import train
    from einjit.models import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=n_layer, n_head=HEADS, d_model=D),
                label=f"optim_shapes{n_layer}")
    train.init_params(model(ej.input(f"optim_tokens{n_layer}", batch_dims=[B, T], prec="int32")), seed=0)
    return [p.value.numpy().shape for p in model.params()]


def _values(shapes: list[tuple[int, ...]]):
    import numpy as np

    rng = np.random.default_rng(0)
    return [(rng.standard_normal(s).astype(np.float32), rng.standard_normal(s).astype(np.float32)) for s in shapes]


def _einjit_step(values, threads: int):
    import einjit as ej
    from einjit import nn, train
    from einjit.backends.cc import toolchain as cc

    params = [ej.param(f"optim_p{k}", values=p) for k, (p, _) in enumerate(values)]
    terms = [ej.sum(p * ej.ndarray(r, label=f"optim_r{k}"))
             for k, (p, (_, r)) in enumerate(zip(params, values, strict=True))]
    loss = terms[0]
    for t in terms[1:]:
        loss = loss + t
    opt = nn.AdamW(params, 1e-3)
    return train.to_routine([train.grad_update(loss), opt.update()], name="optim_adamw",
                            options=cc.CcOptions(threads=threads))


def _torch_step(values, threads: int):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    params = [torch.tensor(p, requires_grad=True) for p, _ in values]
    rs = [torch.tensor(r) for _, r in values]
    opt = torch.optim.AdamW(params, 1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        sum((p * r).sum() for p, r in zip(params, rs, strict=True)).backward()
        opt.step()
    return step


def optim_rows(threads: int = 1) -> list[dict]:
    from run import best_times, row

    shapes = gpt_param_shapes()
    values = _values(shapes)
    fns = [_einjit_step(values, threads)]
    peer = _torch_step(values, threads)
    if peer is not None:
        fns.append(peer)
    times = best_times(fns)
    size = sum(p.size for p, _ in values)
    return [row(f"AdamW over the 2-block GPT's {len(shapes)} tensors ({size} values), {threads} thread(s)",
                times[0], {"torch": times[1] if peer else None})]


def main() -> None:
    args = _parse()
    set_threads(args.threads, also=("EINJIT_NUM_THREADS",))
    shared_cache()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    print_rows(optim_rows(args.threads), args.threads, args.json)


if __name__ == "__main__":
    main()
