"""What the machine can do: its fp32 FMA peak and its memory bandwidth, measured by small C
probes compiled with einjit's gcc toolchain, so benchmark rows can be read as shares of them.

    python benchmarks/machine.py [--threads N]

FMA peak: 16 independent vector accumulators of AVX-512 (12 of narrower vectors, which have
half the registers), each updated by a fused multiply-add per iteration: enough independent
chains to cover the FMA latency on every FMA unit, and no loads. Bandwidth,
stream-like: a read of an array much larger than the last-level cache into 32 partial sums
(what a matrix-vector product or a reduction needs), and a triad `a[i] = b[i] + s * c[i]`
(two reads and a write per element, counting the write-allocate read as STREAM does not).
The same read probe on an 8 MiB array gives the bandwidth of data that stays in the
last-level cache between calls (a benchmark repeating a call on the same 8 MiB matrix
reads it from there). Each figure is the best of many short runs (about a millisecond of
arithmetic, a 128 MiB read), so that on a machine shared with other jobs some runs get a core
to themselves; on a busy machine they still drop with the load, like every other row.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np

_SOURCE = """\
#include <stddef.h>
#ifdef __AVX512F__
typedef float vec __attribute__((vector_size(64)));
#define CHAINS 16
#else
typedef float vec __attribute__((vector_size(32)));
#define CHAINS 12
#endif
#define LANES ((int)(sizeof(vec) / sizeof(float)))

/* CHAINS independent FMA chains per thread (as many as the vector registers hold beside the
   two operands); returns the flops done. */
double fma_probe(long iterations, float a, float b, float *sink) {
  double flops = 0;
#pragma omp parallel THREADS reduction(+:flops)
  {
    vec acc[CHAINS];
    for (int k = 0; k < CHAINS; ++k) acc[k] = (vec){0} + (float)k;
    vec va = (vec){0} + a, vb = (vec){0} + b;
    for (long i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
      for (int k = 0; k < CHAINS; ++k) acc[k] = acc[k] * va + vb;
    }
    float s = 0;
    for (int k = 0; k < CHAINS; ++k) for (int l = 0; l < LANES; ++l) s += acc[k][l];
#pragma omp critical
    *sink += s;
    flops += 2.0 * CHAINS * LANES * (double)iterations;
  }
  return flops;
}

double read_probe(const double *restrict a, long n) {
  double total = 0;
#pragma omp parallel for THREADS reduction(+:total) schedule(static)
  for (long b = 0; b < n / 4096; ++b) {
    double s[32] = {0};
    for (long i = b * 4096; i < (b + 1) * 4096; i += 32)
#pragma GCC unroll 32
      for (int l = 0; l < 32; ++l) s[l] += a[i + l];
    for (int l = 0; l < 32; ++l) total += s[l];
  }
  return total;
}

void triad_probe(double *restrict a, const double *restrict b, const double *restrict c, double s, long n) {
#pragma omp parallel for THREADS schedule(static)
  for (long i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}
"""


@dataclass(frozen=True)
class Machine:
    threads: int
    fma_peak_gflops: float
    read_gbs: float
    triad_gbs: float
    cached_read_gbs: float

    def __str__(self) -> str:
        return (f"machine, {self.threads} thread(s): fp32 FMA peak {self.fma_peak_gflops:.1f} GFLOP/s; "
                f"memory read {self.read_gbs:.1f} GB/s, triad {self.triad_gbs:.1f} GB/s, "
                f"read from the last-level cache (8 MiB) {self.cached_read_gbs:.1f} GB/s")


def _library(threads: int) -> ctypes.CDLL:
    from einjit.backends.cc import toolchain as cc

    flags = ("-O2", "-march=native", "-fPIC", "-shared", "-ffp-contract=fast")
    options = cc.CcOptions(flags=flags, libs=(), vector_math=False, threads=threads)
    source = _SOURCE.replace("THREADS", f"num_threads({threads})")
    lib = cc.load_library(cc.compile_source(source, label="machine probes", options=options))
    lib.fma_probe.restype = ctypes.c_double
    lib.fma_probe.argtypes = [ctypes.c_long, ctypes.c_float, ctypes.c_float, ctypes.POINTER(ctypes.c_float)]
    lib.read_probe.restype = ctypes.c_double
    lib.read_probe.argtypes = [ctypes.c_void_p, ctypes.c_long]
    lib.triad_probe.restype = None
    lib.triad_probe.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_double, ctypes.c_long]
    return lib


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure(threads: int = 1, *, big_bytes: int = 128 << 20, repeats: int = 10) -> Machine:
    """The machine's figures at `threads` threads (best of `repeats` runs each)."""
    lib = _library(threads)
    sink = ctypes.c_float(0)
    iterations = 20_000
    flops = lib.fma_probe(iterations, 0.999, 1e-3, ctypes.byref(sink))
    peak = flops / _best(lambda: lib.fma_probe(iterations, 0.999, 1e-3, ctypes.byref(sink)), 50 * repeats) / 1e9

    def read_gbs(nbytes: int, runs: int) -> float:
        a = np.ones(nbytes // 8)
        ptr = a.ctypes.data
        lib.read_probe(ptr, a.size)
        return a.nbytes / _best(lambda: lib.read_probe(ptr, a.size), runs) / 1e9

    n = big_bytes // 24
    a, b, c = np.zeros(n), np.ones(n), np.ones(n)
    lib.triad_probe(a.ctypes.data, b.ctypes.data, c.ctypes.data, 3.0, n)
    triad = 3 * 8 * n / _best(lambda: lib.triad_probe(a.ctypes.data, b.ctypes.data, c.ctypes.data, 3.0, n),
                              repeats) / 1e9
    return Machine(threads, peak, read_gbs(big_bytes, repeats), triad, read_gbs(8 << 20, 10 * repeats))


def per_cpu_gflops(runs: int = 200) -> dict[int, float]:
    """Each CPU's typical (median) one-thread FMA rate, the process pinned to it in turn.

    The peak above is a best-of, which a vCPU slowed by its host (a busy hyperthread sibling,
    a neighbour's guest) still reaches now and then; a thread-scaling row measured while one
    vCPU runs slow is read wrong unless the reader sees the median of each CPU beside it."""
    lib = _library(1)
    sink = ctypes.c_float(0)
    iterations = 2_000
    flops = lib.fma_probe(iterations, 0.999, 1e-3, ctypes.byref(sink))
    saved = os.sched_getaffinity(0)
    rates = {}
    try:
        for cpu in sorted(saved):
            os.sched_setaffinity(0, {cpu})
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                lib.fma_probe(iterations, 0.999, 1e-3, ctypes.byref(sink))
                times.append(time.perf_counter() - t)
            rates[cpu] = flops / statistics.median(times) / 1e9
    finally:
        os.sched_setaffinity(0, saved)
    return rates


def describe_cpus(rates: dict[int, float]) -> str:
    return "median FMA rate per CPU: " + ", ".join(f"cpu{c} {g:.1f}" for c, g in rates.items()) + " GFLOP/s"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    print(measure(ap.parse_args().threads))
    print(describe_cpus(per_cpu_gflops()))
