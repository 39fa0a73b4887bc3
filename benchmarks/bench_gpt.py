"""GPT: einjit against PyTorch on the same model, weights and data.

    python benchmarks/bench_gpt.py [--json] [--threads N] [--only step,decode,memory,val,shapes]

- `step`: one training step (forward, backprop, AdamW) of a GPT with 2 and 4 blocks, d=128,
  4 heads, T=64, B=16, a vocabulary of 96; peers PyTorch eager and `torch.compile`.
- `decode`: per-token latency of greedy generation at batch 1 (block of 64): einjit's KV-cache
  decode routine against PyTorch eager with a KV cache (both include the prompt's prefill).
- `memory`: the bytes a training step keeps — einjit's memory report of the step routine
  (context arrays: parameters, gradients, AdamW moments, hosted inputs; plus routine-local and
  scratch arrays) against PyTorch's parameters, gradients, AdamW state and the tensors autograd
  saves for backprop (counted once per storage with `saved_tensors_hooks`).
- `shapes`: the step's dense contractions one at a time, each as lowering writes it (a zero fill
  and the multiply-add nest) through the optimizer: `x @ wᵀ` forward (qkv/out K=N=128, MLP fc
  K=128 N=512, proj K=512 N=128, LM head N=96) and the input gradients `dy @ w`, over the
  B*T=1024 rows; peers NumPy and PyTorch on the same (1024, K) operand. Each shape twice:
  called in a loop (operands in cache), and with operands evicted from the L1 and L2 before
  each call, as the step's nests find them ("cold operands"). Then the weight gradients
  `w.grad += dyᵀ·x` (summed over those 1024 rows of both operands) of the same layers, both
  ways too.
- `val`: `demo gpt`'s default run trained by einjit and by PyTorch from the same initial weights
  on the same batches; the final validation losses and their relative difference.
Every row states its figures; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from print_rows import print_rows
from threads_env import set_threads, shared_cache


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--threads", type=int, default=1, help="threads for einjit and PyTorch")
    ap.add_argument("--only", default="step,decode,memory,val", help="comma-separated groups")
    return ap.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    set_threads(ARGS.threads, also=("EINJIT_NUM_THREADS",))
shared_cache()

import numpy as np  # noqa: E402  (after the thread settings)

B, T, D, HEADS, V = 16, 64, 128, 4, 96


def _threads(threads: int | None) -> int:
    """The thread count of a row: given, else `EINJIT_NUM_THREADS` (what `--threads` sets)."""
    return threads if threads is not None else int(os.environ.get("EINJIT_NUM_THREADS", "1"))


def _torch(threads: int | None = None):
    """PyTorch at the row's thread count (the peer gets the threads einjit gets)."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(_threads(threads))
    return torch


# ---------------------------------------------------------------- the PyTorch twin


def torch_gpt(model):
    """A PyTorch GPT holding `model`'s current weights (an einjit `models.GPT`)."""
    torch = _torch()
    import torch.nn.functional as F
    from torch import nn as tnn

    c = model.config
    w = {name: np.asarray(p.value.numpy(), dtype=np.float32) for name, p in model.named_params().items()}

    def linear(name: str, n_out: int, n_in: int):
        lin = tnn.Linear(n_in, n_out)
        with torch.no_grad():
            lin.weight.copy_(torch.tensor(w[f"{name}.w"].reshape(n_out, n_in)))
            lin.bias.copy_(torch.tensor(w[f"{name}.b"].reshape(n_out)))
        return lin

    def norm(name: str):
        ln = tnn.LayerNorm(c.d_model, eps=c.eps)
        with torch.no_grad():
            ln.weight.copy_(torch.tensor(w[f"{name}.gamma"]))
            ln.bias.copy_(torch.tensor(w[f"{name}.beta"]))
        return ln

    class Block(tnn.Module):
        def __init__(self, k: int):
            super().__init__()
            d, h = c.d_model, f"h{k}"
            self.ln1, self.ln2 = norm(f"{h}.ln1"), norm(f"{h}.ln2")
            self.q, self.k, self.v = (linear(f"{h}.attn.{n}", d, d) for n in "qkv")
            self.out = linear(f"{h}.attn.out", d, d)
            self.fc, self.proj = linear(f"{h}.mlp.fc", c.mlp_ratio * d, d), linear(f"{h}.mlp.proj", d, c.mlp_ratio * d)

        def heads(self, x):
            b, t, _ = x.shape
            return x.view(b, t, c.n_head, -1).transpose(1, 2)

        def forward(self, x, cache=None):
            y = self.ln1(x)
            q, k, v = self.heads(self.q(y)), self.heads(self.k(y)), self.heads(self.v(y))
            if cache is not None:
                k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
                cache[0], cache[1] = k, v
            a = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None or q.shape[2] > 1)
            x = x + self.out(a.transpose(1, 2).reshape(x.shape))
            return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate=c.approximate))

    class GPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.wte = tnn.Parameter(torch.tensor(w["wte"]))
            self.wpe = tnn.Parameter(torch.tensor(w["wpe"]))
            self.blocks = tnn.ModuleList(Block(k) for k in range(c.n_layer))
            self.ln_f = norm("ln_f")

        def forward(self, ids, caches=None, start=0):
            x = self.wte[ids] + self.wpe[start:start + ids.shape[1]]
            for k, block in enumerate(self.blocks):
                x = block(x, None if caches is None else caches[k])
            return self.ln_f(x) @ self.wte.T

    return GPT()


