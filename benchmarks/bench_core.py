"""Core C-backend kernels against NumPy, side by side in one process, printed as ratios.

    python benchmarks/bench_core.py [--threads N]

NumPy's BLAS is limited to one thread by default (the generated C code is single-threaded),
so the matmul ratio compares like with like; `--threads 0` leaves BLAS at its default.

The low-level code is built by hand in the shape the lowering and the optimizer produce:
the pointwise chain with its intermediates virtual (inlined into one loop), and the matmul
`c =:+ a * b` as a neutral fill followed by the product-space loops in (i, j, k) order. The
matmul is timed as lowered (i-j-k), with the renderer's loop interchange (i-k-j), and with
the interchange plus the explicit FMA the simplifier introduces (i-k-j+fma), and as the
optimizer's scheduling stage leaves it (packed, register-blocked); percentages are
of NumPy's speed.
The chain is also compared with NumPy writing into a preallocated buffer (`out=`), which
removes NumPy's temporaries but not its one pass over memory per operation.

`bench_bias_backward` is the GPT step's `+.grad, mlp.fc.b.grad` nest at its shape (16 x 64 rows of
512): a gradient `g =+ dy * n` into a zeroed node, the bias gradient summed over the rows, and
the product's gradient `gx =+ g`, fused into one nest; timed with the zero fills kept and after
the "first_writes" stage (`sched/first_writes.py`) turns the covering updates into stores.

`bench_call_overhead` times an empty routine: the bare ctypes call against the seed's
`Routine` (issue 10 moved every call onto it). Recorded on the 2-core development machine
(shared, noisy), best of 5 x 200k calls, alternating old and new runs: the old `cc.link`
routine took 0.16-0.28 us (no static symbols) and 0.62-0.85 us (two ranged statics); the
`Routine` call takes 0.17-0.29 us and 0.64-0.99 us (within the 2 us budget); `schedule()()`
builds a `Work` and takes about 1.3-1.5 us. The moons step (200 epochs, best of 3) measured
3.18-3.35 us/step before and 3.12-3.35 us/step after (single outliers near 4-5 us on both
sides when the machine was busy): unchanged.
"""

from __future__ import annotations

import argparse
import sys
import time

from threads_env import set_threads, shared_cache


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads for NumPy (0: library default)")
    ap.add_argument("--sizes", type=int, nargs="*", default=[256, 512, 1024], help="matmul sizes")
    ap.add_argument("--elements", type=int, default=10**6, help="pointwise chain length")
    ap.add_argument("--moons-epochs", type=int, default=200, help="epochs of the moons demo timed per step")
    return ap.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None and ARGS.threads > 0:
    set_threads(ARGS.threads)
shared_cache()

import numpy as np  # noqa: E402  (after the thread settings)

from einjit import backends  # noqa: E402
from einjit.backends.cc import toolchain as cc  # noqa: E402
from einjit.backends.interface import default_context  # noqa: E402
from einjit.ir import low_level as ll  # noqa: E402
from einjit.ir import ops  # noqa: E402
from einjit.ir.indexing import IntRef, Iterator, get_static_symbol, get_symbol  # noqa: E402
from einjit.ir.passes.tracing import VirtualizeSettings  # noqa: E402
from einjit.ir.sched.first_writes import first_writes  # noqa: E402
from einjit.ir.sched.fusion import fuse_loops  # noqa: E402
from einjit.ir.sched.interchange import interchange_loops  # noqa: E402
from einjit.ir.sched.schedule import schedule_llc  # noqa: E402
from einjit.ir.tnode import Tnode, hosted  # noqa: E402


def best_time(fn, min_time: float = 0.3, repeats: int = 5) -> float:
    """Best of `repeats` runs, each averaging enough calls to last `min_time` / `repeats`."""
    fn()
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < 0.05:
        fn()
        calls += 1
    per = max(1, int(calls * (min_time / repeats) / 0.05))
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(per):
            fn()
        best = min(best, (time.perf_counter() - t) / per)
    return best


def pointwise_chain(n: int, with_exp: bool) -> tuple[ll.LLStmt, list[Tnode], Tnode]:
    """`out = relu((a * b + c) * 0.5 - d)`, or `relu(exp(a) * b + c) * 0.5` with `with_exp`."""
    a, b, c, d, out = (Tnode(x, (n,), memory_mode=hosted()) for x in ("a", "b", "c", "d", "out"))
    i = get_symbol()
    g = {t: ll.Get(t, (Iterator(i),)) for t in (a, b, c, d)}
    B, U = ll.Binop, ll.Unop
    if with_exp:
        expr = B(ops.Binop.MUL, U(ops.Unop.RELU, B(ops.Binop.ADD, B(ops.Binop.MUL, U(ops.Unop.EXP, g[a]), g[b]), g[c])),
                 ll.Constant(0.5))
    else:
        expr = U(ops.Unop.RELU, B(ops.Binop.SUB, B(ops.Binop.MUL, B(ops.Binop.ADD, B(ops.Binop.MUL, g[a], g[b]), g[c]),
                                                    ll.Constant(0.5)), g[d]))
    return ll.ForLoop(i, 0, n - 1, ll.Set(out, (Iterator(i),), expr, "out := chain")), [a, b, c, d], out


