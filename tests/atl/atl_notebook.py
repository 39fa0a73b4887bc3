"""The notebook's seven programs, its inputs and its printed results, shared by tests."""

from __future__ import annotations

import numpy as np
import pytest

from einjit.atl import Eq, Func, Gen, Let, Pair, Proj, R, Sum, TTensor, Var

n = 3
Rn = TTensor(n, R)
Rnn = TTensor(n, Rn)
Rnnn = TTensor(n, Rnn)

x, A, D = Var("x"), Var("A"), Var("D")
a, b, c = Var("a"), Var("b"), Var("c")
i, j, k = "i", "j", "k"


def p0(e):
    return Proj(0, e)


def p1(e):
    return Proj(1, e)


Axc = Gen(i, n, c[i] + Sum(j, n, A[i, j] * x[j]))
tr = Sum(i, n, A[i, i])
diag = Gen(i, n, Gen(j, n, Eq(i, j) * x[i]))
ab3 = Let("x", Gen(j, n, Pair(Pair(a[j], b[j]), a[j] * b[j])),
          Sum(j, n, p0(p0(x[j])) + p1(p0(x[j])) + p1(x[j])))
ctrct = Gen(i, n, Sum(j, n, Let("x", Sum(k, n, D[i, j, k] * a[k]), x * b[j])))
prod = Gen(i, n, Sum(j, n, A[i, j] * x[j]))
qprod = Sum(k, n, prod[k] * x[k])
dprod = Sum(j, n, Sum(i, n, a[j] * diag[j, i] * a[i]))


def inputs(order: str = "F") -> dict[str, np.ndarray]:
    return dict(
        x=np.array([4., 7., 1.], order=order),
        A=np.array([[5., 2., 0.], [2.2, 0., 4.5], [0., 6.1, 3.3]], order=order),
        a=np.array([9.2, 5.4, 7.1], order=order),
        b=np.array([0.3, 2.1, 1.6], order=order),
        c=np.array([0., 0., 1.], order=order),
        D=np.array([[[1., 2., 3.], [4., 5., 6.], [7., 8., 9.]],
                    [[10., 11., 12.], [13., 14., 15.], [16., 17., 18.]],
                    [[19., 20., 21.], [22., 23., 24.], [25., 26., 27.]]], order=order),
    )


#: name -> (signature, body, the notebook's interpreted result, its compiled result)
PROGRAMS = {
    "Axc": ([("A", Rnn), ("x", Rn), ("c", Rn)], Axc,
            [34.0, 13.3, 46.99999999999999], [34., 13.3, 47.]),
    "tr": ([("A", Rnn)], tr, 8.3, 8.3),
    "diag": ([("x", Rn)], diag,
             [[4.0, 0.0, 0.0], [0.0, 7.0, 0.0], [0.0, 0.0, 1.0]],
             [[4., 0., 0.], [0., 7., 0.], [0., 0., 1.]]),
    "ab3": ([("a", Rn), ("b", Rn)], ab3, 51.16, 51.16),
    "ctrct": ([("D", Rnnn), ("a", Rn), ("b", Rn)], ctrct,
              [510.23, 1291.43, 2072.6299999999997], [510.23, 1291.43, 2072.63]),
    "qprod": ([("A", Rnn), ("x", Rn)], qprod, 275.1, 275.1),
    "dprod": ([("x", Rn), ("a", Rn)], dprod, 593.0899999999999, 593.0899999999999),
}


def func(name: str) -> Func:
    sig, body, _, _ = PROGRAMS[name]
    return Func(sig, body)


def args_of(name: str, order: str = "F") -> list[np.ndarray]:
    vals = inputs(order)
    return [vals[arg] for arg, _ in PROGRAMS[name][0]]


def needs_halide():
    """Skip the calling test when the optional Halide backend is absent."""
    return pytest.importorskip(
        "halide", reason="the Halide backend needs the optional extra einjit[halide]")