# ---------------------------------------------------------------- rows


def row(name: str, einjit_s: float, peers: dict[str, float | None]) -> dict:
    out = {"workload": name, "einjit_s": einjit_s}
    for peer, t in peers.items():
        out[f"{peer}_s"] = t
        out[f"vs_{peer}"] = None if t is None else t / einjit_s
    return out


def einjit_train_step(n_layer: int, threads: int | None = None, *, mixed_precision: str | None = None):
    """(model, step, batch, compile seconds): the GPT step of the benchmark's shape, compiled
    for `threads` OpenMP threads (default: `EINJIT_NUM_THREADS`; `mixed_precision`: as for
    `fit.train_step`)."""
    import einjit as ej
    from einjit import fit, nn, train
    from einjit.backends.cc import toolchain as cc
    from einjit.backends.cc.backend import CcBackend
    from einjit.models import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=n_layer, n_head=HEADS, d_model=D),
                label=f"bench{n_layer}")
    x = ej.input(f"tokens{n_layer}", batch_dims=[B, T], prec="int32")
    y = ej.input(f"targets{n_layer}", batch_dims=[B, T], prec="int32")
    loss = nn.cross_entropy(model(x), y)
    opt = nn.AdamW(model.params(), 1e-3)
    train.init_params(loss, seed=0)
    t0 = time.perf_counter()
    backend = CcBackend(cc.CcOptions(threads=_threads(threads)))
    step = fit.train_step(loss, opt.update(), inputs=[x, y], name=f"gpt{n_layer}_step{mixed_precision or ''}",
                          backend=backend, mixed_precision=mixed_precision)
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    ids = rng.integers(0, V, (B, T + 1)).astype(np.int32)
    return model, step, (ids, ids[:, :-1].copy(), ids[:, 1:].copy()), compile_s


def torch_train_step(model, ids, compiled: bool, threads: int | None = None):
    torch = _torch(threads)
    import torch.nn.functional as F

    net = torch_gpt(model)
    opt = torch.optim.AdamW(net.parameters(), 1e-3)
    fwd = torch.compile(net) if compiled else net
    x, y = torch.tensor(ids[:, :-1], dtype=torch.long), torch.tensor(ids[:, 1:], dtype=torch.long)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x).reshape(-1, V), y.reshape(-1))
        loss.backward()
        opt.step()
    return step


def best_time(fns, repeats: int = 5, min_time: float = 1.0) -> list[float]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from run import best_times
    return best_times(fns, repeats, min_time)


def step_rows(threads: int | None = None) -> list[dict]:
    """The training step of 2 and 4 blocks, einjit and its peers at `threads` threads each."""
    rows = []
    for n_layer in (2, 4):
        model, step, (ids, xb, yb), compile_s = einjit_train_step(n_layer, threads)
        fns = [lambda step=step, xb=xb, yb=yb: step(xb, yb)]
        names = []
        if _torch(threads) is not None:
            fns.append(torch_train_step(model, ids, False, threads))
            names.append("torch")
            try:
                fn = torch_train_step(model, ids, True, threads)
                fn()
                fns.append(fn)
                names.append("torch.compile")
            except Exception:  # noqa: BLE001 - an unavailable compiler is a missing peer, not an error
                pass
        times = best_time(fns)
        peers: dict[str, float | None] = {"torch": None, "torch.compile": None}
        peers.update(dict(zip(names, times[1:], strict=True)))
        rows.append(row(f"GPT train step, {n_layer} blocks d={D} h={HEADS} T={T} B={B} V={V}, "
                        f"{_threads(threads)} thread(s)", times[0], peers))
        rows.append(row(f"GPT {n_layer} blocks train step cold compile (build + optimize + gcc)", compile_s, {}))
    return rows


