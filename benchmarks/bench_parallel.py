"""Two cores, two ways: OpenMP threads inside one routine, and data-parallel devices.

`threads` (thread scaling): the same code compiled at 1 and at N OpenMP threads in one
process (`CcOptions(threads=...)`) and timed side by side, batches interleaved round by round
(best of the rounds), so the load of other processes hits both alike, and the many-thread
program once more with its OpenMP calls on libgomp instead of einjit's thread team: `a @ b` and `w @ x`
(n = 512 and 1024, as GFLOP/s and as a share of the measured N-core FMA peak), the
MNIST-size convnet step (`bench_convnet`) and the GPT training step (`bench_gpt`, 2 blocks).

`dp` (data-parallel speed-up): one training step of a 784 → 256 → 256 → 10 ReLU MLP (squared
error, SGD with momentum, float32, synthetic data) on a batch of 256, computed

- on one device: the whole step fused into one C routine, called from the main thread;
- on 1 and 2 multicore devices with `einjit.training.parallel.DataParallel` (each of the 2 devices a
  shard of 128): gradients summed through merge buffers, update on device 0, parameters copied
  back.

Steps are scheduled back to back and timed to a final sync. The same step sequence runs in
every configuration, so the final parameters are compared too (float32 rounding apart, they
must agree: the speed-up does not come from skipping work).

    python benchmarks/bench_parallel.py [--only threads,dp] [--threads N] [--steps N] [--devices N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BATCH, N_IN, HIDDEN, N_OUT, UNION_BATCHES = 256, 784, 256, 10, 4


def build(replicas: int):
    """The MLP on batches of `BATCH // replicas`; the loss divided by the union batch `BATCH`."""
    import einjit as ej
    from einjit import train
    from einjit.ir.indexing import get_static_symbol

    rng = np.random.default_rng(0)
    shard = BATCH // replicas
    n_batches = UNION_BATCHES * replicas
    data = rng.standard_normal((n_batches, shard, N_IN)).astype(np.float32)
    targets = np.eye(N_OUT, dtype=np.float32)[rng.integers(0, N_OUT, n_batches * shard)]
    batch_n = get_static_symbol(n_batches, "batch")
    x = ej.batch_slice(ej.ndarray(data, batch_axes=2, label="images"), batch_n)
    y = ej.batch_slice(ej.ndarray(targets.reshape(n_batches, shard, N_OUT), batch_axes=2, label="targets"), batch_n)
    w1, b1 = ej.param("w1", output_dims=[HIDDEN]), ej.param("b1", output_dims=[HIDDEN], init="zeros")
    w2, b2 = ej.param("w2", output_dims=[HIDDEN]), ej.param("b2", output_dims=[HIDDEN], init="zeros")
    w3, b3 = ej.param("w3", output_dims=[N_OUT]), ej.param("b3", output_dims=[N_OUT], init="zeros")
    out = b3 + w3 @ ej.relu(b2 + w2 @ ej.relu(b1 + w1 @ x))
    loss = ej.div(ej.sum((out - y) * (out - y), "...|... => 0"), BATCH)
    train.init_params(loss, seed=1)
    update = train.sgd_update(loss, 0.01, momentum=0.9)
    return loss, [w1, b1, w2, b2, w3, b3], update, batch_n


def fused_one_device(steps: int, warmup: int) -> tuple[float, list[np.ndarray]]:
    from einjit import train
    from einjit.ir.indexing import IntRef

    loss, params, update, batch_n = build(1)
    refs = {batch_n: IntRef(0)}
    routine = train.to_routine([train.grad_update(loss), update], bindings=refs, name="bench_fused_step")
    for k in range(warmup):
        refs[batch_n].value = k % UNION_BATCHES
        routine()
    start = time.perf_counter()
    for k in range(warmup, warmup + steps):
        refs[batch_n].value = k % UNION_BATCHES
        routine()
    return (time.perf_counter() - start) / steps, [p.value.numpy() for p in params]


def data_parallel(devices: int, steps: int, warmup: int) -> tuple[float, list[np.ndarray]]:
    from einjit.training import parallel

    loss, params, update, batch_n = build(devices)
    with parallel.parallel_update(loss, update, num_devices=devices, bindings=[batch_n], shard=batch_n,
                               name=f"bench_dp{devices}") as dp:
        for k in range(warmup):
            dp.bindings[batch_n].value = k % UNION_BATCHES
            dp.step()
        dp.sync()
        start = time.perf_counter()
        for k in range(warmup, warmup + steps):
            dp.bindings[batch_n].value = k % UNION_BATCHES
            dp.step()
        dp.sync()
        seconds = (time.perf_counter() - start) / steps
    return seconds, [p.value.numpy() for p in params]


def max_relative_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y)) / (np.max(np.abs(y)) or 1.0)) for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------- thread scaling


def _options(threads: int):
    from einjit.backends.cc import toolchain as cc
    return cc.CcOptions(threads=threads)


def matmul_pair(n: int, transposed: bool, threads: int):
    """`c = a @ b` (or `a @ bᵀ`) compiled at 1 and at `threads` threads, each checked against NumPy."""
    from einjit.backends.cc.backend import CcBackend
    from einjit.ir import low_level as ll
    from einjit.ir import ops
    from einjit.ir.indexing import Iterator, get_symbol
    from einjit.ir.optimize import optimize_proc
    from einjit.ir.tnode import Tnode, hosted

    a, b, c = Tnode("a", (n, n)), Tnode("b", (n, n)), Tnode("c", (n, n))
    for tn in (a, b, c):
        tn.update_memory_mode(hosted(), 0)
    i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
    bi = (Iterator(j), Iterator(k)) if transposed else (Iterator(k), Iterator(j))
    prod = ll.Binop(ops.Binop.MUL, ll.Get(a, (Iterator(i), Iterator(k))), ll.Get(b, bi))
    acc = ll.Set(c, (Iterator(i), Iterator(j)), ll.Binop(ops.Binop.ADD, ll.Get(c, (Iterator(i), Iterator(j))), prod))
    code = ll.seq(ll.ZeroOut(c), ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, n - 1, ll.ForLoop(k, 0, n - 1, acc))))
    opt = optimize_proc(code, name=f"mm{n}")
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    routines = []
    for t in (1, threads):
        backend = CcBackend(_options(t))
        ctx = backend.init(f"mm{n}_{t}")
        ctx.array(a)[...], ctx.array(b)[...] = x, y
        routine = backend.link(ctx, backend.compile((), opt, shared=True, name=f"mm{n}_{int(transposed)}_{t}"))
        routine()
        np.testing.assert_allclose(ctx.array(c), x @ (y.T if transposed else y), rtol=1e-3, atol=1e-3)
        routines.append(routine)
    return routines


def convnet_pair(threads: int):
    """The `bench_convnet` step compiled at 1 and at `threads` threads, each from its own graph
    (`gpt_pair` says why)."""
    from bench_convnet import nn_loss
    from einjit import train

    routines = []
    for t in (1, threads):
        loss, opt = nn_loss()
        routines.append(train.to_routine([train.grad_update(loss), opt.update()], name=f"scaling_convnet_{t}",
                                         options=_options(t)))
    return routines


def gpt_pair(threads: int, n_layer: int = 2):
    """The `bench_gpt` training step (forward, backprop, AdamW) compiled at 1 and at `threads`
    threads, each from its own graph, so the two routines start from the same parameters and
    neither one's AdamW updates move the values the other is timed on."""
    return [_gpt_step(t, n_layer) for t in (1, threads)]


