"""einjit's own math functions in generated C: `exp` in single (and half) precision renders as
the inline `einjit_expf` (`ir/own_exp.py` says why and how), not the math library's `expf`.

The function is written from `own_exp`'s constants, so the C and the interpreter's NumPy steps
cannot drift apart. It is branch-free and always inlined: in a loop gcc vectorizes it with the
loop (8 lanes under AVX2), outside one it is the same operations on one lane, so a value's
bits no longer depend on whether its loop was vectorized, clipped or put on threads.
"""

from __future__ import annotations

import re

from einjit.ir import ops, own_exp


def _hex(value) -> str:
    """A float32 constant as an exact C literal (an integer in decimal)."""
    if float(value).is_integer():
        return f"{float(value):.1f}f"
    return re.sub(r"\.?0*p", "p", float(value).hex()) + "f"


def _expf() -> str:
    k = own_exp
    q = _hex(k.POLY[0])
    for c in k.POLY[1:]:
        q = f"__builtin_fmaf({q}, r, {_hex(c)})"
    return f"""\
/* Unop.EXP in single precision (ir/own_exp.py): the same float32 steps scalar and vectorized,
   within 1.02 ulp, inf/NaN/overflow/subnormal results without branches. */
{{q}} __attribute__((always_inline)) float einjit_expf(float x) {{{{
  const float xc = {_hex(k.LOWER)} > x ? {_hex(k.LOWER)} : x;
  const float t = __builtin_fmaf(xc, {_hex(k.LOG2E)}, {_hex(k.SHIFTER)});
  const float n = t - {_hex(k.SHIFTER)};
  const float r = __builtin_fmaf(n, {_hex(k.NEG_LN2_LO)}, __builtin_fmaf(n, {_hex(k.NEG_LN2_HI)}, xc));
  const float q = {q};
  const float p = 1.0f + __builtin_fmaf(r * r, q, r);
  unsigned int u;
  __builtin_memcpy(&u, &t, 4);
  u -= {k.SHIFTER_BITS - k.BIAS:#x}u;
  const unsigned int e1 = ((u >> 1) - 1u) << 23, e2 = (u - (u >> 1) - 1u) << 23;
  float s1, s2;
  __builtin_memcpy(&s1, &e1, 4);
  __builtin_memcpy(&s2, &e2, 4);
  return x > {_hex(k.UPPER)} ? __builtin_inff() : (p * s1) * s2;
}}}}
"""


HELPERS = {"expf": _expf()}
"""Helper texts (formatted with `q`, the helper qualifier), by name."""


def template(op: ops.Unop, prec: ops.Prec) -> tuple[str, str] | None:
    """The C template and helper for `op` in `prec` where einjit renders its own function;
    None where the math library's function is used."""
    if op is ops.Unop.EXP and prec in (ops.single, ops.half):
        return "einjit_expf({0})", "expf"
    return None