SHAPES = (("x @ wᵀ qkv/out", False, D, D), ("x @ wᵀ MLP fc", False, D, 4 * D),
          ("x @ wᵀ MLP proj", False, 4 * D, D), ("x @ wᵀ LM head", False, D, V), ("dy @ w qkv/out", True, D, D),
          ("dy @ w MLP proj (gelu.grad)", True, D, 4 * D), ("dy @ w MLP fc", True, 4 * D, D))
"""(name, input gradient, K, N) of the step's dense contractions: `c[b, t, n] = sum_k x[b, t, k] *
w[n, k]` forward, `dx[b, t, n] = sum_k dy[b, t, k] * w[k, n]` for an input gradient."""


def _btnk_routine(label: str, out, term, n_: int, k_: int, inputs: dict, threads: int | None):
    """The nest `out[...] += term(b, t, n, k)` over b < B, t < T, n < n_, k < k_ after a zero
    fill of `out`, as lowering writes a dense layer's contraction: `term` gives the FMA's
    operands and `out`'s cell from the four loop indices. Optimized, compiled alone and linked
    in a context holding `inputs` (node -> array) and `out`."""
    from einjit.backends.cc import toolchain as cc
    from einjit.backends.cc.backend import CcBackend
    from einjit.ir import low_level as ll
    from einjit.ir import ops
    from einjit.ir.indexing import Iterator, get_symbol
    from einjit.ir.optimize import optimize_proc
    from einjit.ir.tnode import hosted

    for tn in (*inputs, out):
        tn.update_memory_mode(hosted(), 0)
    b, t, n, k = (Iterator(get_symbol(s)) for s in "btnk")
    a_read, b_read, cell = term(b, t, n, k)
    body: ll.LLStmt = ll.Set(out, cell, ll.Ternop(ops.Ternop.FMA, a_read, b_read, ll.Get(out, cell)))
    for idx, extent in reversed([(b, B), (t, T), (n, n_), (k, k_)]):
        body = ll.ForLoop(idx.symbol, 0, extent - 1, body)
    backend = CcBackend(cc.CcOptions(threads=_threads(threads)))
    ctx = backend.init(label)
    for tn, value in inputs.items():
        ctx.array(tn)[...] = value
    code = optimize_proc(ll.seq(ll.ZeroOut(out), body), name=label)
    return ctx, backend.link(ctx, backend.compile((), code, shared=True, name=label))


def shape_rows(threads: int | None = None) -> list[dict]:
    """Each of `SHAPES` compiled alone as lowering writes it (a zero fill, then the nest),
    against NumPy and PyTorch on the same operands flattened to (B*T, K)."""
    from einjit.ir import low_level as ll
    from einjit.ir.tnode import Tnode

    torch = _torch(threads)
    rng = np.random.default_rng(0)
    rows = []
    for name, input_grad, k_, n_ in SHAPES:
        x, w, c = Tnode("x", (B, T, k_)), Tnode("w", (k_, n_) if input_grad else (n_, k_)), Tnode("c", (B, T, n_))
        xs = rng.standard_normal(x.dims).astype(np.float32)
        ws = rng.standard_normal(w.dims).astype(np.float32)
        ctx, routine = _btnk_routine(
            f"gpt_{'dx' if input_grad else 'fwd'}_{k_}_{n_}", c,
            lambda b, t, n, k, x=x, w=w, dx=input_grad: (ll.Get(x, (b, t, k)), ll.Get(w, (k, n) if dx else (n, k)),
                                                         (b, t, n)),
            n_, k_, {x: xs, w: ws}, threads)
        x2, wt = xs.reshape(B * T, k_), ws if input_grad else np.ascontiguousarray(ws.T)
        routine()
        np.testing.assert_allclose(ctx.array(c).reshape(B * T, n_), x2 @ wt, rtol=1e-4, atol=1e-3)
        fns = [routine, lambda x2=x2, wt=wt: x2 @ wt]
        if torch is not None:
            tx, tw = torch.from_numpy(x2), torch.from_numpy(ws)
            fns.append((lambda tx=tx, tw=tw: tx @ tw) if input_grad else (lambda tx=tx, tw=tw: tx @ tw.T))
        for cold, times in ((False, best_time(fns, min_time=0.3)), (True, cold_times(fns))):
            peers = {"numpy": times[1], "torch": times[2] if torch is not None else None}
            label = f"GPT {name}{' (cold operands)' if cold else ''}: M={B * T} K={k_} N={n_}"
            rows.append(row(f"{label}, {_threads(threads)} thread(s)", times[0], peers)
                        | {"gflops": 2.0 * B * T * k_ * n_ / times[0] / 1e9})
    return rows


