"""einjit's own single-precision `exp`: one sequence of float32 operations that the C backend
renders as an inline function (`backends/c_math.py`) and the interpreter runs in NumPy.

Why not the math library's `expf`: with libmvec, gcc turns an `expf` in a loop it vectorizes
into glibc's vector `_ZGVdN8v_expf` and a scalar one into the scalar `expf`, and the two differ
by an ulp on some inputs. Whether gcc vectorizes depends on the surroundings (clipped loops,
a nest put on threads), so the same model gave different bits at 1 and 2 threads. Here the
scalar and vector forms are the same arithmetic: every step is a float32 add, multiply, fused
multiply-add (`fmaf`, rounded once), compare-select or integer bit operation, so gcc's vector
code, its scalar code and NumPy give the same bits. Accuracy over all 2^32 inputs
(`tests/backends/expf_check.c` run with stride 1): at most 1.014 ulp of the correctly rounded
result where it is a normal float, 0.75 units of 2^-149 where it is subnormal; the vector and
scalar forms agree on every input; infinities, NaN, overflow and underflow to zero are exact,
all without branches.

The steps: raise x below -104 to -104 (exp is 0 there in float32; a NaN passes), split
x = n ln2 + r with n = rint(x / ln2) (the 1.5 * 2^23 shifter rounds) and |r| <= ln2 / 2 (ln2 in
two float32 parts, each product fused), exp(r) = 1 + r + r^2 q(r) with q a degree-4 polynomial
fitted for a relative error of 0.05 ulp, and scale by 2^n as 2^floor(n/2) * 2^(n - floor(n/2)):
the first product is exact and the second rounds once, into the subnormals or to infinity where
the result lies there. Above 89 the result is selected as +inf (exp overflows from 88.72 on;
the steps are only meaningful up to 89). Two selects, each a compare and a blend: a clamp to
[-104, 89] as two nested selects became 9 vector instructions once gcc merged them (keeping
NaNs). Against libmvec's `_ZGVdN8v_expf` alone it runs at 0.97-1.08x; in the GELU step's
nests (compiled C timed side by side) 0.9x, the attention step 0.92-0.98x, softmax even.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from einjit.ir.fma import fma_narrow, fmaf_array

_f32 = np.float32

LOWER = _f32(-104.0)
UPPER = _f32(89.0)
LOG2E = _f32(float.fromhex("0x1.715476p+0"))
SHIFTER = _f32(float.fromhex("0x1.8p+23"))
NEG_LN2_HI = _f32(-float.fromhex("0x1.62e43p-1"))
NEG_LN2_LO = _f32(float.fromhex("0x1.05c61p-29"))
"""-ln2 as a float32 pair: -ln2 = NEG_LN2_HI + NEG_LN2_LO to 2^-54."""
POLY = tuple(_f32(float.fromhex(h)) for h in ("0x1.6a244cp-10", "0x1.1239d4p-7", "0x1.5558f2p-5",
                                              "0x1.555492p-3", "0x1.fffffcp-2"))
"""q(r)'s coefficients, highest degree first (Horner)."""
SHIFTER_BITS = 0x4B400000
"""The bit pattern of `SHIFTER`: the shifted sum's bits minus it are n."""
BIAS = 256
"""Added to n before the halving shift so that it acts on a non-negative integer."""

_ONE, _U1, _U23, _UOFFSET = _f32(1.0), np.uint32(1), np.uint32(23), np.uint32(SHIFTER_BITS - BIAS)
_FLOAT32 = struct.Struct("f")
_LOWER, _UPPER, _LOG2E, _SHIFTER, _NEG_LN2_HI, _NEG_LN2_LO = (
    float(v) for v in (LOWER, UPPER, LOG2E, SHIFTER, NEG_LN2_HI, NEG_LN2_LO))
_POLY = tuple(float(c) for c in POLY)


def _round32(v: float) -> float:
    """A double rounded to the nearest float32 (subnormals included), as a double."""
    return _FLOAT32.unpack(_FLOAT32.pack(v))[0]


def fma_scalar(a: float, b: float, c: float) -> float:
    """C's `fmaf` on float32 values held in Python floats (the interpreter's cell by cell path)."""
    return _round32(fma_narrow(a, b, c))


def _expf_scalar(x: float) -> float:
    """`expf`'s steps on one value in Python floats. The float32 adds and multiplies are done
    in double and rounded to float32 (exact for one operation: 53 >= 2 * 24 + 2); n - SHIFTER
    and the products by powers of two are exact, so the scaling is one `ldexp` rounded once."""
    if x > _UPPER:
        return math.inf
    xc = _LOWER if _LOWER > x else x
    t = fma_scalar(xc, _LOG2E, _SHIFTER)
    n = t - _SHIFTER
    r = fma_scalar(n, _NEG_LN2_LO, fma_scalar(n, _NEG_LN2_HI, xc))
    q = _POLY[0]
    for c in _POLY[1:]:
        q = fma_scalar(q, r, c)
    p = _round32(1.0 + fma_scalar(_round32(r * r), q, r))
    try:
        return _round32(math.ldexp(p, int(n)))
    except OverflowError:
        return math.inf


def _steps(xc, fma):
    t = fma(xc, LOG2E, SHIFTER)
    n = t - SHIFTER
    r = fma(n, NEG_LN2_LO, fma(n, NEG_LN2_HI, xc))
    q = POLY[0]
    for c in POLY[1:]:
        q = fma(q, r, c)
    p = _ONE + fma(r * r, q, r)
    u = t.view(np.uint32) - _UOFFSET
    half = u >> _U1
    s1 = ((half - _U1) << _U23).view(np.float32)
    s2 = ((u - half - _U1) << _U23).view(np.float32)
    return (p * s1) * s2


def expf(x):
    """exp of float32 values (a NumPy float32 scalar or array), bit for bit einjit's C
    `einjit_expf`; the selects are C's (a NaN passes both)."""
    if isinstance(x, np.float32):
        return x + _ONE if x != x else _f32(_expf_scalar(float(x)))
    x = np.asarray(x, dtype=np.float32)
    return np.where(x > UPPER, np.float32(np.inf), _steps(np.where(LOWER > x, LOWER, x), fmaf_array))


def exp(x):
    """`Unop.EXP`'s NumPy function: `expf` for float32 (and for float16, through float32 and
    rounded back, as C computes a `_Float16` exp), NumPy's `exp` otherwise."""
    if isinstance(x, np.float32):
        return expf(x)
    a = np.asarray(x)
    if a.dtype == np.float32:
        return expf(a)
    if a.dtype == np.float16:
        return expf(a.astype(np.float32)).astype(np.float16)
    return np.exp(x)
