"""Pointwise activations beyond the core operation set, each with its backprop in `%cd`.

`softplus` is written as `relu(x) + log1p(exp(-|x|))` so that it neither overflows for large
positive inputs nor loses the linear part; its derivative, the sigmoid, is `recip(1 + exp(-x))`,
which saturates to 0 or 1 without producing NaN. `gelu` is the exact (erf) form, as PyTorch's
default, and `gelu(x, approximate="tanh")` the tanh form GPT-2 was trained with
(`0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, PyTorch's `approximate="tanh"`), computed
as `x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))`, the same function through one `exp`. Templates
with a constant (a slope, clip bounds) are parsed once per constant.

Both GELUs are `x * gate(x)`, the gate (`Phi(x)`, or the sigmoid) a non-differentiable tensor
of its own, the `gelu`'s second argument, so that the backprop reads the gate the forward
computed instead of evaluating it again: the gate's `exp` and division (or `erf`) then run
once per element in a training step. Read by both, the gate is stored between them; in a
forward-only routine it is read once and virtualization inlines it, as if it were not there.
"""

from __future__ import annotations

import functools
import math

from einjit.tensor.notation import Template, make_op
from einjit.tensor.operation import Like, as_tensor
from einjit.tensor.tensor import GradSpec, Tensor, TensorError

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
}

_GELU_GATES = {"none": Template(f"t =: 0.5 + 0.5 * erf({_SQRT1_2!r} * t1)"),
               "tanh": Template(f"t =: {_GELU_SIGMOID}")}
"""The gate `s` of `gelu(x) = x * s(x)` for each approximation."""
_GELU = Template("t =: t1 * t2")
_GELU_GRADS = {
    "none": Template(f"g1 =+ g * (t2 + t1 * ({_INV_SQRT_2PI!r} * exp(-0.5 * (t1 * t1))))"),
    "tanh": Template(f"g1 =+ g * (t2 + t1 * t2 * (1 - t2) * {2 * _SQRT_2_PI!r} "
                     f"* (1 + {3 * _GELU_CUBIC!r} * (t1 * t1)))"),
}
"""`d/dx x s(x) = s + x s'(x)`, with `t2` the stored gate `s`: `Phi' = exp(-x^2 / 2) / sqrt(2 pi)`,
and the sigmoid's `s' = s (1 - s) du/dx`, which needs no `exp` of its own."""


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
    approximation (`approximate="tanh"`), as PyTorch's `gelu`. The result's arguments are `x`
    and the gate (`gelu_gate`, see the module docstring)."""
    form = _GELU_GATES.get(approximate) if isinstance(approximate, str) else None
    if form is None:
        raise TensorError(f"einjit: gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    xt = as_tensor(x)
    gate = make_op("gelu_gate", [xt], logic=None, forward=form, backprop=None, grad_spec=GradSpec.PROHIBIT_GRAD)
    return make_op("gelu", [xt, gate], logic=None, forward=_GELU, backprop=_GELU_GRADS[approximate], label=label)


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
