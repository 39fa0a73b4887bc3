"""A fused multiply-add on scalars, rounded once, as C's `fma` / `fmaf` compute it.

The reference interpreter and the simplifier's constant folding must give the bits the
compiled `fma` gives, or differential tests compare two different functions. NumPy has no
fused multiply-add (and `math.fma` arrives only with Python 3.13), and the obvious emulations
round twice:
- float32 (and narrower) in float64: the product is exact, but the float64 sum is rounded and
  then rounded again to float32, which is wrong when the first rounding lands on a float32
  midpoint. Rounding the float64 sum to odd (an inexact sum keeps an odd last bit) makes the
  second rounding correct, since float64 has more than two bits to spare.
- float64 in float64: the product itself is rounded. The exact value is a ratio of integers
  (every double is an integer over a power of two), and Python's integer division rounds
  correctly.
"""

from __future__ import annotations

import math
import struct
from typing import Callable

import numpy as np

__all__ = ["fma_rounded_once"]

_Scalar = Callable[[object, object, object], object]


def fma_rounded_once(dtype: np.dtype) -> _Scalar:
    """`a * b + c` rounded once to `dtype`, for scalars of a floating `dtype`."""
    dt = dtype.type
    if dtype.itemsize >= 8:
        return lambda a, b, c: dt(_fma_double(float(a), float(b), float(c)))  # type: ignore[arg-type]
    return lambda a, b, c: dt(_fma_narrow(float(a), float(b), float(c)))  # type: ignore[arg-type]


def _fma_narrow(a: float, b: float, c: float) -> float:
    """The sum rounded to odd in float64: narrow products are exact in float64."""
    p = a * b
    s = p + c
    if not math.isfinite(s):
        return s
    back = s - p
    error = (p - (s - back)) + (c - back)
    if error != 0 and not struct.unpack("<q", struct.pack("<d", s))[0] & 1:
        s = math.nextafter(s, math.inf if error > 0 else -math.inf)
    return s


def _fma_double(a: float, b: float, c: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)):
        return a * b + c
    if not math.isfinite(c):
        return c  # the exact product is finite even where `a * b` overflows
    na, da = a.as_integer_ratio()
    nb, db = b.as_integer_ratio()
    nc, dc = c.as_integer_ratio()
    num, den = na * nb, da * db
    if den >= dc:
        num += nc * (den // dc)
    else:
        num, den = num * (dc // den) + nc, dc
    if num == 0:
        # an exact zero is +0 unless both terms are zeros whose signs say otherwise
        return a * b + c if c == 0 and (a == 0 or b == 0) else 0.0
    try:
        return num / den
    except OverflowError:
        return math.inf if num > 0 else -math.inf
