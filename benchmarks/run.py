"""One benchmark table: every row of issue 13's table, einjit against its peers, in one run.

    python benchmarks/run.py [--json] [--threads N] [--quick] [--only GROUPS] [--sizes N,..]

Rows: fp32 matmul for both operand layouts (`a @ b`, and the dense layer's `w @ x`, i.e.
A·Bᵀ) at n = 256 / 512 / 1000 / 1024 (1000: extents the register blocks do not divide);
the training steps of an MLP 784→256→256→10 (B=256, SGD with momentum), an MLP 2→32→32→1
(B=1024) and the moons MLP (B=10); an MNIST-size convnet step (B=64), written with einsum
convolutions and built from `einjit.nn` layers (peer: PyTorch only), and their cold compiles;
ATL matmul and matvec through einjit's backend; the optimizer on a chain of 400 virtual nodes;
the cold compile of the moons step; the bytes an MLP step keeps with local storage on and off;
the GPT training step (2 and 4 blocks, d=128, T=64, B=16) and per-token KV-cache decoding
(peers PyTorch eager and `torch.compile`); the bf16 matmul (peers einjit's fp32, NumPy's fp32
and PyTorch's bf16 matmul) and the MLP, convnet and GPT steps in bf16 mixed precision against
fp32 (`bench_bf16.py`; each bf16 row names the kernel it ran: `vdpbf16ps` on a CPU with
AVX512_BF16, else the fp32 fallback); AdamW over the GPT step's parameter shapes against
`torch.optim.AdamW` (`bench_optim.py`).
Peers: NumPy always, PyTorch eager and tinygrad when installed. Every peer gets einjit's
thread count (BLAS through its environment variables, set before NumPy is imported;
`torch.set_num_threads`). A ratio is the peer's time over einjit's: above 1 means einjit is
faster. `--json` prints the machine's figures and the rows as JSON, so runs can be compared.

Every run first measures the machine (`machine.py`: the fp32 FMA peak and the memory
bandwidth at the run's thread count): a GFLOP/s row also shows its share of that peak, a
memory-bound row (ATL matvec) its GB/s and share of the bandwidth for its working set. The
compile group adds the GPT-like step's cold and warm compiles at 2 and 4 blocks and the
GPT-2-small-shaped step's at 2 and 12 (`bench_compile.py`; `--quick`: no 12-block row). At
`--threads N` > 1 the threads group compiles `a @ b` and `w @ x` (n = 512, 1024), the convnet
step and the 2-block GPT step at 1 and at N threads and times them side by side: its
"1 thread" ratio is the speed-up of N threads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from itertools import pairwise

from threads_env import set_threads, shared_cache


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--threads", type=int, default=1, help="threads for einjit and every peer")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, no n=1024, no 12-block GPT compile")
    ap.add_argument("--only", default="", help="comma-separated row groups to run: matmul, mlp, convnet, atl, "
                    "compile, memory, deploy, gpt, threads, bf16, pointwise, optim (default: all)")
    ap.add_argument("--sizes", default="", help="comma-separated matmul sizes (default: 256,512,1000,1024; "
                    "awkward sizes such as 1000,1023,784 take the remainder path)")
    return ap.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    set_threads(ARGS.threads, also=("EINJIT_NUM_THREADS",))
shared_cache()

import numpy as np  # noqa: E402  (after the thread settings)


def best_time(fn, repeats: int = 5, min_time: float = 0.2) -> float:
    """Best of `repeats` batches, each of enough calls to last about `min_time` / `repeats`."""
    return best_times([fn], repeats, min_time)[0]


SETTLE_S = 0.15
"""How long `best_times` waits before each batch when contenders run on threads: long enough
for the previous contender's idle threads to stop spinning. OpenBLAS's workers yield-spin for
2^28 cycles (about 0.1 s) after a call and libgomp's spin for a few milliseconds; a batch
that starts while another library's workers spin shares the two cores with them. Interleaved
with NumPy's 2-thread matmul, einjit's 2-thread `a @ b` (n=512) ran at 27 GFLOP/s against
100 alone, and NumPy collapsed alike: that, not the code (the matmul and the threads groups
compile the same threaded panel loop), is why the matmul group's 2-thread rows read lower
than the threads group's, whose contenders are both einjit.

