"""The exported digits MLP (64 -> 128 -> 10, ReLU) against ONNX Runtime on the same model.

    python benchmarks/bench_deploy.py [--threads N] [--json]

Rows: per-call latency at batch 1 and time per batch at batch 256 of the C library that
`export_c` writes, timed two ways — by a C loop linked with the library (what a C program
calling it sees) and through ctypes from Python (the same harness as ONNX Runtime's Python
API, so the ratio includes the same kind of call overhead) — and of the same step run by
einjit itself, against `InferenceSession.run` on the model `export_onnx` wrote. Every row
names its thread count: the library is exported with `threads=N`, einjit compiles with
`EINJIT_NUM_THREADS=N`, ONNX Runtime gets `intra_op_num_threads=N`. The timers take turns
round by round and each keeps its best, so load from other processes falls on all alike.
Also: the size of the built library (static and shared). A ratio is ONNX Runtime's time over
einjit's: above 1, einjit is faster.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

_TIMER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "digits.h"

/* ./timer CALLS ROUNDS: the best of ROUNDS rounds of CALLS calls, per call, in seconds. */
int main(int argc, char **argv) {
  long calls = atol(argv[1]);
  int rounds = atoi(argv[2]);
  static float in[DIGITS_IMAGES_SIZE], out[DIGITS_LOGITS_SIZE];
  for (int k = 0; k < DIGITS_IMAGES_SIZE; k++) in[k] = (float)(k % 17) / 17.0f;
  digits *m = digits_create();
  digits_run(m, in, out);
  double best = 1e30;
  for (int round = 0; round < rounds; round++) {
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

#: Multiply-adds of one sample: 64 -> 128 -> 10.
_MACS_PER_SAMPLE = 64 * 128 + 128 * 10


def _model():
    import einjit as ej
    from einjit import fit, nn, train
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128, label="fc1"), nn.ReLU(), nn.Linear(128, 10, label="fc2"))
    x = ej.input("images", batch_dims=[8], output_dims=[1, 8, 8])
    train.init_params(model(x), seed=0)
    return model, fit


def _per_call(fn, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls


def _interleaved(timers: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Each timer's best over `rounds` rounds, the timers taking turns within a round, so
    that load from other processes falls on all of them alike."""
    best = dict.fromkeys(timers, float("inf"))
    for _ in range(rounds):
        for name, timer in timers.items():
            best[name] = min(best[name], timer())
    return best


@contextlib.contextmanager
def _einjit_threads(threads: int):
    """einjit's own steps compiled for `threads` threads (`EINJIT_NUM_THREADS`)."""
    old = os.environ.get("EINJIT_NUM_THREADS")
    os.environ["EINJIT_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        if old is None:
            del os.environ["EINJIT_NUM_THREADS"]
        else:
            os.environ["EINJIT_NUM_THREADS"] = old


def deploy_rows(threads: int = 1, quick: bool = False) -> list[dict]:
    """Rows for batch 1 and 256: the exported library from a C loop and through ctypes, and
    the same step run by einjit itself, each against ONNX Runtime at `threads` threads."""
    with _einjit_threads(threads):
        return _rows(threads, quick)


def _rows(threads: int, quick: bool) -> list[dict]:
    import einjit as ej
    from einjit.export import export_c, export_onnx
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    model, fit = _model()
    rows = []
    work = Path(tempfile.mkdtemp(prefix="einjit-deploy-"))
    openmp = ["-fopenmp"] if threads > 1 else []
    for batch in (1, 256):
        x = ej.input("images", batch_dims=[batch], output_dims=[1, 8, 8])
        step = fit.forward_step(ej.einsum("...|->c => ...|->c", model(x), label="logits"), inputs=[x],
                                name=f"digits_b{batch}")
        lib = export_c(step, work / f"b{batch}", name="digits", threads=threads)
        subprocess.run(["make", "-C", str(lib.directory), "libdigits.a", "libdigits.so"], check=True,
                       capture_output=True)
        (lib.directory / "timer.c").write_text(_TIMER)
        subprocess.run(["cc", "-O2", "-o", "timer", "timer.c", "libdigits.a", "-lm", *openmp], cwd=lib.directory,
                       check=True)
        calls = (2000 if quick else 20000) if batch == 1 else (50 if quick else 300)

        def c_loop(calls=calls, directory=lib.directory) -> float:
            out = subprocess.run(["./timer", str(calls), "3"], cwd=directory, capture_output=True, text=True,
                                 check=True)
            return float(out.stdout.split()[0])

        so = ctypes.CDLL(str(lib.directory / "libdigits.so"))
        so.digits_create.restype = ctypes.c_void_p
        so.digits_run.argtypes = [ctypes.c_void_p] * 3
        so.digits_run.restype = None
        handle = ctypes.c_void_p(so.digits_create())
        xs = np.random.default_rng(0).random((batch, 1, 8, 8), dtype=np.float32)
        ys = np.zeros((batch, 10), np.float32)
        # The caller's arrays are passed as they are: no copy on the way in or out.
        args = (handle, xs.ctypes.data_as(ctypes.c_void_p), ys.ctypes.data_as(ctypes.c_void_p))
        so.digits_run(*args)
        np.testing.assert_array_equal(ys, step(xs))
        timers = {"C loop": c_loop,
                  "ctypes": lambda run=so.digits_run, args=args, calls=calls: _per_call(lambda: run(*args), calls),
                  "einjit step": lambda step=step, xs=xs, calls=calls: _per_call(lambda: step(xs), calls)}
        if ort is not None:
            export_onnx(step, lib.directory / "digits.onnx")
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            session = ort.InferenceSession(str(lib.directory / "digits.onnx"), opts,
                                           providers=["CPUExecutionProvider"])
            feed = {session.get_inputs()[0].name: xs}
            np.testing.assert_allclose(session.run(None, feed)[0], ys, rtol=1e-5, atol=1e-5)
            timers["onnxruntime"] = lambda session=session, feed=feed, calls=calls: _per_call(
                lambda: session.run(None, feed), calls)
        best = _interleaved(timers, 3 if quick else 7)
        t_ort = best.get("onnxruntime")
        size = (lib.directory / "libdigits.a").stat().st_size
        what = "latency per call" if batch == 1 else "time per batch"
        for harness in ("C loop", "ctypes", "einjit step"):
            t = best[harness]
            where = "exported" if harness != "einjit step" else "einjit's own"
            rows.append({"workload": f"{where} digits MLP batch {batch}, {what} ({harness}), {threads} thread(s)",
                         "threads": threads, "einjit_s": t, "einjit_gflop_s": 2 * _MACS_PER_SAMPLE * batch / t / 1e9,
                         "onnxruntime_s": t_ort, "vs_onnxruntime": None if t_ort is None else t_ort / t,
                         "library_bytes": size, "library_so_bytes": (lib.directory / "libdigits.so").stat().st_size})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rows = deploy_rows(args.threads, args.quick)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        ratio = "onnxruntime not installed" if r["onnxruntime_s"] is None else \
            f"onnxruntime {r['onnxruntime_s'] * 1e6:9.1f} µs ({r['vs_onnxruntime']:.2f}x)"
        print(f"{r['workload']:<76} einjit {r['einjit_s'] * 1e6:9.1f} µs ({r['einjit_gflop_s']:5.1f} GFLOP/s) | "
              f"{ratio} | libdigits.a {r['library_bytes']} bytes")


if __name__ == "__main__":
    sys.exit(main())
