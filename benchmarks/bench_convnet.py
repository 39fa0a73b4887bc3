"""Time per training step of the MNIST-size convnet of issue 12: batch 64 of 1x28x28 →
conv3x3(8) relu maxpool2 → conv3x3(16) relu maxpool2 → linear(400, 10), cross-entropy, SGD.

einjit (one compiled routine per step, `einjit.nn` layers) against a hand-written NumPy step
(im2col convolutions, the same maths) and PyTorch eager when installed, all on one thread, side
by side in one process: the step times are medians over `--repeats` rounds, each round timing
every contender in turn, so load from other processes hits all of them alike. Plus einjit's
build + compile time (cold cache).

    python benchmarks/bench_convnet.py [--steps N] [--repeats R] [--cpu-time]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from threads_env import set_threads

set_threads(1, also=("EINJIT_NUM_THREADS",), keep_set=True)  # before NumPy and einjit; `run.py` sets its own

import numpy as np  # noqa: E402  (after the thread settings)

B, C1, C2, N_CLASSES = 64, 8, 16, 10


def _data(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((B, 1, 28, 28)).astype(np.float32)
    y = np.eye(N_CLASSES, dtype=np.float32)[rng.integers(0, N_CLASSES, B)]
    return x, y


def nn_loss():
    """The convnet built from `einjit.nn` layers on the benchmark's data: its loss (parameters
    initialized) and its SGD optimizer."""
    import einjit as ej
    from einjit import nn, train

    x_val, y_val = _data(np.random.default_rng(0))
    model = nn.Sequential(nn.Conv2d(1, C1, 3, label="conv1"), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(C1, C2, 3, label="conv2"), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(400, N_CLASSES, label="fc"))
    x = ej.input("x", batch_dims=[B], output_dims=[1, 28, 28], values=x_val)
    y = ej.input("y", batch_dims=[B], output_dims=[N_CLASSES], values=y_val)
    loss = nn.cross_entropy(model(x), y)
    opt = nn.SGD(loss, 0.01)
    train.init_params(loss)
    return loss, opt


def einjit_step(cache_dir: str, *, mixed_precision: str | None = None):
    """The step routine, and seconds to build + compile it (`mixed_precision`: as for
    `train.grad_update`)."""
    os.environ["EINJIT_CACHE_DIR"] = cache_dir
    from einjit import train

    t0 = time.perf_counter()
    loss, opt = nn_loss()
    name = "bench_convnet_step" if mixed_precision is None else f"bench_convnet_step_{mixed_precision}"
    routine = train.to_routine([train.grad_update(loss, mixed_precision=mixed_precision), opt.update()], name=name)
    return routine, time.perf_counter() - t0


def _conv(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cols = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))  # n c oh ow kh kw
    return np.einsum("ncijkl,ockl->noij", cols, w, optimize=True), cols


def _pool(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n, c, h, w = x.shape
    v = x[:, :, :h // 2 * 2, :w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2)
    out = v.max(axis=(3, 5))
    mask = v == out[:, :, :, None, :, None]
    return out, mask


def _unpool(g: np.ndarray, mask: np.ndarray, shape) -> np.ndarray:
    n, c, h, w = shape
    full = np.zeros(shape, g.dtype)
    full[:, :, :h // 2 * 2, :w // 2 * 2] = (mask * g[:, :, :, None, :, None]).reshape(n, c, h // 2 * 2, w // 2 * 2)
    return full


def _conv_input_grad(g: np.ndarray, w: np.ndarray, shape) -> np.ndarray:
    out = np.zeros(shape, g.dtype)
    for kh in range(3):
        for kw in range(3):
            out[:, :, kh:kh + g.shape[2], kw:kw + g.shape[3]] += np.einsum("noij,oc->ncij", g, w[:, :, kh, kw])
    return out


def numpy_step():
    """The same step by hand in NumPy: forward, backward and SGD, float32."""
    rng = np.random.default_rng(0)
    x, y = _data(rng)
    w1 = (rng.standard_normal((C1, 1, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((C2, C1, 3, 3)) * 0.1).astype(np.float32)
    w3 = (rng.standard_normal((N_CLASSES, 400)) * 0.05).astype(np.float32)
    b1, b2, b3 = (np.zeros(n, np.float32) for n in (C1, C2, N_CLASSES))

    def step():
        nonlocal w1, w2, w3, b1, b2, b3
        z1, cols1 = _conv(x, w1)
        z1 += b1[:, None, None]
        a1 = np.maximum(z1, 0)
        p1, m1 = _pool(a1)
        z2, cols2 = _conv(p1, w2)
        z2 += b2[:, None, None]
        a2 = np.maximum(z2, 0)
        p2, m2 = _pool(a2)
        flat = p2.reshape(B, -1)
        logits = flat @ w3.T + b3
        e = np.exp(logits - logits.max(1, keepdims=True))
        soft = e / e.sum(1, keepdims=True)
        g = (soft - y) / B
        gw3, gb3 = g.T @ flat, g.sum(0)
        gz2 = _unpool((g @ w3).reshape(p2.shape), m2, a2.shape) * (z2 > 0)
        gw2, gb2 = np.einsum("noij,ncijkl->ockl", gz2, cols2, optimize=True), gz2.sum((0, 2, 3))
        gz1 = _unpool(_conv_input_grad(gz2, w2, p1.shape), m1, a1.shape) * (z1 > 0)
        gw1, gb1 = np.einsum("noij,ncijkl->ockl", gz1, cols1, optimize=True), gz1.sum((0, 2, 3))
        lr = np.float32(0.01)
        w1, w2, w3 = w1 - lr * gw1, w2 - lr * gw2, w3 - lr * gw3
        b1, b2, b3 = b1 - lr * gb1, b2 - lr * gb2, b3 - lr * gb3

    return step


def torch_step():
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(int(os.environ["EINJIT_NUM_THREADS"]))
    model = torch.nn.Sequential(torch.nn.Conv2d(1, C1, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Conv2d(C1, C2, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Flatten(), torch.nn.Linear(400, N_CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x_val, y_val = _data(np.random.default_rng(0))
    x, y = torch.from_numpy(x_val), torch.from_numpy(y_val.argmax(1))

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    return step


def median_times(steps: dict, calls: int, repeats: int, clock=time.perf_counter) -> dict[str, float]:
    """Median seconds per call of each step, over `repeats` rounds of `calls` calls each."""
    for fn in steps.values():
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            t = clock()
            for _ in range(calls):
                fn()
            samples[name].append((clock() - t) / calls)
    return {name: statistics.median(v) for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20, help="calls per contender per round")
    parser.add_argument("--repeats", type=int, default=9, help="rounds (the median is reported)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with the process's CPU clock: on a shared machine, time spent descheduled "
                             "does not count (every contender runs on this one thread)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        routine, compile_s = einjit_step(cache)
    print(f"MNIST-size convnet step, batch {B}, 1 thread: build + compile {compile_s:.2f} s (cold cache)")
    steps = {"einjit": routine, "numpy": numpy_step()}
    other = torch_step()
    if other is not None:
        steps["torch eager"] = other
    times = median_times(steps, args.steps, args.repeats, time.process_time if args.cpu_time else time.perf_counter)
    ej_t = times["einjit"]
    line = f"einjit {1e3 * ej_t:8.2f} ms/step"
    for name in ("numpy", "torch eager"):
        line += f" | {name}: " + ("not installed" if name not in times else
                                  f"{1e3 * times[name]:8.2f} ms/step ({times[name] / ej_t:5.2f}x einjit's time)")
    print(line)


if __name__ == "__main__":
    main()