A contender's first calls after the pause are slower than the rest, and more so on threads: its
threads slept (a sleeping thread is woken when the call needs it, and the host may have given
its core away meanwhile) and other processes took its data out of the caches. Timed per call
after a 0.15 s pause at a load of about 1.5, einjit's `a @ b` (n=512) took 5.7-6.2 ms for the
first call and 4.0-4.5 ms for the next 15 at 1 thread, 8-12 ms and 4.3-4.8 ms at 2 threads:
in a batch of 16 that is 12-18% of the 2-thread batch's time. So each batch after a pause
starts with `WARM_CALLS` untimed calls (the same for every contender: NumPy, PyTorch and
einjit at any thread count), and the table reads calls back to back, as a training loop makes
them."""

WARM_CALLS = 2
"""Untimed calls of a contender after the pause before each of its timed batches."""


def _pool_threads() -> int:
    """The thread count `main` gave einjit and the peers (1 when not run through `main`)."""
    try:
        return int(os.environ.get("EINJIT_NUM_THREADS", "1"))
    except ValueError:
        return 1


def best_times(fns, repeats: int = 7, min_time: float = 0.2, settle: float | None = None,
               cpu: list[float] | None = None) -> list[float]:
    """Best batch time of each function, batches interleaved round by round, so that a busy
    moment on a shared machine slows every contender alike rather than one of them. With
    several contenders on threads each batch starts `settle` seconds after the previous one
    (default `SETTLE_S` when `main` runs at more than one thread), so that no contender's
    batch runs beside another one's spinning threads, and `WARM_CALLS` calls after it. `cpu`,
    if given, receives the process's CPU seconds per call in each contender's best batch: at N
    threads a batch whose CPU time is well under N times its wall time had threads waiting for
    a core other processes held."""
    if settle is None:
        settle = SETTLE_S if len(fns) > 1 and _pool_threads() > 1 else 0.0
    pers = []
    for fn in fns:
        fn()
        t = time.perf_counter()
        fn()
        pers.append(max(1, int(min_time / repeats / max(time.perf_counter() - t, 1e-7))))
    best = [float("inf")] * len(fns)
    best_cpu = [0.0] * len(fns)
    for _ in range(repeats):
        for k, (fn, per) in enumerate(zip(fns, pers, strict=True)):
            if settle:
                time.sleep(settle)
                for _ in range(WARM_CALLS):
                    fn()
            t, c = time.perf_counter(), time.process_time()
            for _ in range(per):
                fn()
            wall = (time.perf_counter() - t) / per
            if wall < best[k]:
                best[k], best_cpu[k] = wall, (time.process_time() - c) / per
    if cpu is not None:
        cpu[:] = best_cpu
    return best


MACHINE = None
"""The machine's measured figures (`machine.measure`), set by `main` before the rows run."""


def row(name: str, einjit_s: float, peers: dict[str, float | None], flops: float | None = None,
        nbytes: float | None = None, fp64: bool = False) -> dict:
    """One table row. `flops`: the row's arithmetic, shown as GFLOP/s and as a share of the
    machine's FMA peak (half of the fp32 peak for a float64 row: `fp64`); `nbytes`: the bytes
    a memory-bound row must move, shown as GB/s and as a share of the bandwidth for its
    working set (the last-level-cache read bandwidth up to 16 MiB, which repeated calls find
    in the cache, else the memory read bandwidth)."""
    out = {"workload": name, "einjit_s": einjit_s}
    if flops:
        out["einjit_gflops"] = flops / einjit_s / 1e9
        if MACHINE is not None:
            out["share_of_peak"] = out["einjit_gflops"] / (MACHINE.fma_peak_gflops / (2 if fp64 else 1))
    if nbytes:
        out["einjit_gbs"] = nbytes / einjit_s / 1e9
        if MACHINE is not None:
            bandwidth = MACHINE.cached_read_gbs if nbytes <= 16 << 20 else MACHINE.read_gbs
            out["share_of_bandwidth"] = out["einjit_gbs"] / bandwidth
    for peer, t in peers.items():
        out[f"{peer}_s"] = t
        out[f"vs_{peer}"] = None if t is None else t / einjit_s
    return out


# ---------------------------------------------------------------- matmul