WGRAD_SHAPES = (("w.grad qkv/out", D, D), ("w.grad MLP fc", 4 * D, D), ("w.grad MLP proj", D, 4 * D),
                ("w.grad LM head", V, D))
"""(name, N, K) of the step's weight gradients: `w.grad[n, k] += sum_b,t dy[b, t, n] * x[b, t, k]`,
summed over the B*T rows of both operands."""


def wgrad_rows(threads: int | None = None) -> list[dict]:
    """Each of `WGRAD_SHAPES` compiled alone as lowering writes it (a zero fill, then the nest
    over b, t, n, k), against NumPy's and PyTorch's `dyᵀ @ x` on the operands flattened to (B*T, .),
    called in a loop and with cold operands (`cold_times`), as the step's nests find them."""
    from einjit.ir import low_level as ll
    from einjit.ir.tnode import Tnode

    torch = _torch(threads)
    rng = np.random.default_rng(0)
    rows = []
    for name, n_, k_ in WGRAD_SHAPES:
        dy, x, g = Tnode("dy", (B, T, n_)), Tnode("x", (B, T, k_)), Tnode("g", (n_, k_))
        dys = rng.standard_normal(dy.dims).astype(np.float32)
        xs = rng.standard_normal(x.dims).astype(np.float32)
        ctx, routine = _btnk_routine(
            f"gpt_wgrad_{n_}_{k_}", g,
            lambda b, t, n, k, dy=dy, x=x: (ll.Get(dy, (b, t, n)), ll.Get(x, (b, t, k)), (n, k)),
            n_, k_, {dy: dys, x: xs}, threads)
        dy2, x2 = dys.reshape(B * T, n_), xs.reshape(B * T, k_)
        routine()
        np.testing.assert_allclose(ctx.array(g), dy2.T @ x2, rtol=1e-4, atol=1e-3)
        fns = [routine, lambda dy2=dy2, x2=x2: dy2.T @ x2]
        if torch is not None:
            tdy, tx = torch.from_numpy(dy2), torch.from_numpy(x2)
            fns.append(lambda tdy=tdy, tx=tx: tdy.T @ tx)
        for cold, times in ((False, best_time(fns, min_time=0.3)), (True, cold_times(fns))):
            peers = {"numpy": times[1], "torch": times[2] if torch is not None else None}
            label = f"GPT {name}{' (cold operands)' if cold else ''}: N={n_} K={k_} over M={B * T} rows"
            rows.append(row(f"{label}, {_threads(threads)} thread(s)", times[0], peers)
                        | {"gflops": 2.0 * B * T * k_ * n_ / times[0] / 1e9})
    return rows


def cold_times(fns, calls: int = 60) -> list[float]:
    """Each function's best time over `calls` calls, each after 4 MiB of other writes: in the
    training step a nest's operands were written by earlier nests and have left the L1 and
    L2, which a loop of calls on the same arrays hides. The calls of the functions alternate,
    so a busy machine slows them alike."""
    junk = np.zeros(1 << 20, dtype=np.float32)
    best = [float("inf")] * len(fns)
    for _ in range(calls):
        for n, fn in enumerate(fns):
            junk += 1.0
            t0 = time.perf_counter()
            fn()
            best[n] = min(best[n], time.perf_counter() - t0)
    return best


