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

__all__ = ["fma_narrow", "fma_rounded_once", "fmaf_array"]

_Scalar = Callable[[object, object, object], object]


def fma_rounded_once(dtype: np.dtype) -> _Scalar:
    """`a * b + c` rounded once to `dtype`, for scalars of a floating `dtype`."""
    dt = dtype.type
    if dtype.itemsize >= 8:
        return lambda a, b, c: dt(_fma_double(float(a), float(b), float(c)))  # type: ignore[arg-type]
    return lambda a, b, c: dt(fma_narrow(float(a), float(b), float(c)))  # type: ignore[arg-type]


def fmaf_array(a: object, b: object, c: object) -> np.ndarray:
    """C's `fmaf` on float32 arrays: `fma_narrow` cell by cell, in NumPy."""
    a64, b64, c64 = (np.asarray(v, dtype=np.float64) for v in (a, b, c))
    p = a64 * b64
    s = p + c64
    back = s - p
    error = (p - (s - back)) + (c64 - back)
    even = (s.view(np.uint64) & np.uint64(1)) == 0
    s = np.where((error != 0) & np.isfinite(s) & even, np.nextafter(s, np.copysign(np.inf, error)), s)
    return s.astype(np.float32)


def fma_narrow(a: float, b: float, c: float) -> float:
    """`a * b + c` for float32 (or narrower) values held in Python floats, rounded to odd in
    float64: converting the result to the narrow format then rounds it once. Python floats,
    not NumPy scalars: the interpreter calls it cell by cell, where a NumPy scalar operation
    costs microseconds."""
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