def lowered_matmul(n: int, fma: bool = False) -> tuple[ll.LLStmt, Tnode, Tnode, Tnode]:
    """What lowering emits for `c =:+ a * b`: a neutral fill, then loops in (i, j, k) order;
    with `fma`, the accumulation as the simplifier's FMA detection rewrites it."""
    a, b, c = (Tnode(x, (n, n), memory_mode=hosted()) for x in ("a", "b", "c"))
    f1, f2, i, j, k = (get_symbol() for _ in range(5))
    fill = ll.ForLoop(f1, 0, n - 1, ll.ForLoop(f2, 0, n - 1, ll.Set(c, (Iterator(f1), Iterator(f2)), ll.Constant(0.0))))
    ij, ik, kj = (Iterator(i), Iterator(j)), (Iterator(i), Iterator(k)), (Iterator(k), Iterator(j))
    get_a, get_b, get_c = ll.Get(a, ik), ll.Get(b, kj), ll.Get(c, ij)
    value = ll.Ternop(ops.Ternop.FMA, get_a, get_b, get_c) if fma else \
        ll.Binop(ops.Binop.ADD, get_c, ll.Binop(ops.Binop.MUL, get_a, get_b))
    acc = ll.Set(c, ij, value, "c =+ a * b")
    loops = ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, n - 1, ll.ForLoop(k, 0, n - 1, acc)))
    return ll.seq(fill, loops), a, b, c


def link(code: ll.LLStmt, name: str, options: cc.CcOptions | None = None, bindings=()):
    """`code` compiled by the C backend, linked into its context computing in the host arrays."""
    backend = backends.get("cc")
    compiler = backend if options is None else backends.with_options(backend, options)
    return compiler.link(default_context(backend), compiler.compile(bindings, code, shared=True, name=name),
                         {s: IntRef(0) for s in bindings})


