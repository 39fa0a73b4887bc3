"""Numeric precisions and the fixed set of scalar operations of the IR.

Every operation carries three faces that must agree: its C syntax (used by the C and CUDA
renderers), its NumPy semantics (used by the reference interpreter) and, for operations that
can accumulate, its neutral element. Keeping them side by side in one table is what lets the
interpreter serve as the oracle for the backends.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from einjit.errors import EinjitError
from einjit.ir import own_exp


@dataclass(frozen=True, slots=True)
class Prec:
    """A numeric precision: how a tensor node's cells are stored and computed."""

    name: str
    dtype: np.dtype
    c_type: str
    is_float: bool

    def __repr__(self) -> str:
        return self.name

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def c_literal_suffix(self) -> str:
        return {"single": "f", "half": "f"}.get(self.name, "")

    @property
    def computed_in(self) -> "Prec":
        """The precision expressions stored in this one are computed in: bf16 is a storage
        format only (NumPy and C have no bf16 arithmetic), computed in single and rounded
        once, where it is stored; every other precision computes in itself."""
        return single if self.name == "bf16" else self

    @property
    def host_dtype(self) -> np.dtype:
        """The NumPy dtype the host sees the values in: bf16 cells, stored as their 16-bit
        patterns (`dtype` uint16), are read and written from NumPy as float32."""
        return np.dtype(np.float32) if self.name == "bf16" else self.dtype


byte = Prec("byte", np.dtype(np.uint8), "unsigned char", False)
int32 = Prec("int32", np.dtype(np.int32), "int", False)
int64 = Prec("int64", np.dtype(np.int64), "long long", False)
half = Prec("half", np.dtype(np.float16), "_Float16", True)
single = Prec("single", np.dtype(np.float32), "float", True)
double = Prec("double", np.dtype(np.float64), "double", True)
bf16 = Prec("bf16", np.dtype(np.uint16), "unsigned short", True)
"""bfloat16: the upper half of a float32 (8 exponent bits, 7 mantissa bits), stored as its bit
pattern (`einjit.ir.bf16`); loads widen exactly, stores round to nearest even."""

PRECISIONS: dict[str, Prec] = {p.name: p for p in (byte, int32, int64, half, single, double, bf16)}

_PREC_ALIASES: dict[str, Prec] = {
    **PRECISIONS, "float16": half, "float32": single, "float64": double, "uint8": byte, "bfloat16": bf16,
}


class PrecisionError(EinjitError, ValueError):
    """A precision given by a name or a NumPy dtype that einjit cannot store or compute in."""


def as_prec(spec: "Prec | str | np.dtype | type") -> Prec:
    """A precision from what a user naturally writes: a `Prec`, a name (`"single"`,
    `"float32"`, `"double"`, `"float64"`, `"half"`, `"float16"`, `"bf16"`, `"bfloat16"`, ...) or
    a NumPy dtype or scalar type (`np.float32`, `np.dtype("float64")`), so one spelling works
    everywhere. No NumPy dtype names bf16 (its storage dtype, uint16, is not a precision)."""
    if isinstance(spec, Prec):
        return spec
    if isinstance(spec, str):
        found = _PREC_ALIASES.get(spec.lower())
        if found is not None:
            return found
    try:
        dtype = np.dtype(spec)
    except TypeError:
        dtype = None
    if dtype is not None:
        for p in PRECISIONS.values():
            if p.dtype == dtype and p is not bf16:
                return p
    known = sorted(_PREC_ALIASES) + ["a NumPy dtype of one of them"]
    raise PrecisionError(f"einjit: unknown or unsupported precision {spec!r}; use one of {', '.join(known)}")


def _np_where(c, a, b):
    return np.where(c != 0, a, b)


def _np_erf(x):
    """NumPy has no erf; the interpreter is the oracle, not a hot path, so `math.erf` per cell."""
    arr = np.asarray(x)
    return np.vectorize(math.erf, otypes=[arr.dtype if arr.dtype.kind == "f" else np.float64])(arr)


class _OpFace:
    """What every operation enum shares: its value starts with (C template, NumPy function)."""

    # Provided by `enum.Enum`, which every subclass also derives from.
    name: str
    value: tuple[Any, ...]

    @property
    def c_template(self) -> str:
        return self.value[0]

    @property
    def numpy(self) -> Callable:
        return self.value[1]

    @property
    def c_int_template(self) -> str:
        """The C template on integer operands, where the floating-point one does not apply
        (`fmax`, `fmod`, `fma` are floating-point functions)."""
        return _C_INT_TEMPLATES.get(self, self.value[0])

    @property
    def symbol(self) -> str:
        return self.name.lower()

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class Unop(_OpFace, enum.Enum):
    """Unary scalar operations. The value tuple is (C template, NumPy function).

    NaN follows NumPy (and PyTorch): `relu(nan)` is NaN, as is `np.maximum(nan, 0)`; the C
    template tests `< 0` so a NaN, failing every comparison, passes through unchanged.
    """

    IDENTITY = ("{0}", lambda x: x)
    RELU = ("({0} < 0 ? 0 : {0})", lambda x: np.maximum(x, 0).astype(np.asarray(x).dtype))
    SATUR01 = ("({0} < 0 ? 0 : ({0} > 1 ? 1 : {0}))", lambda x: np.clip(x, 0, 1))
    EXP = ("exp{f}({0})", own_exp.exp)
    LOG = ("log{f}({0})", np.log)
    EXP2 = ("exp2{f}({0})", np.exp2)
    LOG2 = ("log2{f}({0})", np.log2)
    SIN = ("sin{f}({0})", np.sin)
    COS = ("cos{f}({0})", np.cos)
    SQRT = ("sqrt{f}({0})", np.sqrt)
    RECIP = ("(1 / {0})", lambda x: 1 / x)
    RECIP_SQRT = ("(1 / sqrt{f}({0}))", lambda x: 1 / np.sqrt(x))
    NEG = ("(-{0})", np.negative)
    TANH = ("tanh{f}({0})", np.tanh)
    NOT = ("({0} == 0 ? 1 : 0)", lambda x: (x == 0).astype(np.asarray(x).dtype))
    ABS = ("fabs{f}({0})", np.abs)
    ERF = ("erf{f}({0})", lambda x: _np_erf(x))
    LOG1P = ("log1p{f}({0})", np.log1p)


