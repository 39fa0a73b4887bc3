"""Time per training step of the moons MLP (2 → 16 → 16 → 1, hinge loss, SGD) at batch 10 and
1024: einjit (one compiled C routine per step) against PyTorch eager and tinygrad when they are
installed, side by side in one process; plus first-compile and cached-compile times.

    python benchmarks/bench_train.py [--steps N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from itertools import pairwise

import numpy as np


def einjit_step_time(batch: int, steps: int, cache_dir: str) -> tuple[float, float]:
    """Seconds per step, and seconds to build + compile the step routine."""
    os.environ["EINJIT_CACHE_DIR"] = cache_dir
    import einjit as ej
    from einjit import train
    from einjit.demos.moons import make_mlp
    from einjit.ir.indexing import IntRef, get_static_symbol

    rng = np.random.default_rng(0)
    n_batches = 4
    data = rng.standard_normal((n_batches, batch, 2)).astype(np.float32)
    labels = np.sign(rng.standard_normal((n_batches, batch, 1))).astype(np.float32)
    batch_n = get_static_symbol(n_batches, "batch")
    flat = ej.ndarray(data, batch_axes=2, label="x_all")
    classes = ej.ndarray(labels, batch_axes=2, label="y_all")
    mlp = make_mlp()
    x, y = ej.batch_slice(flat, batch_n), ej.batch_slice(classes, batch_n)
    loss = ej.div(ej.sum(ej.relu(1 - y * mlp(x)), "...|... => 0"), batch)
    train.init_params(loss)
    t0 = time.perf_counter()
    routine = train.to_routine([train.grad_update(loss), train.sgd_update(loss, 0.01, weight_decay=1e-4)],
                               bindings={batch_n: IntRef(0)}, name="bench_step")
    compile_s = time.perf_counter() - t0
    ref = routine.bindings[batch_n]
    for _ in range(20):
        routine()
    t1 = time.perf_counter()
    for k in range(steps):
        ref.value = k % n_batches
        routine()
    return (time.perf_counter() - t1) / steps, compile_s


def compile_seconds_in_fresh_process(cache_dir: str) -> float:
    """A second process building the same program hits the on-disk cache (node ids and symbols
    are deterministic per process), which is the case a user meets on a re-run."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import bench_train; print(bench_train.einjit_step_time(10, 10, {cache_dir!r})[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def torch_step_time(batch: int, steps: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, weight_decay=1e-4)
    x = torch.randn(batch, 2)
    y = torch.sign(torch.randn(batch, 1))

    def step():
        opt.zero_grad()
        loss = torch.relu(1 - y * model(x)).sum() / batch
        loss.backward()
        opt.step()

    for _ in range(20):
        step()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t) / steps


def tinygrad_step_time(batch: int, steps: int) -> float | str | None:
    """Seconds per step; None when tinygrad is not installed; the reason, as a string, when it
    is installed but cannot run (its CPU device compiles with `clang`)."""
    os.environ.setdefault("DEV", "CPU")
    try:
        from tinygrad import Tensor, nn
    except ImportError:
        return None
    try:
        (Tensor.ones(2) + 1).realize()
    except Exception as e:  # noqa: BLE001 - any failure means tinygrad cannot run here
        if shutil.which("clang") is None:
            return "installed, but its CPU device needs `clang`, which is not on PATH"
        return f"installed, but failed: {type(e).__name__}: {e}"
    layers = [nn.Linear(2, 16), nn.Linear(16, 16), nn.Linear(16, 1)]
    params = nn.state.get_parameters(layers)
    opt = nn.optim.SGD(params, lr=0.01, weight_decay=1e-4)
    x = Tensor.randn(batch, 2)
    y = Tensor.randn(batch, 1).sign()

    def step():
        # `Tensor.train()` (a context manager) is gone in tinygrad 0.14; the flag remains.
        Tensor.training = True
        opt.zero_grad()
        h = layers[0](x).relu()
        h = layers[1](h).relu()
        loss = (1 - y * layers[2](h)).relu().sum() / batch
        loss.backward()
        opt.step()
        loss.realize()

    for _ in range(5):
        step()
    n = max(10, steps // 20)
    t = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t) / n


def _mlp_data(dims: tuple[int, ...], batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.standard_normal((batch, dims[0])).astype(np.float32),
            np.sign(rng.standard_normal((batch, dims[-1]))).astype(np.float32))


def mlp_step_time(dims: tuple[int, ...], batch: int) -> float:
    """Seconds per einjit training step of an MLP with layer widths `dims` (ReLU between
    layers, hinge loss, SGD with momentum 0.9): one compiled routine per step."""
    from run import best_time

    return best_time(mlp_step(dims, batch))


def mlp_step(dims: tuple[int, ...], batch: int):
    """The compiled einjit step routine of `mlp_step_time`'s MLP."""
    import einjit as ej
    from einjit import train

    data, labels = _mlp_data(dims, batch)
    h = x = ej.ndarray(data, batch_axes=1, label="x")
    y = ej.ndarray(labels, batch_axes=1, label="y")
    for k, width in enumerate(dims[1:]):
        h = ej.param(f"b{k}", output_dims=[width], init="zeros") + ej.param(f"w{k}", output_dims=[width]) @ h
        if k < len(dims) - 2:
            h = ej.relu(h)
    del x
    loss = ej.div(ej.sum(ej.relu(1 - y * h), "...|... => 0"), batch)
    train.init_params(loss)
    return train.to_routine([train.grad_update(loss), train.sgd_update(loss, 0.01, momentum=0.9)],
                            name=f"mlp_step_{'_'.join(map(str, dims))}_b{batch}")