def matmul_rows(sizes: list[int]) -> list[dict]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from einjit.backends.cc.backend import CcBackend
    from einjit.ir import low_level as ll
    from einjit.ir import ops
    from einjit.ir.indexing import Iterator, get_symbol
    from einjit.ir.optimize import optimize_proc
    from einjit.ir.tnode import Tnode, hosted

    rows = []
    for n in sizes:
        for transposed in (False, True):
            a, c = Tnode("a", (n, n)), Tnode("c", (n, n))
            b = Tnode("b", (n, n))
            for tn in (a, b, c):
                tn.update_memory_mode(hosted(), 0)
            i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
            bi = (Iterator(j), Iterator(k)) if transposed else (Iterator(k), Iterator(j))
            prod = ll.Binop(ops.Binop.MUL, ll.Get(a, (Iterator(i), Iterator(k))), ll.Get(b, bi))
            acc = ll.Set(c, (Iterator(i), Iterator(j)),
                         ll.Binop(ops.Binop.ADD, ll.Get(c, (Iterator(i), Iterator(j))), prod))
            code = ll.seq(ll.ZeroOut(c), ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, n - 1, ll.ForLoop(k, 0, n - 1, acc))))
            opt = optimize_proc(code, name=f"mm{n}")
            backend = CcBackend()
            ctx = backend.init(f"mm{n}")
            rng = np.random.default_rng(0)
            x, y = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
            ctx.array(a)[...], ctx.array(b)[...] = x, y
            routine = backend.link(ctx, backend.compile((), opt, shared=True, name=f"mm{n}"))
            yy = y.T if transposed else y
            routine()
            np.testing.assert_allclose(ctx.array(c), x @ yy, rtol=1e-3, atol=1e-3)
            t_ej, t_np = best_times([routine, lambda x=x, yy=yy: x @ yy])
            name = f"fp32 matmul {'w @ x (A·Bᵀ)' if transposed else 'a @ b'} n={n}"
            rows.append(row(name, t_ej, {"numpy": t_np} | _torch_mm(x, yy), 2.0 * n**3))
    return rows


def _torch_mm(x, y) -> dict[str, float | None]:
    try:
        import torch
    except ImportError:
        return {"torch": None}
    torch.set_num_threads(ARGS.threads if ARGS else 1)
    tx, ty = torch.from_numpy(x), torch.from_numpy(np.ascontiguousarray(y))
    return {"torch": best_time(lambda: tx @ ty)}


# ---------------------------------------------------------------- training steps


def mlp_step_rows() -> list[dict]:
    from bench_train import mlp_step, numpy_mlp_step, torch_mlp_step

    rows = []
    for dims, batch, label in (((784, 256, 256, 10), 256, "MLP 784→256→256→10 step, B=256"),
                               ((2, 32, 32, 1), 1024, "MLP 2→32→32→1 step, B=1024"),
                               ((2, 16, 16, 1), 10, "moons MLP 2→16→16→1 step, B=10")):
        steps = [mlp_step(dims, batch), numpy_mlp_step(dims, batch), torch_mlp_step(dims, batch)]
        times = best_times([s for s in steps if s is not None])
        ej, t_np, t_torch = times + [None] * (3 - len(times))
        rows.append(row(label, ej, {"numpy": t_np, "torch": t_torch}))
    return rows


def atl_rows(n: int = 1024) -> list[dict]:
    """ATL programs (float64) through einjit's backend, and the matmul through Halide when it
    is installed (its register-blocked contraction schedule); each time includes the ATL
    wrapper's work: arguments that fit are read in place, the result is copied out."""
    import bench_atl

    rows = []
    for name, (f, inputs, ref) in bench_atl.programs(n).items():
        fn = f.compiled("einjit")
        np.testing.assert_allclose(fn(*inputs), ref(*inputs), rtol=1e-9, atol=1e-9)
        t_ej, t_np = best_times([lambda fn=fn, inputs=inputs: fn(*inputs), lambda ref=ref, inputs=inputs: ref(*inputs)])
        memory_bound = name == "matvec"
        nbytes = 8.0 * (n * n + 2 * n) if memory_bound else None
        rows.append(row(f"ATL {name} n={n} (float64), einjit backend", t_ej, {"numpy": t_np},
                        None if memory_bound else 2.0 * n**3, nbytes, fp64=True))
    try:
        import halide  # noqa: F401  (optional: the row is left out without it)
    except ImportError:
        return rows
    f, inputs, ref = bench_atl.programs(n)["matmul"]
    hfn = f.compiled("halide")
    np.testing.assert_allclose(hfn(*inputs), ref(*inputs), rtol=1e-9, atol=1e-9)
    t_hl, t_np = best_times([lambda: hfn(*inputs), lambda: ref(*inputs)])
    rows.append(row(f"ATL matmul n={n} (float64), Halide ({hfn.scheduler})", t_hl, {"numpy": t_np}))
    return rows


