"""Data in and out: prediction after training, per-step host writes, checkpoints.

1. Prediction on one new sample with the trained moons MLP (2 → 16 → 16 → 1): microseconds per
   call of a forward step compiled once, the compiler runs during the calls, and NumPy
   computing the same MLP for comparison.
2. A training epoch over NumPy data written into `ej.input` tensors every step (shuffled
   batches from `einjit.data.Loader`, through `fit.fit`) against the same epoch with the data
   pre-sliced in one constant tensor indexed by a static symbol (the demo's way): the ratio.
3. Checkpoint save and load of a 1M-parameter model, against `np.save` / `np.load` of the
   same arrays.

    python benchmarks/bench_data.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def _best(f, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_predict(calls: int) -> dict[str, float]:
    import einjit as ej
    from einjit import data, datasets, fit, train
    from einjit.backends.cc import toolchain as cc
    from einjit.demos.moons import make_mlp

    xs, ys = datasets.half_moons(200)
    xs, ys = xs.astype(np.float32), ys.astype(np.float32)
    mlp = make_mlp()
    x, y = ej.input("x", batch_dims=[10], output_dims=[2]), ej.input("y", batch_dims=[10])
    loss = ej.mean(ej.relu(1 - y * mlp(x)), label="loss")
    train.init_params(loss, seed=0)
    step = fit.train_step(loss, train.sgd_update(loss, 0.1), inputs=[x, y])
    fit.fit(step, data.Loader(xs, ys, batch_size=10), epochs=5, progress=False)
    x1 = ej.input("x1", batch_dims=[1], output_dims=[2])
    predict = fit.forward_step(mlp(x1), inputs=[x1])
    samples = [xs[k % len(xs):k % len(xs) + 1].copy() for k in range(calls)]
    compiles = cc.stats.compiler_invocations
    for s in samples[:100]:
        predict(s)

    def run() -> None:
        for s in samples:
            predict(s)

    seconds = _best(run, 5) / calls
    p = {t.label_str: t.numpy() for t in loss.params()}

    def numpy_run() -> None:
        for s in samples:
            h1 = np.maximum(s @ p["w1"].T + p["b1"], 0)
            h2 = np.maximum(h1 @ p["w2"].T + p["b2"], 0)
            h2 @ p["w3"].T + p["b3"]

    return {"einjit_us": seconds * 1e6, "numpy_us": _best(numpy_run, 5) / calls * 1e6,
            "compiler_runs": cc.stats.compiler_invocations - compiles}


def bench_epoch(batch: int, repeat: int) -> dict[str, float]:
    import einjit as ej
    from einjit import data, datasets, fit, train
    from einjit.demos.moons import make_mlp
    from einjit.ir.indexing import IntRef, get_static_symbol

    xs, ys = datasets.half_moons(2000)
    xs, ys = xs.astype(np.float32), ys.astype(np.float32)
    n_batches = len(xs) // batch
    n = n_batches * batch

    batch_n = get_static_symbol(n_batches, "batch")
    flat = ej.ndarray(xs[:n].reshape(n_batches, batch, 2), batch_axes=2, label="x_all")
    classes = ej.ndarray(ys[:n].reshape(n_batches, batch, 1), batch_axes=2, label="y_all")
    mlp_c = make_mlp()
    loss_c = ej.mean(ej.relu(1 - ej.batch_slice(classes, batch_n) * mlp_c(ej.batch_slice(flat, batch_n))))
    train.init_params(loss_c, seed=0)
    routine = train.to_routine([train.grad_update(loss_c), train.sgd_update(loss_c, 0.01)],
                               bindings={batch_n: IntRef(0)}, name="const_step")
    ref = routine.bindings[batch_n]
    cell = loss_c.value_tn.array.reshape(-1)

    def constant_epoch() -> None:
        total = 0.0
        for k in range(n_batches):
            ref.value = k
            routine()
            total += float(cell[0])

    mlp_i = make_mlp()
    x, y = ej.input("x", batch_dims=[batch], output_dims=[2]), ej.input("y", batch_dims=[batch])
    loss_i = ej.mean(ej.relu(1 - y * mlp_i(x)))
    train.init_params(loss_i, seed=0)
    step = fit.train_step(loss_i, train.sgd_update(loss_i, 0.01), inputs=[x, y])
    loader = data.Loader(xs, ys, batch_size=batch, seed=0)
    epoch = iter(range(10 ** 9))

    def input_epoch() -> None:
        fit.fit(step, loader, epochs=1, start_epoch=next(epoch), progress=False)

    constant_epoch()
    input_epoch()
    const_s, input_s = _best(constant_epoch, repeat), _best(input_epoch, repeat)
    return {"batch": batch, "steps": n_batches, "constant_ms": const_s * 1e3, "inputs_ms": input_s * 1e3,
            "ratio": input_s / const_s}


def bench_checkpoint(repeat: int) -> dict[str, float]:
    import einjit as ej

    with tempfile.TemporaryDirectory() as d:
        params = [ej.param(f"w{k}", values=np.random.default_rng(k).standard_normal((250, 1000)).astype(np.float32))
                  for k in range(4)]
        count = sum(int(np.prod(p.dims)) for p in params)
        path = os.path.join(d, "model.safetensors")
        save_s = _best(lambda: ej.save(params, path), repeat)
        load_s = _best(lambda: ej.load(params, path), repeat)
        arrays = {p.label_str: p.numpy() for p in params}
        npz = os.path.join(d, "model.npz")
        np_save = _best(lambda: np.savez(npz, **arrays), repeat)
        np_load = _best(lambda: dict(np.load(npz)), repeat)
    return {"params": count, "save_ms": save_s * 1e3, "load_ms": load_s * 1e3, "np_savez_ms": np_save * 1e3,
            "np_load_ms": np_load * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    os.environ.setdefault("EINJIT_CACHE_DIR", tempfile.mkdtemp(prefix="einjit-bench-data-"))
    p = bench_predict(args.calls)
    print(f"predict, 1 sample, moons MLP: einjit {p['einjit_us']:.1f} us/call, NumPy {p['numpy_us']:.1f} us/call "
          f"(ratio {p['einjit_us'] / p['numpy_us']:.2f}), compiler runs during prediction: {p['compiler_runs']}")
    for batch in (10, 64):
        e = bench_epoch(batch, args.repeat)
        print(f"epoch, batch {e['batch']} ({e['steps']} steps): constant pre-sliced {e['constant_ms']:.2f} ms, "
              f"inputs + shuffled loader {e['inputs_ms']:.2f} ms, ratio {e['ratio']:.2f}")
    c = bench_checkpoint(args.repeat)
    print(f"checkpoint, {c['params']:,} params: save {c['save_ms']:.1f} ms, load {c['load_ms']:.1f} ms "
          f"(np.savez {c['np_savez_ms']:.1f} ms, np.load {c['np_load_ms']:.1f} ms)")


if __name__ == "__main__":
    main()
