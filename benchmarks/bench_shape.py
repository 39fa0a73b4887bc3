"""Shape and projection inference for a 50-operation network, in milliseconds.

    python benchmarks/bench_shape.py [--layers 16] [--repeat 20]

The network is a deep MLP whose weights have unknown shapes (only the input data and the
biases give sizes): per layer `m = w @ h` (compose), `a = m + b` (pointwise), `h = relu(a)`,
then a loss `(h - y)` summed to one value — 3 * 16 + 2 = 50 operations by default. One run
builds the shapes, propagates every operation, finishes inference and derives the projections
of every operation; the figures are the median and the best of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

from einjit import shape as sh


def network(layers: int, batch: int = 64, hidden: int = 32) -> list[sh.UpdateStep]:
    def make(name: str, **rows) -> sh.Shape:
        return sh.Shape.make(debug_name=name, **rows)

    h = make("x", batch_dims=[batch], input_dims=[], output_dims=[8])
    steps = []
    for i in range(layers):
        w = make(f"w{i}", batch_dims=[])
        b = make(f"b{i}", batch_dims=[], input_dims=[], output_dims=[hidden if i < layers - 1 else 1])
        m, a, r = make(f"m{i}"), make(f"a{i}"), make(f"h{i}")
        steps += [sh.UpdateStep(m, sh.Broadcast(sh.Compose(), w, h)),
                  sh.UpdateStep(a, sh.Broadcast(sh.PointwiseBin(), m, b)),
                  sh.UpdateStep(r, sh.Transpose(sh.PointwiseUn(), a))]
        h = r
    y = make("y", batch_dims=[batch], input_dims=[], output_dims=[1])
    diff, loss = make("diff"), make("loss")
    steps += [sh.UpdateStep(diff, sh.Broadcast(sh.PointwiseBin(), h, y)),
              sh.UpdateStep(loss, sh.Transpose(sh.Permute("...|...->... => 0"), diff))]
    return steps


def one_run(layers: int) -> tuple[float, float, int]:
    sh.reset_state()
    t0 = time.perf_counter()
    steps = network(layers)
    for step in steps:
        sh.propagate_shapes(step)
    sh.finish_inference()
    t1 = time.perf_counter()
    for step in steps:
        sh.derive_projections(step)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, len(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    one_run(args.layers)                      # warm up imports and caches
    runs = [one_run(args.layers) for _ in range(args.repeat)]
    n_ops = runs[0][2]
    for what, k in (("shape inference", 0), ("projections", 1)):
        times = [r[k] for r in runs]
        print(f"{what:16s} {n_ops} ops: median {statistics.median(times):7.2f} ms, best {min(times):7.2f} ms")
    totals = [r[0] + r[1] for r in runs]
    print(f"{'total':16s} {n_ops} ops: median {statistics.median(totals):7.2f} ms, best {min(totals):7.2f} ms")


if __name__ == "__main__":
    main()
