"""Data-parallel speed-up: one training step of a 784 → 256 → 256 → 10 ReLU MLP (squared error,
SGD with momentum, float32, synthetic data) on a batch of 256, computed

- on one device: the whole step fused into one C routine, called from the main thread;
- on 1 and 2 multicore devices with `einjit.training.parallel.DataParallel` (each of the 2 devices a
  shard of 128): gradients summed through merge buffers, update on device 0, parameters copied
  back.

Steps are scheduled back to back and timed to a final sync. The same step sequence runs in
every configuration, so the final parameters are compared too (float32 rounding apart, they
must agree: the speed-up does not come from skipping work).

    python benchmarks/bench_parallel.py [--steps N] [--devices N]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
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