def convnet_rows() -> list[dict]:
    """The convnet step twice: written with einsum convolutions (NHWC, `bench_train`) and built
    from `einjit.nn` layers (NCHW, max pooling, cross-entropy: `bench_convnet`)."""
    from bench_convnet import einjit_step, torch_step
    from bench_train import convnet_step, torch_convnet_step

    rows = []
    for name, build, peer_step in (("einsum", convnet_step, torch_convnet_step), ("einjit.nn", None, torch_step)):
        with tempfile.TemporaryDirectory() as cache:
            os.environ["EINJIT_CACHE_DIR"] = cache
            routine, compile_s = build() if build else einjit_step(cache)
        peer = peer_step()
        times = best_times([routine] + ([peer] if peer else []))
        rows += [row(f"MNIST-size convnet step ({name}), B=64", times[0], {"torch": times[1] if peer else None}),
                 row(f"convnet step ({name}) cold compile (build + optimize + gcc)", compile_s, {})]
    return rows


def chain_row(n: int = 400) -> dict:
    """The optimizer alone on `x -> relu(x) -> ...` with every intermediate virtual (linear in
    the chain's length since inlining copies lazily: see `ir/passes/virtualize.py`)."""
    from einjit.ir import low_level as ll
    from einjit.ir import ops
    from einjit.ir.indexing import Iterator, get_symbol
    from einjit.ir.optimize import optimize_proc
    from einjit.ir.tnode import Tnode, hosted

    def build():
        nodes = [Tnode(f"t{k}", (8,)) for k in range(n + 1)]
        nodes[0].update_memory_mode(hosted(), 0)
        nodes[-1].update_memory_mode(hosted(), 0)
        stmts = []
        for src, dst in pairwise(nodes):
            i = get_symbol()
            relu = ll.Unop(ops.Unop.RELU, ll.Get(src, (Iterator(i),)))
            stmts.append(ll.ForLoop(i, 0, 7, ll.Set(dst, (Iterator(i),), relu)))
        return ll.seq(*stmts)

    code = build()
    t = time.perf_counter()
    optimize_proc(code, name="chain")
    return row(f"optimizer on a chain of {n} virtual nodes", time.perf_counter() - t, {})


def gpt_rows() -> list[dict]:
    """The GPT training step (2 and 4 blocks, d=128, 4 heads, T=64, B=16, V=96) against
    PyTorch eager and `torch.compile`, its causal attention layer alone (`bench_attention.py`),
    per-token KV-cache decoding, and the step's dense contractions one at a time
    (`bench_gpt.py`)."""
    from bench_attention import attention_rows
    from bench_gpt import decode_rows, shape_rows, step_rows, wgrad_rows
    threads = ARGS.threads if ARGS else 1
    return (step_rows(threads) + attention_rows(threads) + decode_rows(threads=threads) + shape_rows(threads)
            + wgrad_rows(threads))


def thread_rows() -> list[dict]:
    """At `--threads N` > 1: `a @ b`, `w @ x`, the convnet and the GPT step compiled at 1 and at
    N threads and timed side by side (`bench_parallel.thread_rows`); the "1 thread" ratio is
    the speed-up of N threads, the "libgomp" ratio that of einjit's thread team over libgomp's
    (the same program's OpenMP calls linked to libgomp)."""
    from bench_parallel import balance
    from bench_parallel import thread_rows as rows_of

    threads = ARGS.threads if ARGS else 1
    if threads < 2:
        return []
    return [row(f"{r['workload']}, {threads} threads", r["tn_s"], {"1 thread": r["t1_s"], "libgomp": r["tg_s"]},
                r.get("flops")) | {"einjit_cpu_s": r["tn_cpu_s"], "cpu_balance": balance(r["cpu_gflops"])}
            for r in rows_of(threads, 7)]


def compile_row() -> dict:
    from bench_train import compile_seconds_in_fresh_process

    with tempfile.TemporaryDirectory() as cache:
        cold = compile_seconds_in_fresh_process(cache)
    return row("moons step cold compile (build + optimize + gcc)", cold, {})


