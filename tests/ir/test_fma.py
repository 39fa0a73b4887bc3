"""A fused multiply-add rounds once, in the interpreter and in constant folding as in C: the
cases where emulating it in wider arithmetic rounds twice, checked against hand-computed values,
the C library's `fma`/`fmaf`, and gcc-compiled code."""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np
import pytest

from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.fma import fma_narrow, fma_rounded_once, fmaf_array
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.passes import simplify
from einjit.ir.tnode import Tnode

F32, F64 = fma_rounded_once(np.dtype(np.float32)), fma_rounded_once(np.dtype(np.float64))
# (a, b, c, fma(a, b, c)) where a * b + c computed in the next wider format and rounded is wrong
SINGLE_CASES = [
    # 1 + 2^-11 + 2^-24 is a float32 midpoint; the 2^-80 above it decides the rounding, but a
    # float64 sum drops it and the tie then rounds to even, down
    (1 + 2**-12, 1 + 2**-12, 2.0**-80, 1 + 2**-11 + 2**-23),
    (1 + 2**-12, -(1 + 2**-12), -(2.0**-80), -(1 + 2**-11 + 2**-23)),
]
DOUBLE_CASES = [
    (0.1, 10.0, -1.0, 2.0**-54),  # the rounding of 0.1 * 10 hides the 2^-54
    (1e308, 2.0, -1.7e308, (1e308 - 1.7e308 / 2) * 2),  # the product overflows, the fused result doesn't
    (1e308, 10.0, -math.inf, -math.inf),
]


def _libm():
    path = ctypes.util.find_library("m")
    if path is None:
        pytest.skip("no C math library to compare with")
    libm = ctypes.CDLL(path)
    for name, ct in (("fmaf", ctypes.c_float), ("fma", ctypes.c_double)):
        f = getattr(libm, name)
        f.restype, f.argtypes = ct, [ct] * 3
    return libm


@pytest.mark.parametrize("a,b,c,want", SINGLE_CASES)
def test_single_rounds_once_where_double_arithmetic_rounds_twice(a, b, c, want):
    a, b, c = np.float32(a), np.float32(b), np.float32(c)
    assert np.float32(np.float64(a) * np.float64(b) + np.float64(c)) != np.float32(want)
    assert F32(a, b, c) == np.float32(want)
    assert np.float32(fma_narrow(float(a), float(b), float(c))) == np.float32(want)
    np.testing.assert_array_equal(fmaf_array([a, -a], [b, b], [c, -c]), np.float32([want, -want]))


@pytest.mark.parametrize("a,b,c,want", DOUBLE_CASES)
def test_double_rounds_once(a, b, c, want):
    got = F64(a, b, c)
    assert got == want and isinstance(got, np.float64)


def test_agrees_with_the_c_library_on_random_and_special_operands():
    libm = _libm()
    rng = np.random.default_rng(7)
    n = 4000
    for width, ours, theirs, spread in ((np.float32, F32, libm.fmaf, 40), (np.float64, F64, libm.fma, 400)):
        a, b, c = [(rng.standard_normal(n) * 2.0 ** rng.integers(-spread, spread, n)).astype(width) for _ in range(3)]
        c[::3] = -(a[::3].astype(np.float64) * b[::3]).astype(width)  # cancellation: the low bits decide
        specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.5, np.finfo(width).max,
                             -np.finfo(width).max, np.finfo(width).smallest_subnormal, np.finfo(width).tiny],
                            dtype=width)
        grid = np.array(np.meshgrid(specials, specials, specials)).reshape(3, -1)
        for x, y, z in zip(np.concatenate([a, grid[0]]), np.concatenate([b, grid[1]]),
                           np.concatenate([c, grid[2]]), strict=True):
            with np.errstate(all="ignore"):
                want, got = width(theirs(x, y, z)), ours(x, y, z)
            assert (np.isnan(want) and np.isnan(got)) or (want == got and np.signbit(want) == np.signbit(got)), \
                (width.__name__, x, y, z, want, got)


@pytest.mark.parametrize("prec,cases", [(ops.single, SINGLE_CASES), (ops.double, DOUBLE_CASES[:2])])
def test_the_interpreter_and_gcc_give_the_same_bits(prec, cases):
    n = len(cases)
    a, b, c, out = (Tnode(name, (n,), prec) for name in ("a", "b", "c", "out"))
    i = get_symbol("i")
    at = (Iterator(i),)
    code = ll.ForLoop(i, 0, n - 1, ll.Set(out, at, ll.Ternop(ops.Ternop.FMA, ll.Get(a, at), ll.Get(b, at),
                                                              ll.Get(c, at))))
    inputs = {tn: np.array([case[k] for case in cases], dtype=prec.dtype) for k, tn in enumerate((a, b, c))}
    want = np.array([case[3] for case in cases], dtype=prec.dtype)
    interpreted = interpret.run(code, {tn: v.copy() for tn, v in inputs.items()})[out]
    compiled = run_once(code, inputs, name="fma", context=CcBackend().init("fma")).array(out)
    np.testing.assert_array_equal(interpreted, want)
    np.testing.assert_array_equal(compiled, want)


def test_constant_folding_rounds_once():
    fma = ll.Ternop(ops.Ternop.FMA, ll.Constant(0.1), ll.Constant(10.0), ll.Constant(-1.0))
    assert simplify.simplify_scalar(fma, ops.double) == ll.Constant(2.0**-54)
    single = ll.Ternop(ops.Ternop.FMA, *(ll.Constant(float(v)) for v in SINGLE_CASES[0][:3]))
    assert simplify.simplify_scalar(single, ops.single) == ll.Constant(float(np.float32(SINGLE_CASES[0][3])))
