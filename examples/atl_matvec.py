"""The ATL tensor language: a matrix-vector product, typechecked, normalized, interpreted, and
compiled through einjit's C backend (and Halide, when installed).

    python examples/atl_matvec.py
"""

import numpy as np

from einjit.atl import Func, Gen, R, Sum, TTensor, Var

n = 3
A, x = Var("A"), Var("x")
Ax = Gen("i", n, Sum("j", n, A["i", "j"] * x["j"]))
f = Func([("A", TTensor(n, TTensor(n, R))), ("x", TTensor(n, R))], Ax)

Av = np.array([[5.0, 2.0, 0.0], [2.2, 0.0, 4.5], [0.0, 6.1, 3.3]])
xv = np.array([4.0, 7.0, 1.0])
print("interpreter:", f.interpret(Av, xv))
print("einjit C   :", f.jit_exec(Av, xv, backend="einjit"))
try:
    print("Halide     :", f.jit_exec(Av, xv, backend="halide"))
except ImportError as e:
    print("Halide     : not installed:", e)
print("NumPy      :", Av @ xv)