def gpt_compile_rows(blocks: tuple[int, ...]) -> list[dict]:
    """Cold and warm compiles of the GPT-like step (`bench_compile.GPT_ROWS`) and of the
    GPT-2-small-shaped `models.GPT` step (`bench_compile.GPT2_ROWS`) in fresh processes; the
    per-block time is what must stay flat as the model deepens."""
    import bench_compile

    rows = []
    steps = [(label, cfg, "gpt_compile") for label, cfg in bench_compile.GPT_ROWS.items()]
    steps += [(label, cfg, "gpt2_compile") for label, cfg in bench_compile.GPT2_ROWS.items()]
    for label, cfg, function in steps:
        if cfg["blocks"] not in blocks:
            continue
        with tempfile.TemporaryDirectory() as cache:
            for kind in ("cold", "warm"):
                _, wall, python_s, gcc_s = bench_compile.gpt_compile_seconds(cfg, cache, function)
                rows.append(row(f"{label} {kind} compile ({wall / cfg['blocks']:.2f} s/block; CPU einjit "
                                f"{python_s:.1f} s, gcc {gcc_s:.1f} s)", wall, {}))
    return rows


def bf16_rows(sizes: list[int]) -> list[dict]:
    import bench_bf16

    return bench_bf16.matmul_rows(sizes, row, best_times, ARGS.threads if ARGS else 1) + \
        bench_bf16.step_rows(row, best_times)


def main() -> None:
    global MACHINE
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import machine
    from bench_deploy import deploy_rows
    from bench_memory import describe_bytes, gpt_memory_row
    from bench_memory import run_row as memory_row
    sizes = ([int(n) for n in ARGS.sizes.split(",")] if ARGS.sizes
             else [256, 512] if ARGS.quick else [256, 512, 1000, 1024])
    groups = {"matmul": lambda: matmul_rows(sizes), "mlp": mlp_step_rows, "convnet": convnet_rows,
              "atl": lambda: atl_rows(512 if ARGS.quick else 1024),
              "compile": lambda: [chain_row(), compile_row(), *gpt_compile_rows((2, 4) if ARGS.quick else (2, 4, 12))],
              "memory": lambda: [memory_row(), gpt_memory_row()],
              "deploy": lambda: deploy_rows(ARGS.threads, ARGS.quick), "gpt": lambda: [*gpt_rows(), gpt_memory_row()],
              "threads": thread_rows, "bf16": lambda: bf16_rows([512] if ARGS.quick else [512, 1024]),
              "pointwise": lambda: __import__("bench_pointwise").pointwise_rows(ARGS.threads),
              "optim": lambda: __import__("bench_optim").optim_rows(ARGS.threads)}
    only = [g for g in ARGS.only.split(",") if g] or list(groups)
    unknown = sorted(set(only) - set(groups))
    if unknown:
        raise SystemExit(f"run.py: unknown row group(s) {unknown}; choose from {sorted(groups)}")
    MACHINE = machine.measure(ARGS.threads)
    rows = [r for g in only for r in groups[g]()]
    if ARGS.json:
        notes = {"bf16_path": __import__("bench_bf16").bf16_path()} if "bf16" in only else {}
        print(json.dumps({"machine": dataclasses.asdict(MACHINE), **notes, "rows": rows}, indent=1))
        return
    print(MACHINE)
    if "bf16" in only:
        import bench_bf16
        print(f"bf16 kernels: {bench_bf16.bf16_path()}")
    print(f"threads: {ARGS.threads} (einjit and every peer); ratio = peer time / einjit time, > 1: einjit faster")
    for r in rows:
        if "einjit_bytes" in r:
            print(f"{r['workload']:<52} {describe_bytes(r)}")
            continue
        line = f"{r['workload']:<52} einjit {_fmt(r['einjit_s'])}"
        if "einjit_gflops" in r:
            line += f" ({r['einjit_gflops']:6.1f} GFLOP/s, {100 * r['share_of_peak']:3.0f}% of peak)"
        if "einjit_gbs" in r:
            line += f" ({r['einjit_gbs']:6.1f} GB/s, {100 * r['share_of_bandwidth']:3.0f}% of bandwidth)"
        if "einjit_cpu_s" in r:
            line += f" [CPU {r['einjit_cpu_s'] / r['einjit_s']:.2f} cores]"
        if "cpu_balance" in r:
            line += f" [{r['cpu_balance']}]"
        for key in r:
            if key.startswith("vs_"):
                peer = key[3:]
                line += f" | {peer} " + ("not installed" if r[key] is None else
                                          f"{_fmt(r[f'{peer}_s'])} ({r[key]:.2f}x)")
        print(line)


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:8.1f} µs"


if __name__ == "__main__":
    main()
