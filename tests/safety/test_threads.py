"""ATL's compiled functions called from several threads at once: each call gets its own
arguments' result (the einjit backend's routine works in shared host arrays, so calls are
serialized), and the first calls compile once."""

from __future__ import annotations

import threading

import numpy as np

from einjit.atl import Func, Gen, R, Sum, TTensor, Var

N = 400
RN = TTensor(N, R)
RNN = TTensor(N, RN)


def matvec() -> Func:
    A, x = Var("A"), Var("x")
    return Func([("A", RNN), ("x", RN)], Gen("i", N, Sum("j", N, A["i", "j"] * x["j"])))


def test_einjit_backend_calls_from_two_threads_get_their_own_results():
    f = matvec()
    rng = np.random.default_rng(0)
    A = rng.standard_normal((N, N))
    xs = [rng.standard_normal(N) for _ in range(2)]
    want = [A @ x for x in xs]
    start = threading.Barrier(2)
    errors: list[str] = []
    compiled: list[object] = [None, None]

    def worker(k: int) -> None:
        start.wait()
        compiled[k] = f.compiled("einjit")
        for step in range(300):
            got = f.jit_exec(A, xs[k], backend="einjit")
            if not np.allclose(got, want[k], rtol=1e-12, atol=1e-12):
                errors.append(f"thread {k}, call {step}: wrong result")
                return

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert compiled[0] is compiled[1]
