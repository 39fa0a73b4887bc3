"""The exported digits MLP (64 -> 128 -> 10, ReLU) against ONNX Runtime on the same model.

    python benchmarks/bench_deploy.py [--threads N] [--json]

Rows: per-call latency at batch 1 and per-sample time at batch 256 of the C library that
`export_c` writes, timed two ways — by a C loop linked with the library (what a C program
calling it sees) and through ctypes from Python (the same harness as ONNX Runtime's Python
API, so the ratio includes the same kind of call overhead) — against `InferenceSession.run` on
the model `export_onnx` wrote, with the same thread count (`intra_op_num_threads`); and the
size of the built library. A ratio is ONNX Runtime's time over einjit's: above 1, einjit is
faster.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_TIMER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "digits.h"

int main(int argc, char **argv) {
  long calls = atol(argv[1]);
  static float in[DIGITS_IMAGES_SIZE], out[DIGITS_LOGITS_SIZE];
  for (int k = 0; k < DIGITS_IMAGES_SIZE; k++) in[k] = (float)(k % 17) / 17.0f;
  digits *m = digits_create();
  double best = 1e30;
  for (int round = 0; round < 7; round++) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long c = 0; c < calls; c++) digits_run(m, in, out);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
    if (s < best) best = s;
  }
  printf("%.9e %f\n", best / calls, out[0]);
  digits_destroy(m);
  return 0;
}
"""


def _model():
    import einjit as ej
    from einjit import fit, nn, train
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128, label="fc1"), nn.ReLU(), nn.Linear(128, 10, label="fc2"))
    x = ej.input("images", batch_dims=[8], output_dims=[1, 8, 8])
    train.init_params(model(x), seed=0)
    return model, fit


def _best(fn, calls: int, rounds: int = 7) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best


def deploy_rows(threads: int = 1, quick: bool = False) -> list[dict]:
    import einjit as ej
    from einjit.export import export_c, export_onnx
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    model, fit = _model()
    rows = []
    work = Path(tempfile.mkdtemp(prefix="einjit-deploy-"))
    for batch in (1, 256):
        x = ej.input("images", batch_dims=[batch], output_dims=[1, 8, 8])
        step = fit.forward_step(ej.einsum("...|->c => ...|->c", model(x), label="logits"), inputs=[x],
                                name=f"digits_b{batch}")
        lib = export_c(step, work / f"b{batch}", name="digits", threads=threads)
        subprocess.run(["make", "-C", str(lib.directory), "libdigits.a", "libdigits.so"], check=True,
                       capture_output=True)
        (lib.directory / "timer.c").write_text(_TIMER)
        subprocess.run(["cc", "-O2", "-o", "timer", "timer.c", "libdigits.a", "-lm"]
                       + (["-fopenmp"] if threads > 1 else []), cwd=lib.directory, check=True)
        calls = (2000 if quick else 20000) if batch == 1 else (50 if quick else 300)
        out = subprocess.run(["./timer", str(calls)], cwd=lib.directory, capture_output=True, text=True, check=True)
        t_c = float(out.stdout.split()[0])
        so = ctypes.CDLL(str(lib.directory / "libdigits.so"))
        so.digits_create.restype = ctypes.c_void_p
        handle = ctypes.c_void_p(so.digits_create())
        xs = np.random.default_rng(0).random((batch, 1, 8, 8), dtype=np.float32)
        ys = np.zeros((batch, 10), np.float32)
        run = so.digits_run
        args = (handle, xs.ctypes.data_as(ctypes.c_void_p), ys.ctypes.data_as(ctypes.c_void_p))
        t_ctypes = _best(lambda run=run, args=args: run(*args), calls)
        np.testing.assert_allclose(ys, step(xs), rtol=1e-5, atol=1e-5)
        t_ort = None
        if ort is not None:
            export_onnx(step, lib.directory / "digits.onnx")
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            session = ort.InferenceSession(str(lib.directory / "digits.onnx"), opts,
                                           providers=["CPUExecutionProvider"])
            feed = {session.get_inputs()[0].name: xs}
            np.testing.assert_allclose(session.run(None, feed)[0], ys, rtol=1e-5, atol=1e-5)
            t_ort = _best(lambda session=session, feed=feed: session.run(None, feed), calls)
        size = (lib.directory / "libdigits.a").stat().st_size
        what = "latency per call" if batch == 1 else "time per batch"
        for harness, t in (("C loop", t_c), ("ctypes", t_ctypes)):
            rows.append({"workload": f"exported digits MLP batch {batch}, {what} ({harness})", "einjit_s": t,
                         "onnxruntime_s": t_ort, "vs_onnxruntime": None if t_ort is None else t_ort / t,
                         "library_bytes": size})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    os.environ["EINJIT_NUM_THREADS"] = str(args.threads)
    rows = deploy_rows(args.threads, args.quick)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        ratio = "onnxruntime not installed" if r["onnxruntime_s"] is None else \
            f"onnxruntime {r['onnxruntime_s'] * 1e6:9.1f} µs ({r['vs_onnxruntime']:.2f}x)"
        print(f"{r['workload']:<62} einjit {r['einjit_s'] * 1e6:9.1f} µs | {ratio} | "
              f"libdigits.a {r['library_bytes']} bytes")


if __name__ == "__main__":
    sys.exit(main())