def decode_rows(n_tokens: int = 48, threads: int | None = None) -> list[dict]:
    """Greedy decoding; einjit's routines use the default backend (`EINJIT_NUM_THREADS`)."""
    from einjit import train
    from einjit.models import GPT, GPTConfig
    from einjit.models.generate import Generator

    model = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=HEADS, d_model=D), label="decode")
    train.init_params(model.params(), seed=0)
    gen = Generator(model)
    prompt = np.array([[1, 2, 3, 4]])
    t0 = time.perf_counter()
    gen.generate(prompt, n_tokens, temperature=0.0)
    ej_s = (time.perf_counter() - t0) / n_tokens
    peers: dict[str, float | None] = {"torch": None}
    torch = _torch(threads)
    if torch is not None:
        net = torch_gpt(model).eval()
        with torch.no_grad():
            ids = torch.tensor(prompt)
            caches = [[torch.zeros(1, HEADS, 0, D // HEADS), torch.zeros(1, HEADS, 0, D // HEADS)] for _ in range(2)]
            t0 = time.perf_counter()
            logits = net(ids, caches)
            pos = ids.shape[1]
            for _ in range(n_tokens):
                nxt = logits[:, -1].argmax(-1, keepdim=True)
                logits = net(nxt, caches, start=pos)
                pos += 1
            peers["torch"] = (time.perf_counter() - t0) / n_tokens
    return [row(f"GPT 2 blocks greedy decode per token (B=1, block {T})", ej_s, peers)]


def torch_step_bytes(model, ids) -> int:
    """Parameters + gradients + AdamW state + tensors saved for backprop (one count per storage)."""
    torch = _torch()
    import torch.nn.functional as F

    net = torch_gpt(model)
    opt = torch.optim.AdamW(net.parameters(), 1e-3)
    x, y = torch.tensor(ids[:, :-1], dtype=torch.long), torch.tensor(ids[:, 1:], dtype=torch.long)
    saved: dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.nn.Parameter) or any(t is p for p in net.parameters()):
            return t
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    opt.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(net(x).reshape(-1, V), y.reshape(-1))
    loss.backward()
    opt.step()
    params = sum(p.numel() * p.element_size() for p in net.parameters())
    state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    return 2 * params + state + sum(saved.values())


def memory_rows() -> list[dict]:
    from einjit import memory

    rows = []
    for n_layer in (2, 4):
        model, step, (ids, xb, yb), _ = einjit_train_step(n_layer)
        step(xb, yb)
        rep = memory.report(step.routine)
        ej_bytes = rep.kept_bytes + rep.local_bytes + rep.scratch_bytes
        torch_bytes = torch_step_bytes(model, ids) if _torch() is not None else None
        out = {"workload": f"GPT {n_layer} blocks train step: bytes kept (params, grads, AdamW, activations)",
               "einjit_bytes": ej_bytes, "einjit_kept": rep.kept_bytes, "einjit_local": rep.local_bytes,
               "einjit_scratch": rep.scratch_bytes, "torch_bytes": torch_bytes,
               "einjit_over_torch": None if torch_bytes is None else ej_bytes / torch_bytes}
        rows.append(out)
    return rows


def val_rows() -> list[dict]:
    """`demo gpt`'s default run, einjit against PyTorch from the same weights and batches."""
    from einjit.demos import gpt as demo

    cfg = demo.GPTDemoConfig()
    start: dict = {}
    t0 = time.perf_counter()
    result = demo.run_gpt(cfg, quiet=True, sample_chars=0, on_init=lambda m: start.setdefault("net", torch_gpt(m)))
    ej_s = time.perf_counter() - t0
    torch = _torch()
    if torch is None:
        return [{"workload": "demo gpt validation loss", "einjit_val_loss": result.val_loss, "torch_val_loss": None}]
    import torch.nn.functional as F

    net = start["net"]
    train_ids, val_ids = demo.split(demo.encode(demo.corpus()))
    offsets = demo.batch_offsets(len(train_ids), cfg.block_size, cfg.batch_size, cfg.epochs * cfg.steps_per_epoch,
                                 cfg.seed)
    opt = torch.optim.AdamW(net.parameters(), cfg.lr, weight_decay=cfg.weight_decay)
    t0 = time.perf_counter()
    for o in offsets:
        xb, yb = (torch.tensor(a, dtype=torch.long) for a in demo.windows(train_ids, o, cfg.block_size))
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(xb).reshape(-1, net.wte.shape[0]), yb.reshape(-1)).backward()
        opt.step()
    torch_s = time.perf_counter() - t0
    with torch.no_grad():
        losses = [F.cross_entropy(net(torch.tensor(a, dtype=torch.long)).reshape(-1, net.wte.shape[0]),
                                  torch.tensor(b, dtype=torch.long).reshape(-1))
                  for a, b in (demo.windows(val_ids, o, cfg.block_size) for o in demo.val_offsets(len(val_ids), cfg))]
    torch_val = float(np.mean([v.item() for v in losses]))
    return [{"workload": f"demo gpt default run ({result.steps} steps): final validation loss",
             "einjit_val_loss": result.val_loss, "torch_val_loss": torch_val,
             "relative_difference": abs(result.val_loss - torch_val) / torch_val,
             "einjit_train_s": result.seconds, "einjit_total_s": ej_s, "torch_train_s": torch_s}]


def main() -> None:
    groups = {"step": step_rows, "decode": decode_rows, "memory": memory_rows, "val": val_rows,
              "shapes": lambda: shape_rows() + wgrad_rows()}
    only = [g for g in ARGS.only.split(",") if g]
    unknown = sorted(set(only) - set(groups))
    if unknown:
        raise SystemExit(f"bench_gpt.py: unknown group(s) {unknown}; choose from {sorted(groups)}")
    rows = [r for g in only for r in groups[g]()]
    print_rows(rows, ARGS.threads, ARGS.json)


if __name__ == "__main__":
    main()