def bench_chain(n: int, with_exp: bool, rng: np.random.Generator) -> None:
    code, ins, out = pointwise_chain(n, with_exp)
    xs = [rng.standard_normal(n, dtype=np.float32) for _ in ins]
    for t, x in zip(ins, xs, strict=True):
        t.host_array()[...] = x
    out.host_array()
    routine = link(code, "chain")
    a, b, c, d = xs
    ref = (lambda: np.maximum(np.exp(a) * b + c, 0) * np.float32(0.5)) if with_exp else \
        (lambda: np.maximum((a * b + c) * np.float32(0.5) - d, 0))
    tmp = np.empty_like(a)

    def in_place() -> np.ndarray:
        """NumPy without temporaries: every op writes into one preallocated buffer."""
        if with_exp:
            np.exp(a, out=tmp)
            np.multiply(tmp, b, out=tmp)
            np.add(tmp, c, out=tmp)
            np.maximum(tmp, 0, out=tmp)
            return np.multiply(tmp, np.float32(0.5), out=tmp)
        np.multiply(a, b, out=tmp)
        np.add(tmp, c, out=tmp)
        np.multiply(tmp, np.float32(0.5), out=tmp)
        np.subtract(tmp, d, out=tmp)
        return np.maximum(tmp, 0, out=tmp)

    routine()
    np.testing.assert_allclose(out.host_array(), ref(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(in_place(), ref(), rtol=1e-5, atol=1e-6)
    t_c, t_np, t_inp = best_time(routine), best_time(ref), best_time(in_place)
    label = "relu(exp(a)*b+c)*0.5" if with_exp else "relu((a*b+c)*0.5-d)"
    print(f"{'chain ' + label:28s} n={n:<8d} einjit {t_c * 1e3:6.3f} ms   numpy {t_np * 1e3:6.3f} ms "
          f"({t_np / t_c:5.2f}x)   numpy out= {t_inp * 1e3:6.3f} ms ({t_inp / t_c:5.2f}x)")


def bench_matmul(n: int, rng: np.random.Generator) -> None:
    A, B = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    flops = 2 * n**3
    t_np = best_time(lambda: A @ B)
    cells = [f"matmul n={n:<5d} numpy {flops / t_np / 1e9:6.1f} GFLOP/s"]
    variants = (("i-j-k", False, None), ("i-k-j", False, interchange_loops), ("i-k-j+fma", True, interchange_loops),
                ("scheduled", True, lambda code: schedule_llc(code, VirtualizeSettings())))
    for label, fma, stage in variants:
        code, a, b, c = lowered_matmul(n, fma)
        if stage is not None:
            code = stage(code)
        a.host_array()[...], b.host_array()[...] = A, B
        c.host_array()
        routine = link(code, "matmul", cc.CcOptions())
        routine()
        np.testing.assert_allclose(c.host_array(), A @ B, rtol=1e-3, atol=1e-3 * np.sqrt(n))
        t_c = best_time(routine, min_time=0.3 if n < 1024 or label != "i-j-k" else 0.0, repeats=3)
        cells.append(f"{label} {flops / t_c / 1e9:5.1f} GFLOP/s ={t_np / t_c * 100:5.1f}%")
    print("   ".join(cells))


def bias_backward(rows: tuple[int, int], d: int) -> tuple[ll.LLStmt, list[Tnode], list[Tnode]]:
    """`g =+ dy * n`, `db =+ g` (summed over the rows) and `gx =+ g`, each into a zeroed node,
    as backprop lowers a dense layer's bias and product through `+`."""
    dy, n, g, gx = (Tnode(x, (*rows, d), memory_mode=hosted()) for x in ("dy", "n", "g", "gx"))
    db = Tnode("db", (d,), memory_mode=hosted())
    b, t, j = (get_symbol() for _ in range(3))
    at = (Iterator(b), Iterator(t), Iterator(j))

    def nest(st: ll.LLStmt) -> ll.LLStmt:
        return ll.ForLoop(b, 0, rows[0] - 1, ll.ForLoop(t, 0, rows[1] - 1, ll.ForLoop(j, 0, d - 1, st)))

    add = ops.Binop.ADD
    code = ll.seq(
        ll.ZeroOut(db), ll.ZeroOut(gx), ll.ZeroOut(g),
        nest(ll.Set(g, at, ll.Ternop(ops.Ternop.FMA, ll.Get(dy, at), ll.Get(n, at), ll.Get(g, at)), "g =+ dy * n")),
        nest(ll.Set(db, (Iterator(j),), ll.Binop(add, ll.Get(db, (Iterator(j),)), ll.Get(g, at)), "db =+ g")),
        nest(ll.Set(gx, at, ll.Binop(add, ll.Get(gx, at), ll.Get(g, at)), "gx =+ g")))
    return code, [dy, n], [g, gx, db]


def bench_bias_backward(rng: np.random.Generator, rows: tuple[int, int] = (16, 64), d: int = 512) -> None:
    code, (dy, n), outs = bias_backward(rows, d)
    x_dy, x_n = (rng.standard_normal((*rows, d), dtype=np.float32) for _ in range(2))
    dy.host_array()[...], n.host_array()[...] = x_dy, x_n
    for t in outs:
        t.host_array()

    def ref() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        g = x_dy * x_n
        return g, g.copy(), g.sum(axis=(0, 1))

    want = ref()
    cells = [f"bias backward {rows[0]}x{rows[1]}x{d}"]
    t_np = best_time(ref)
    for label, stages in (("fills kept", fuse_loops), ("first writes", lambda c: fuse_loops(first_writes(c)))):
        routine = link(stages(code), "bias_backward")
        routine()
        for t, w in zip(outs, want, strict=True):
            np.testing.assert_allclose(t.host_array(), w, rtol=1e-4, atol=1e-3)
        t_c = best_time(routine)
        cells.append(f"{label} {t_c * 1e3:6.3f} ms ({t_np / t_c:5.2f}x)")
    print(f"{cells[0]:28s} numpy {t_np * 1e3:6.3f} ms   " + "   ".join(cells[1:]))


def bench_call_overhead() -> None:
    """Calling an empty routine: the bare ctypes call of the C function against the seed's
    `Routine` called (schedule + run + await) and scheduled explicitly (`schedule()()`)."""
    statics = (get_static_symbol(4, "s"), get_static_symbol(None, "t"))
    cells = []
    for bindings in ((), statics):
        routine = link(ll.Noop(), f"empty{len(bindings)}", bindings=bindings)
        fn = cc.compile_batch([(routine.name, ll.Noop())], bindings=bindings)[0].function
        args = [0] * len(bindings)
        t_ctypes = best_time(lambda fn=fn, args=args: fn(*args), min_time=0.5)
        t_call, t_schedule = best_time(routine, min_time=0.5), best_time(lambda r=routine: r.schedule()(), min_time=0.5)
        cells.append(f"{len(bindings)} statics: ctypes {t_ctypes * 1e6:5.2f} us, routine() {t_call * 1e6:5.2f} us "
                     f"(+{(t_call - t_ctypes) * 1e6:4.2f}), schedule()() {t_schedule * 1e6:5.2f} us "
                     f"(+{(t_schedule - t_ctypes) * 1e6:4.2f})")
    print("empty routine call   " + "   |   ".join(cells))


def bench_moons(epochs: int) -> None:
    from einjit.demos.moons import run_moons
    result = run_moons(epochs=epochs, quiet=True)
    print(f"moons training step  {result.seconds_per_step * 1e6:7.2f} us/step over {result.steps} steps "
          f"(final loss {result.final_loss:.4f}, accuracy {result.accuracy:.3f})")


def main() -> None:
    rng = np.random.default_rng(0)
    threads = "BLAS default threads" if ARGS.threads <= 0 else f"BLAS threads={ARGS.threads}"
    print(f"einjit C backend vs NumPy {np.__version__} ({threads}); einjit code is single-threaded; "
          f"(Nx) = einjit is N times faster")
    for with_exp in (False, True):
        bench_chain(ARGS.elements, with_exp, rng)
    for n in ARGS.sizes:
        bench_matmul(n, rng)
    bench_bias_backward(rng)
    bench_call_overhead()
    bench_moons(ARGS.moons_epochs)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