def _gpt_step(threads: int, n_layer: int):
    import einjit as ej
    from bench_gpt import HEADS, B, D, T, V
    from einjit import nn, train
    from einjit.ir import assignments as asg
    from einjit.models import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=n_layer, n_head=HEADS, d_model=D), label="scaling")
    ids = np.random.default_rng(0).integers(0, V, (B, T + 1)).astype(np.int32)
    x = ej.input("scaling_tokens", batch_dims=[B, T], prec="int32", values=ids[:, :-1].copy())
    y = ej.input("scaling_targets", batch_dims=[B, T], prec="int32", values=ids[:, 1:].copy())
    loss = nn.cross_entropy(model(x), y)
    opt = nn.AdamW(model.params(), 1e-3)
    train.init_params(loss, seed=0)
    code = asg.sequence(train.grad_update(loss), opt.update())
    return train.to_routine(code, name=f"scaling_gpt{n_layer}_{threads}", options=_options(threads))


def on_libgomp(pair, *args):
    """The many-thread routine of `pair(*args)` with its OpenMP calls on libgomp instead of
    einjit's thread team (`EINJIT_THREAD_TEAM=gomp`, `backends/cc/thread_team.py`)."""
    saved = os.environ.get("EINJIT_THREAD_TEAM")
    os.environ["EINJIT_THREAD_TEAM"] = "gomp"
    try:
        return pair(*args)[1]
    finally:
        if saved is None:
            del os.environ["EINJIT_THREAD_TEAM"]
        else:
            os.environ["EINJIT_THREAD_TEAM"] = saved


