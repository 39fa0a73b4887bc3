"""ATL matmul and matvec compiled through Halide and through einjit, against NumPy.

    python benchmarks/bench_atl.py [--n 1024] [--threads N] [--repeat 5]

Every side gets the same number of threads (BLAS through its environment variables,
Halide through HL_NUM_THREADS and the autoscheduler's parallelism, einjit through
EINJIT_NUM_THREADS). Times are medians of
``--repeat`` samples (each a batch of calls lasting about 20 ms) after one warm-up run,
NumPy's and the ATL function's samples interleaved in one process (a busy moment on a
shared machine slows both alike); ratios are ATL time over NumPy time (lower is better).
Without Halide installed its column is a note. A large matmul gets Halide's register-blocked contraction
schedule ("contraction" in the schedule column), other programs an autoscheduler.
The einjit column is the same ATL program through ``einjit.atl.to_assignments``: einjit's
assignments, optimizer and C backend (gcc), with its time, its ratio to NumPy and its compile
time; it is skipped with a note if that backend cannot be imported.
"""

from __future__ import annotations

import argparse
import os
import time

from threads_env import set_threads


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024, help="matrix size")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads for BLAS, Halide and einjit")
    ap.add_argument("--repeat", type=int, default=5)
    return ap.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    set_threads(ARGS.threads, also=("HL_NUM_THREADS", "EINJIT_NUM_THREADS"))

import numpy as np  # noqa: E402  (after the thread settings)

from einjit.atl import Func, Gen, R, Sum, TTensor, Var  # noqa: E402


def median_times(fns, args, repeat: int, sample_s: float = 0.02) -> list[float]:
    """Median time per call of each function on `args`, their samples interleaved round by
    round. A sample times a batch of calls lasting about `sample_s`: a 512 x 512 matvec takes
    some 40 µs, where one call per sample would also time the timer and the loop around it."""
    times: list[list[float]] = [[] for _ in fns]
    calls = []
    for fn in fns:
        fn(*args)
        t0 = time.perf_counter()
        fn(*args)
        calls.append(max(1, int(sample_s / max(time.perf_counter() - t0, 1e-7))))
    for _ in range(repeat):
        for k, (fn, per) in enumerate(zip(fns, calls, strict=True)):
            t0 = time.perf_counter()
            for _ in range(per):
                fn(*args)
            times[k].append((time.perf_counter() - t0) / per)
    return [float(np.median(t)) for t in times]


def programs(n: int) -> dict:
    A, B, x = Var("A"), Var("B"), Var("x")
    Rn, Rnn = TTensor(n, R), TTensor(n, TTensor(n, R))
    rng = np.random.default_rng(0)
    a, b, v = rng.standard_normal((n, n)), rng.standard_normal((n, n)), rng.standard_normal(n)
    return {
        "matmul": (Func([("A", Rnn), ("B", Rnn)],
                        Gen("i", n, Gen("j", n, Sum("k", n, A["i", "k"] * B["k", "j"])))),
                   (a, b), np.matmul),
        "matvec": (Func([("A", Rnn), ("x", Rn)],
                        Gen("i", n, Sum("j", n, A["i", "j"] * x["j"]))),
                   (a, v), np.matmul),
    }


def einjit_column(f: Func, args, expected, ref, repeat: int) -> str:
    """Time, ratio to NumPy and compile time of the einjit backend."""
    t0 = time.perf_counter()
    try:
        fn = f.compiled("einjit")
    except ImportError as exc:
        return f"skipped: {exc.__cause__ or exc}"
    compile_s = time.perf_counter() - t0
    got = fn(*args)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)
    t, t_np = median_times([fn, ref], args, repeat)
    return f"{t * 1e3:7.3f} ms {t / t_np:7.2f} {compile_s:7.2f}s"


def halide_column(f: Func, args, expected, ref, repeat: int) -> str:
    """NumPy's time, Halide's, their ratio, the schedule and the compile time; Halide's part
    is a note when Halide is not installed."""
    t0 = time.perf_counter()
    try:
        fn = f.compiled("halide")
    except ImportError as exc:
        (t_np,) = median_times([ref], args, repeat)
        return f"{t_np * 1e3:7.3f} ms {'(halide: ' + str(exc.__cause__ or exc) + ')':>44}"
    got = fn(*args)
    compile_s = time.perf_counter() - t0
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)
    t_hl, t_np = median_times([fn, ref], args, repeat)
    return f"{t_np * 1e3:7.3f} ms {t_hl * 1e3:7.3f} ms {t_hl / t_np:7.2f}  {fn.scheduler:12} {compile_s:7.2f}s"


def main(args: argparse.Namespace) -> None:
    print(f"n = {args.n}, threads = {args.threads}, median of {args.repeat}")
    print(f"{'op':8} {'numpy':>10} {'halide':>10} {'ratio':>7}  {'schedule':12} "
          f"{'compile':>8}  {'einjit':>10} {'ratio':>7} {'compile':>8}")
    for name, (f, inputs, ref) in programs(args.n).items():
        expected = ref(*inputs)
        print(f"{name:8} {halide_column(f, inputs, expected, ref, args.repeat)}  "
              f"{einjit_column(f, inputs, expected, ref, args.repeat)}")

if __name__ == "__main__":
    main(ARGS)