class Binop(_OpFace, enum.Enum):
    """Binary scalar operations: (C template, NumPy function, neutral element or None, %cd infix).

    `MAX` and `MIN` are NumPy's `maximum` and `minimum`, not C's `fmax`/`fmin`: a NaN on either
    side propagates (C's functions drop it), so a max or min reduction over data containing a
    NaN is NaN, as in NumPy and PyTorch. `x != x` is the NaN test; einjit never compiles with
    `-ffast-math`, which would fold it away. The C asks first whether only the second operand
    is a NaN (then it is the result, as in NumPy; with two NaNs the first is), else takes
    `b > a ? b : a`: the same value as `a >= b || a != a ? a : b` bit for bit (signed zeros
    and NaN payloads included), but gcc compiles that test to `maxss`/`minss` behind a branch
    that NaN-free data always predicts, where the other form was two data-dependent branches
    (a softmax's last max folds, mispredicted half the time); vectorized, both are
    compares and blends.
    """

    ADD = ("({0} + {1})", np.add, 0.0, "+")
    SUB = ("({0} - {1})", np.subtract, 0.0, "-")
    MUL = ("({0} * {1})", np.multiply, 1.0, "*")
    DIV = ("({0} / {1})", np.divide, 1.0, "/")
    TO_POW_OF = ("pow{f}({0}, {1})", np.power, 1.0, "**")
    RELU_GATE = ("({0} > 0 ? {1} : 0)", lambda a, b: np.where(a > 0, b, 0), 1.0, "-?/")
    SATUR01_GATE = ("(({0} > 0 && {0} < 1) ? {1} : 0)", lambda a, b: np.where((a > 0) & (a < 1), b, 0), None, "-?^")
    MAX = ("(({1} != {1} && {0} == {0}) ? {1} : ({1} > {0} ? {1} : {0}))", np.maximum, -math.inf, "^^")
    MIN = ("(({1} != {1} && {0} == {0}) ? {1} : ({1} < {0} ? {1} : {0}))", np.minimum, math.inf, "vv")
    MOD = ("fmod{f}({0}, {1})", np.fmod, None, "%")
    CMPLT = ("({0} < {1})", lambda a, b: np.less(a, b), None, "<")
    CMPEQ = ("({0} == {1})", lambda a, b: np.equal(a, b), None, "==")
    CMPNE = ("({0} != {1})", lambda a, b: np.not_equal(a, b), None, "<>")
    AND = ("({0} && {1})", lambda a, b: np.logical_and(a != 0, b != 0), 1.0, "&&")
    OR = ("({0} || {1})", lambda a, b: np.logical_or(a != 0, b != 0), 0.0, "||")
    ARG1 = ("{0}", lambda a, b: np.broadcast_arrays(a, b)[0], None, "-@>")
    ARG2 = ("{1}", lambda a, b: np.broadcast_arrays(a, b)[1], None, "-/>")

    @property
    def neutral(self) -> float | None:
        """The neutral element when used as an accumulation operator, None if it has none."""
        return self.value[2]

    @property
    def infix(self) -> str:
        return self.value[3]


class Ternop(_OpFace, enum.Enum):
    """Ternary scalar operations: (C template, NumPy function)."""

    WHERE = ("({0} != 0 ? {1} : {2})", _np_where)
    FMA = ("fma{f}({0}, {1}, {2})", lambda a, b, c: a * b + c)
    EQ_GATE = ("({0} == {1} ? {2} : 0)", lambda a, b, c: np.where(np.equal(a, b), c, 0))


_C_INT_TEMPLATES: dict[_OpFace, str] = {
    Binop.MAX: "({0} > {1} ? {0} : {1})",
    Binop.MIN: "({0} < {1} ? {0} : {1})",
    Binop.MOD: "({0} % {1})",
    Ternop.FMA: "({0} * {1} + {2})",
}


class VecUnop(enum.Enum):
    """Operations producing several consecutive cells from one argument (`Set_from_vec`).

    `UNIFORM_HASH` turns one counter into `length` pseudo-random numbers in [0, 1): a
    counter-based generator (splitmix64) so every backend can produce identical streams.
    """

    UNIFORM_HASH = "uniform_hash"

    @property
    def symbol(self) -> str:
        return self.value


_SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """One step of the splitmix64 finalizer on a 64-bit unsigned integer."""
    z = (x + _SPLITMIX_GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def uniform_hash(counter: int, length: int) -> list[float]:
    """The reference semantics of `VecUnop.UNIFORM_HASH`: `length` uniforms in [0, 1)."""
    base = (int(counter) * length) & _MASK64
    return [(splitmix64((base + k) & _MASK64) >> 11) * (1.0 / (1 << 53)) for k in range(length)]


def apply_unop(op: Unop, x):
    with np.errstate(all="ignore"):
        return op.numpy(x)


def apply_binop(op: Binop, a, b):
    with np.errstate(all="ignore"):
        return op.numpy(a, b)


def apply_ternop(op: Ternop, a, b, c):
    with np.errstate(all="ignore"):
        return op.numpy(a, b, c)