def numpy_mlp_step(dims: tuple[int, ...], batch: int):
    """The same step written by hand in NumPy (forward, backward, momentum update)."""
    x, y = _mlp_data(dims, batch)
    rng = np.random.default_rng(1)
    ws = [(rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32) for i, o in pairwise(dims)]
    bs = [np.zeros(o, np.float32) for o in dims[1:]]
    moms = [np.zeros_like(p) for p in ws + bs]

    def step():
        acts = [x]
        for k, (w, b) in enumerate(zip(ws, bs, strict=True)):
            z = acts[-1] @ w.T + b
            acts.append(np.maximum(z, 0) if k < len(ws) - 1 else z)
        g = np.where(1 - y * acts[-1] > 0, -y, 0).astype(np.float32) / batch
        grads_w, grads_b = [], []
        for k in range(len(ws) - 1, -1, -1):
            grads_w.append(g.T @ acts[k])
            grads_b.append(g.sum(axis=0))
            if k:
                g = (g @ ws[k]) * (acts[k] > 0)
        for p, grad, m in zip(ws + bs, grads_w[::-1] + grads_b[::-1], moms, strict=True):
            m *= 0.9
            m += grad
            p -= 0.01 * m

    return step


def torch_mlp_step(dims: tuple[int, ...], batch: int):
    """The same step in PyTorch eager, or None when PyTorch is not installed."""
    try:
        import torch
    except ImportError:
        return None

    torch.set_num_threads(int(os.environ.get("EINJIT_NUM_THREADS", "1")))
    layers = []
    for k, (i, o) in enumerate(pairwise(dims)):
        layers.append(torch.nn.Linear(i, o))
        if k < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    x, y = (torch.from_numpy(a) for a in _mlp_data(dims, batch))
    return _torch_hinge_sgd_step(torch, model, x, y, batch)


def _torch_hinge_sgd_step(torch, model, x, y, batch: int):
    """PyTorch's eager step for einjit's benchmark models: hinge loss, SGD with momentum."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad()
        loss = torch.relu(1 - y * model(x)).sum() / batch
        loss.backward()
        opt.step()

    return step


def convnet_step(batch: int = 64):
    """An MNIST-size convnet training step (3x3 conv to 8 channels, 3x3 stride-2 conv to 16,
    dense to 10; ReLU, hinge loss, SGD with momentum) as one einjit routine, and the seconds
    its build and compile took."""
    import einjit as ej
    from einjit import train

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    x = ej.ndarray(rng.standard_normal((batch, 28, 28, 1)).astype(np.float32), batch_axes=1, label="img")
    y = ej.ndarray(np.sign(rng.standard_normal((batch, 10))).astype(np.float32), batch_axes=1, label="y")
    k1 = ej.param("k1", input_dims=[3, 3, 1], output_dims=[8])
    h = ej.relu(ej.einsum("...|oh+kh, ow+kw, ci; kh, kw, ci -> co => ...|oh, ow, co", x, k1, label="c1"))
    k2 = ej.param("k2", input_dims=[3, 3, 8], output_dims=[16])
    h = ej.relu(ej.einsum("...|2*oh+kh, 2*ow+kw, ci; kh, kw, ci -> co => ...|oh, ow, co", h, k2, label="c2"))
    w = ej.param("w", output_dims=[10])
    out = ej.einsum("...|oh, ow, co; oh, ow, co -> o => ...|o", h, w, label="logits")
    loss = ej.div(ej.sum(ej.relu(1 - y * out), "...|... => 0"), batch)
    train.init_params(loss)
    routine = train.to_routine([train.grad_update(loss), train.sgd_update(loss, 0.01, momentum=0.9)],
                               name=f"convnet_step_b{batch}")
    return routine, time.perf_counter() - t0


def torch_convnet_step(batch: int = 64):
    """The same step in PyTorch eager, or None when PyTorch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(int(os.environ.get("EINJIT_NUM_THREADS", "1")))
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, bias=False), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 16, 3, stride=2, bias=False), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(16 * 12 * 12, 10, bias=False))
    x, y = torch.randn(batch, 1, 28, 28), torch.sign(torch.randn(batch, 10))
    return _torch_hinge_sgd_step(torch, model, x, y, batch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        cold_compile = compile_seconds_in_fresh_process(cache)
        cached_compile = compile_seconds_in_fresh_process(cache)
    print(f"build + compile of the moons step routine (fresh process each): cold cache {cold_compile:.3f} s, "
          f"warm cache {cached_compile:.3f} s")
    for batch in (10, 1024):
        steps = args.steps if batch == 10 else max(50, args.steps // 10)
        with tempfile.TemporaryDirectory() as cache:
            ej_t, _ = einjit_step_time(batch, steps, cache)
        line = f"batch {batch:5d}: einjit {1e6 * ej_t:9.1f} µs/step"
        for name, fn in (("torch eager", torch_step_time), ("tinygrad", tinygrad_step_time)):
            other = fn(batch, steps)
            line += f" | {name}: " + ("not installed" if other is None else other if isinstance(other, str) else
                                       f"{1e6 * other:9.1f} µs/step ({other / ej_t:5.1f}x einjit's time)")
        print(line)


if __name__ == "__main__":
    main()
