"""Pointwise activations beyond the core operation set, each with its backprop in `%cd`.

`softplus` is written as `relu(x) + log1p(exp(-|x|))` so that it neither overflows for large
positive inputs nor loses the linear part; its derivative, the sigmoid, is `recip(1 + exp(-x))`,
which saturates to 0 or 1 without producing NaN. `gelu` is the exact (erf) form, as PyTorch's
default, and `gelu(x, approximate="tanh")` the tanh form GPT-2 was trained with
(`0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, PyTorch's `approximate="tanh"`), computed
as `x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))`, the same function through one `exp`. Templates
with a constant (a slope, clip bounds) are parsed once per constant.
"""

from __future__ import annotations

import functools
import math

from einjit.tensor.notation import Template, make_op
from einjit.tensor.operation import Like, as_tensor
from einjit.tensor.tensor import Tensor, TensorError

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715
GELU_APPROXIMATIONS = ("none", "tanh")
_GELU_SIGMOID = f"recip(1 + exp({-2 * _SQRT_2_PI!r} * (t1 + {_GELU_CUBIC!r} * (t1 * t1 * t1))))"
"""`0.5 (1 + tanh(u)) = sigmoid(2u)`: the tanh form's gate through one `exp`, which gcc
vectorizes (einjit's inline `exp`; libmvec's in double) at about twice the rate of `tanh`
(the transformer's MLP applies it to 4 x d_model values per token, forward and backward).
For large negative `u` the `exp` overflows to infinity and the gate is exactly 0, as `tanh` saturates to -1."""

_UNARY = {
    "abs": (Template("t =: abs(t1)"), Template("g1 =+ where(t1 < 0, -g, g)")),
    "softplus": (Template("t =: relu(t1) + log1p(exp(-abs(t1)))"), Template("g1 =+ g * recip(1 + exp(-t1))")),
    "gelu": (Template(f"t =: t1 * (0.5 + 0.5 * erf({_SQRT1_2!r} * t1))"),
             Template(f"g1 =+ g * ((0.5 + 0.5 * erf({_SQRT1_2!r} * t1)) "
                      f"+ t1 * ({_INV_SQRT_2PI!r} * exp(-0.5 * (t1 * t1))))")),
    "gelu_tanh": (Template(f"t =: t1 * {_GELU_SIGMOID}"),
                  Template(f"g1 =+ g * ({_GELU_SIGMOID} + t1 * {_GELU_SIGMOID} * (1 - {_GELU_SIGMOID}) * "
                           f"{2 * _SQRT_2_PI!r} * (1 + {3 * _GELU_CUBIC!r} * (t1 * t1)))")),
}


def _unary(name: str, x: Like, label) -> Tensor:
    fwd, bwd = _UNARY[name]
    return make_op(name, [as_tensor(x)], logic=None, forward=fwd, backprop=bwd, label=label)


def abs(x: Like, *, label=None) -> Tensor:
    """`|x|`; the gradient at 0 is taken as the right derivative, `g`."""
    return _unary("abs", x, label)


def softplus(x: Like, *, label=None) -> Tensor:
    """`log(1 + exp(x))`, stable for inputs of any magnitude."""
    return _unary("softplus", x, label)


def gelu(x: Like, approximate: str = "none", *, label=None) -> Tensor:
    """`x * Phi(x)` with the normal CDF `Phi` from `erf` (`approximate="none"`), or its tanh
    approximation (`approximate="tanh"`), as PyTorch's `gelu`."""
    match approximate:
        case "none":
            return _unary("gelu", x, label)
        case "tanh":
            fwd, bwd = _UNARY["gelu_tanh"]
            return make_op("gelu", [as_tensor(x)], logic=None, forward=fwd, backprop=bwd, label=label)
    raise TensorError(f"einjit: gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


@functools.cache
def _leaky(slope: float) -> tuple[Template, Template]:
    return (Template(f"t =: where(t1 < 0, {slope!r} * t1, t1)"),
            Template(f"g1 =+ where(t1 < 0, {slope!r} * g, g)"))


def leaky_relu(x: Like, negative_slope: float = 0.01, *, label=None) -> Tensor:
    fwd, bwd = _leaky(float(negative_slope))
    return make_op("leaky_relu", [as_tensor(x)], logic=None, forward=fwd, backprop=bwd, label=label)


@functools.cache
def _clip(lo: float, hi: float) -> tuple[Template, Template]:
    return (Template(f"t =: min(max(t1, {lo!r}), {hi!r})"),
            Template(f"g1 =+ where(t1 < {lo!r}, 0, where({hi!r} < t1, 0, g))"))


def clip(x: Like, lo: float, hi: float, *, label=None) -> Tensor:
    """`x` limited to `[lo, hi]`; the gradient passes inside the closed interval."""
    if not lo <= hi:
        raise TensorError(f"einjit: clip needs lo <= hi, got lo={lo} hi={hi}")
    fwd, bwd = _clip(float(lo), float(hi))
    return make_op("clip", [as_tensor(x)], logic=None, forward=fwd, backprop=bwd, label=label)


_RSQRT = (Template("t =: recip(sqrt(t1))"), Template("g1 =- (g * t) / (t1 + t1)"))


def rsqrt(x: Like, *, label=None) -> Tensor:
    """`1 / sqrt(x)`. Its templates hold no number: a nested number is a one-cell tensor whose
    output axis would be broadcast into an argument that has none (a per-row statistic)."""
    fwd, bwd = _RSQRT
    return make_op("rsqrt", [as_tensor(x)], logic=None, forward=fwd, backprop=bwd, label=label)
