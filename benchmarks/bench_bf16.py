"""bf16 rows of `run.py`: the bf16 matmul (bf16 operands, float32 result) against einjit's own
fp32 matmul, NumPy's fp32 and PyTorch's bf16 matmul (when installed), and the MLP, convnet and
GPT training steps with `mixed_precision="bf16"` against the same steps in fp32.

Which kernel a bf16 contraction runs depends on the CPU: with AMX (Sapphire Rapids and later,
and a compiler targeting it: `-march=native` defines `__AMX_BF16__`) contractions of two bf16
operands are AMX tiles (`tdpbf16ps`, `ir/sched/amx_tiles.py`); with AVX512_BF16 alone the
register blocks are `vdpbf16ps`; without either, the fp32 fallback (bf16 widened once, while
packing and into a float copy of the row operand; float FMAs). `bf16_path()` says which, and
every row's name carries it, so a fallback figure is never read as the fast path.

    python benchmarks/bench_bf16.py [--quick] [--steps] [--sizes 256,512,1024]

`--steps` runs only the training-step rows, `--matmul` only the matmul rows (at the thread
count `EINJIT_NUM_THREADS` sets; torch's at the same count). Matmul rows print GFLOP/s.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


@functools.cache
def bf16_path() -> str:
    """'AMX tdpbf16ps', 'vdpbf16ps' or 'fp32 fallback', with the reason."""
    from einjit.backends.cc.toolchain import CcOptions
    from einjit.ir.sched.machine import host_machine

    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
        flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    cc = CcOptions()
    done = subprocess.run([cc.compiler, *[f for f in cc.flags if f.startswith("-march")], "-dM", "-E", "-"],
                          input="", capture_output=True, text=True)
    if host_machine().amx_tiles:
        if "__AMX_BF16__" in done.stdout and "__AMX_TILE__" in done.stdout:
            return "AMX tdpbf16ps: the CPU has AMX"
        return "fp32 fallback: the compiler does not target AMX"
    cpu = "avx512_bf16" in flags
    if cpu and not host_machine().bf16_dot:
        return "fp32 panels: the CPU has AVX512_BF16, but the machine description takes no vdpbf16ps"
    target = "__AVX512BF16__" in done.stdout
    if cpu and target:
        return "vdpbf16ps: the CPU has AVX512_BF16"
    why = "the CPU lacks AVX512_BF16" if not cpu else "the compiler does not target AVX512_BF16"
    return f"fp32 fallback: {why}"


def _matmul(n: int, prec, x: np.ndarray, y: np.ndarray):
    """The compiled `c = a @ b` (a, b of `prec` holding `x`, `y`, c float32) and the result's
    array."""
    from einjit.backends.cc.backend import CcBackend
    from einjit.ir import bf16, ops
    from einjit.ir import low_level as ll
    from einjit.ir.indexing import Iterator, get_symbol
    from einjit.ir.optimize import optimize_proc
    from einjit.ir.tnode import Tnode, hosted

    a, b, c = Tnode("a", (n, n), prec), Tnode("b", (n, n), prec), Tnode("c", (n, n), ops.single)
    for tn in (a, b, c):
        tn.update_memory_mode(hosted(), 0)
    i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
    prod = ll.Binop(ops.Binop.MUL, ll.Get(a, (Iterator(i), Iterator(k))), ll.Get(b, (Iterator(k), Iterator(j))))
    acc = ll.Set(c, (Iterator(i), Iterator(j)), ll.Binop(ops.Binop.ADD, ll.Get(c, (Iterator(i), Iterator(j))), prod))
    code = ll.seq(ll.ZeroOut(c), ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, n - 1, ll.ForLoop(k, 0, n - 1, acc))))
    name = f"mm_{prec.name}_{n}"
    backend = CcBackend()
    ctx = backend.init(name)
    ctx.array(a)[...], ctx.array(b)[...] = bf16.as_cells(x, prec), bf16.as_cells(y, prec)
    routine = backend.link(ctx, backend.compile((), optimize_proc(code, name=name), shared=True, name=name))
    return routine, ctx.array(c)


def matmul_rows(sizes, row, best_times, threads: int) -> list[dict]:
    from einjit.ir import bf16, ops

    rows = []
    for n in sizes:
        rng = np.random.default_rng(0)
        x, y = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        routine, out = _matmul(n, ops.bf16, x, y)
        routine()
        xr, yr = bf16.round_to_bf16(x).astype(np.float64), bf16.round_to_bf16(y).astype(np.float64)
        np.testing.assert_allclose(out, xr @ yr, rtol=1e-3, atol=1e-3 * np.sqrt(n))
        fp32, _ = _matmul(n, ops.single, x, y)
        fns = [routine, fp32, lambda x=x, y=y: x @ y]
        torch_fn = _torch_bf16(x, y, threads)
        times = best_times(fns + ([torch_fn] if torch_fn else []))
        peers = {"einjit fp32": times[1], "numpy fp32": times[2], "torch bf16": times[3] if torch_fn else None}
        rows.append(row(f"bf16 matmul a @ b n={n} [{bf16_path()}]", times[0], peers, 2.0 * n**3))
    return rows


def _torch_bf16(x, y, threads: int):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    tx, ty = (torch.from_numpy(v).to(torch.bfloat16) for v in (x, y))
    return lambda: tx @ ty


def _mlp_step(mixed: str | None):
    """The 784→256→256→10 MLP step (B=256, cross-entropy, SGD with momentum)."""
    import einjit as ej
    from einjit import fit, nn, train

    rng = np.random.default_rng(0)
    xs = rng.standard_normal((256, 784)).astype(np.float32)
    ys = rng.integers(0, 10, 256).astype(np.int32)
    model = nn.Sequential(nn.Linear(784, 256, label="fc1"), nn.ReLU(), nn.Linear(256, 256, label="fc2"), nn.ReLU(),
                          nn.Linear(256, 10, label="fc3"))
    x = ej.input("x", batch_dims=[256], output_dims=[784])
    y = ej.input("y", batch_dims=[256], prec="int32")
    loss = nn.cross_entropy(model(x), y)
    opt = nn.SGD(model.params(), 0.01, momentum=0.9)
    train.init_params(loss)
    step = fit.train_step(loss, opt.update(), inputs=[x, y], name=f"mlp_{mixed or 'fp32'}", mixed_precision=mixed)
    return lambda: step(xs, ys)


def _convnet_step(mixed: str | None):
    from bench_convnet import einjit_step

    with tempfile.TemporaryDirectory() as cache:
        routine, _ = einjit_step(cache, mixed_precision=mixed)
    return routine


def _gpt_step(mixed: str | None):
    from bench_gpt import einjit_train_step

    _, step, (_, xb, yb), _ = einjit_train_step(2, mixed_precision=mixed)
    return lambda: step(xb, yb)


def step_rows(row, best_times) -> list[dict]:
    """Each step in bf16 mixed precision against itself in fp32, side by side."""
    rows = []
    for label, build in (("MLP 784→256→256→10 step, B=256", _mlp_step),
                         ("MNIST-size convnet step (einjit.nn), B=64", _convnet_step),
                         ("GPT train step, 2 blocks d=128 T=64 B=16", _gpt_step)):
        t_mixed, t_fp32 = best_times([build("bf16"), build(None)])
        rows.append(row(f"{label}, mixed bf16 [{bf16_path()}]", t_mixed, {"einjit fp32": t_fp32}))
    return rows


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from run import best_times, row

    quick, steps_only, matmul_only = "--quick" in sys.argv, "--steps" in sys.argv, "--matmul" in sys.argv
    sizes = [256] if quick else [256, 512, 1024]
    if "--sizes" in sys.argv:
        sizes = [int(v) for v in sys.argv[sys.argv.index("--sizes") + 1].split(",")]
    threads = int(os.environ.get("EINJIT_NUM_THREADS", "1"))
    print(f"bf16 path: {bf16_path()}")
    t = time.perf_counter()
    matmuls = [] if steps_only else matmul_rows(sizes, row, best_times, threads)
    for r in matmuls + ([] if matmul_only else step_rows(row, best_times)):
        peers = ", ".join(f"{k[3:]} {r[k]:.2f}x" for k in r if k.startswith("vs_") and r[k] is not None)
        rate = ""
        if "einjit_gflops" in r:
            rate = f" {r['einjit_gflops']:7.1f} GFLOP/s" + "".join(
                f", {k[:-2]} {2.0 * n**3 / r[k] / 1e9:.1f}" for n in [int(r["workload"].split("n=")[1].split()[0])]
                for k in r if k.endswith("_s") and k != "einjit_s" and r[k])
        print(f"{r['workload']:<70} {r['einjit_s'] * 1e3:9.3f} ms  {peers}{rate}")
    print(f"({time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