def thread_rows(threads: int, repeats: int) -> list[dict]:
    """Each workload at 1 and at `threads` threads, side by side (see the module docstring),
    and at `threads` threads on libgomp (`on_libgomp`, time `tg_s`). Each row also carries the
    per-CPU median FMA rates taken right after it (`cpu_gflops`): a row whose probe finds one CPU
    well below the others was measured while the host slowed that CPU."""
    from machine import measure, per_cpu_gflops
    from run import SETTLE_S, best_times

    peak = measure(threads).fma_peak_gflops
    rows = []
    for n in (512, 1024):
        for transposed in (False, True):
            one, many = matmul_pair(n, transposed, threads)
            gomp = on_libgomp(matmul_pair, n, transposed, threads)
            cpu: list[float] = []
            t1, tn, tg = best_times([one, many, gomp], repeats, settle=SETTLE_S, cpu=cpu)
            name = f"fp32 matmul {'w @ x (A·Bᵀ)' if transposed else 'a @ b'} n={n}"
            flops = 2.0 * n**3
            rows.append({"workload": name, "t1_s": t1, "tn_s": tn, "tg_s": tg, "speedup": t1 / tn, "flops": flops,
                         "gflops": flops / tn / 1e9, "share_of_peak": flops / tn / 1e9 / peak, "tn_cpu_s": cpu[1],
                         "cpu_gflops": per_cpu_gflops()})
    with tempfile.TemporaryDirectory() as cache:
        os.environ["EINJIT_CACHE_DIR"] = cache
        for name, pair in (("MNIST-size convnet step (einjit.nn), B=64", convnet_pair),
                           ("GPT train step, 2 blocks d=128 h=4 T=64 B=16", gpt_pair)):
            one, many = pair(threads)
            gomp = on_libgomp(pair, threads)
            cpu = []
            t1, tn, tg = best_times([one, many, gomp], repeats, 1.0, settle=SETTLE_S, cpu=cpu)
            rows.append({"workload": name, "t1_s": t1, "tn_s": tn, "tg_s": tg, "speedup": t1 / tn,
                         "tn_cpu_s": cpu[1], "cpu_gflops": per_cpu_gflops()})
    return rows


def balance(rates: dict[int, float]) -> str:
    """The slowest CPU's median FMA rate as a share of the fastest's, after a thread row."""
    return f"slowest CPU at {100 * min(rates.values()) / max(rates.values()):.0f}% of the fastest"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="threads,dp", help="comma-separated groups: threads, dp")
    parser.add_argument("--threads", type=int, default=2, help="the thread count compared with 1 (threads)")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds; the best is kept (threads)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    groups = set(args.only.split(","))
    if "threads" in groups:
        print(f"thread scaling, 1 vs {args.threads} threads side by side; {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.2f}")
        for r in thread_rows(args.threads, args.repeats):
            extra = f"  {r['gflops']:6.1f} GFLOP/s, {100 * r['share_of_peak']:4.0f}% of peak" if "gflops" in r else ""
            print(f"  {r['workload']:48s} 1 thread {1e3 * r['t1_s']:8.2f} ms  {args.threads} threads "
                  f"{1e3 * r['tn_s']:8.2f} ms (CPU {r['tn_cpu_s'] / r['tn_s']:.2f} cores)  "
                  f"speed-up {r['speedup']:4.2f}x{extra}, libgomp {1e3 * r['tg_s']:8.2f} ms; "
                  f"{balance(r['cpu_gflops'])}")
    if "dp" not in groups:
        return
    print(f"MLP {N_IN} → {HIDDEN} → {HIDDEN} → {N_OUT}, batch {BATCH}, float32, SGD + momentum; "
          f"{args.steps} timed steps; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    fused, reference = fused_one_device(args.steps, args.warmup)
    print(f"  1 device, fused routine          {1e3 * fused:8.2f} ms/step")
    rows = [(1, *data_parallel(1, args.steps, args.warmup))]
    if args.devices > 1:
        rows.append((args.devices, *data_parallel(args.devices, args.steps, args.warmup)))
    for n, seconds, params in rows:
        shard = BATCH // n
        print(f"  {n} device(s) x batch {shard:3d}, DataParallel {1e3 * seconds:8.2f} ms/step   "
              f"speed-up vs fused {fused / seconds:4.2f}x   max rel. param difference "
              f"{max_relative_difference(params, reference):.1e}")


if __name__ == "__main__":
    main()
