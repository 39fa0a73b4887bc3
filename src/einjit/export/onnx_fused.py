"""Softmax, log-softmax and layer norm recognized in an einjit graph, so `export_onnx` writes
them as the ONNX operators `Softmax`, `LogSoftmax` and `LayerNormalization` rather than as the
primitives einjit builds them from; and which form of GELU a `gelu` tensor computes.

einjit has no softmax or layer-norm operation: `ej.softmax` is `e / sum(e)` with
`e = exp(x - max(x))`, `ej.log_softmax` is `s - log(sum(exp(s)))` with `s = x - max(x)`,
`nn.LayerNorm` is `(x - mean) * rsqrt(mean(sq + eps)) * gamma + beta`
with `sq = (x - mean)^2`, and `onnx_load`'s LayerNormalization the same with
`mean(sq) + eps`, its means kept as size-1 axes. Each mean is a sum of `y * (1/N)`.
Recognition follows the tensors' operations and projections — which axes a reduction sums and
which axes a broadcast argument lacks — never their labels, so a composition built by hand
the same way is recognized too, and anything else (another axis order, a reduction over other
axes) is left to the primitives, which compute the same values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from einjit.ir import assignments as asg
from einjit.ir import bf16, ops
from einjit.ir.indexing import FixedIdx, Iterator, Symbol
from einjit.tensor.tensor import Tensor

_SUMS = ("einsum", "sum")


@dataclass(frozen=True)
class Fused:
    """`op` computed from `x` over its axes `axes` (positions in `x.dims`); a layer norm's
    `scale` and `bias` (None: 1 and 0) and `epsilon`."""

    op: str
    x: Tensor
    axes: tuple[int, ...]
    scale: Tensor | None = None
    bias: Tensor | None = None
    epsilon: float = 0.0

    @property
    def inputs(self) -> list[Tensor]:
        return [t for t in (self.x, self.scale, self.bias) if t is not None]


def _entries(idcs, dims) -> list[Symbol | None] | None:
    """Each axis's iterator symbol, or None for a size-1 axis read at index 0; None overall if
    some axis is indexed otherwise (an affine window, another fixed index)."""
    out: list[Symbol | None] = []
    for idx, d in zip(idcs, dims, strict=True):
        match idx:
            case Iterator(s):
                out.append(s)
            case FixedIdx(0) if d == 1:
                out.append(None)
            case _:
                return None
    return out


def _projections(t: Tensor):
    return None if t.projections is None else t.projections.force()


def _same_layout(t: Tensor, k: int) -> bool:
    """Child `k` is read as `t` is laid out: same iterators, same order."""
    p = _projections(t)
    return p is not None and _entries(p.project_lhs, p.lhs_dims) is not None \
        and tuple(p.project_rhs[k]) == tuple(p.project_lhs)


@dataclass(frozen=True)
class _Axes:
    """How a value lacking some axes of a full tensor lines up with it: `missing`, the full
    tensor's axes it lacks; `at`, the full tensor's axes it has, in order; `kept`, the
    positions of its own dims that carry them (its other dims are size-1 axes). Size-1 axes of
    the full tensor, read at index 0, are in neither `missing` nor `at`: reducing them or not
    is the same."""

    missing: frozenset[int]
    at: tuple[int, ...]
    kept: tuple[int, ...]


def _sum_reduction(r: Tensor, ops_: tuple[str, ...] = _SUMS) -> tuple[Tensor, _Axes] | None:
    """`r` reduces its one child (the full tensor) over some axes, keeping the others in order."""
    if r.op_label not in ops_ or len(r.children) != 1 or (p := _projections(r)) is None:
        return None
    child = _entries(p.project_rhs[0], p.rhs_dims[0])
    out = _entries(p.project_lhs, p.lhs_dims)
    if child is None or out is None:
        return None
    syms = [s for s in child if s is not None]
    out_syms = [s for s in out if s is not None]
    if len(set(syms)) != len(syms) or [s for s in syms if s in out_syms] != out_syms:
        return None
    return r.children[0], _Axes(frozenset(k for k, s in enumerate(child) if s is not None and s not in out_syms),
                                tuple(k for k, s in enumerate(child) if s is not None and s in out_syms),
                                tuple(k for k, s in enumerate(out) if s is not None))


def _broadcast(t: Tensor, op: str) -> tuple[Tensor, Tensor, _Axes] | None:
    """`t = full op part`: `full` read as `t` is laid out, `part` lacking some of its axes."""
    if t.op_label != op or len(t.children) != 2 or not _same_layout(t, 0):
        return None
    p = _projections(t)
    lhs = _entries(p.project_lhs, p.lhs_dims)
    part = _entries(p.project_rhs[1], p.rhs_dims[1])
    if lhs is None or part is None:
        return None
    syms = [s for s in part if s is not None]
    at = [lhs.index(s) for s in syms if s in lhs]
    if len(at) != len(syms) or at != sorted(set(at)):
        return None
    missing = frozenset(k for k, s in enumerate(lhs) if s is not None and s not in syms)
    kept = tuple(k for k, s in enumerate(part) if s is not None)
    return t.children[0], t.children[1], _Axes(missing, tuple(at), kept)


def _scalar(t: Tensor) -> float | None:
    """The value of a one-cell constant leaf (a number, an array literal), not a parameter."""
    if t.children or t.is_param or t.op_label == "input" or math.prod(t.dims) != 1:
        return None
    arr = t.value_tn.array
    if arr is not None:
        return float(np.asarray(bf16.as_values(arr, t.value_tn.prec)).reshape(-1)[0])
    match t.own_forward:
        case asg.Fetch(_, asg.FetchConstant() as fill):
            return float(fill.number())
    return None


def _with_scalar(t: Tensor, op: str) -> tuple[Tensor, float] | None:
    """`t = y op c` for a constant `c`, `y` read as `t` is laid out."""
    if t.op_label != op or len(t.children) != 2 or not _same_layout(t, 0):
        return None
    c = _scalar(t.children[1])
    return None if c is None else (t.children[0], c)


def _mean(t: Tensor) -> tuple[Tensor, _Axes] | None:
    """`t = sum(y * (1/N))` over N cells of `y`: `reductions.mean` of a partial reduction."""
    r = _sum_reduction(t)
    if r is None or (scaled := _with_scalar(r[0], "*")) is None:
        return None
    y, c = scaled
    if not math.isclose(c * math.prod(y.dims[k] for k in r[1].missing), 1.0, rel_tol=1e-6):
        return None
    return y, r[1]


def _shifted(t: Tensor, axes: _Axes) -> Tensor | None:
    """`t = x - max(x)` over `axes`: x."""
    shift = _broadcast(t, "-")
    if shift is None or shift[2] != axes:
        return None
    x, peak, _ = shift
    m = _sum_reduction(peak, ("max",))
    return x if m is not None and m[0] is x and m[1] == axes else None


def _exp_sum(total: Tensor, axes: _Axes) -> Tensor | None:
    """`total = sum(exp(y))` over `axes`: the `exp(y)` tensor."""
    s = _sum_reduction(total)
    if s is None or s[1] != axes:
        return None
    e = s[0]
    return e if e.op_label == "exp" and len(e.children) == 1 and _same_layout(e, 0) else None


def softmax(t: Tensor) -> Fused | None:
    """`t = e / sum(e)`, `e = exp(x - max(x))`, over one axis of `x`."""
    div = _broadcast(t, "/")
    if div is None or len(div[2].missing) != 1:
        return None
    e, total, axes = div
    if _exp_sum(total, axes) is not e:
        return None
    x = _shifted(e.children[0], axes)
    return None if x is None else Fused("Softmax", x, tuple(axes.missing))


def log_softmax(t: Tensor) -> Fused | None:
    """`t = s - log(sum(exp(s)))`, `s = x - max(x)`, over one axis of `x`."""
    sub = _broadcast(t, "-")
    if sub is None or len(sub[2].missing) != 1:
        return None
    shifted, log_total, axes = sub
    if log_total.op_label != "log" or len(log_total.children) != 1 or not _same_layout(log_total, 0):
        return None
    e = _exp_sum(log_total.children[0], axes)
    if e is None or e.children[0] is not shifted:
        return None
    x = _shifted(shifted, axes)
    return None if x is None else Fused("LogSoftmax", x, tuple(axes.missing))


def _centered(t: Tensor) -> tuple[Tensor, _Axes] | None:
    """`t = x - mean(x)`."""
    b = _broadcast(t, "-")
    if b is None:
        return None
    x, mean_t, axes = b
    m = _mean(mean_t)
    return (x, axes) if m is not None and m[0] is x and m[1] == axes else None


def _variance_eps(t: Tensor, centered: Tensor, axes: _Axes) -> float | None:
    """`t = mean(c*c + eps)` or `mean(c*c) + eps` for `c = centered`: eps."""
    with_eps = _with_scalar(t, "+")
    var, eps = with_eps if with_eps is not None else (t, None)
    m = _mean(var)
    if m is None or m[1] != axes:
        return None
    sq = m[0]
    if eps is None:
        inner = _with_scalar(sq, "+")
        if inner is None:
            return None
        sq, eps = inner
    if sq.op_label != "*" or len(sq.children) != 2 or any(c is not centered for c in sq.children) \
            or not (_same_layout(sq, 0) and _same_layout(sq, 1)):
        return None
    return eps


def _normalized(t: Tensor) -> Fused | None:
    """`t = (x - mean) * rsqrt(var + eps)` over the trailing axes of `x` (ONNX normalizes
    from an axis to the last; size-1 axes among them change nothing)."""
    b = _broadcast(t, "*")
    if b is None:
        return None
    centered, inv, axes = b
    c = _centered(centered)
    if c is None or c[1] != axes or not axes.missing or inv.op_label != "rsqrt" or len(inv.children) != 1 \
            or not _same_layout(inv, 0):
        return None
    x = c[0]
    eps = _variance_eps(inv.children[0], centered, axes)
    first = min(axes.missing)
    if eps is None or any(k not in axes.missing and x.dims[k] != 1 for k in range(first, len(x.dims))):
        return None
    return Fused("LayerNormalization", x, tuple(range(first, len(x.dims))), epsilon=eps)


def _along(t: Tensor, op: str, n: Fused) -> Tensor | None:
    """`t = y op v` where `v` holds exactly the normalized axes of `n`: its scale or shift."""
    b = _broadcast(t, op)
    if b is None or [k for k in n.axes if n.x.dims[k] != 1] != list(b[2].at):
        return None
    return b[1]


def layer_norm(t: Tensor) -> Fused | None:
    """A normalization, optionally times a scale, plus a shift."""
    if (n := _normalized(t)) is not None:
        return n
    if t.op_label == "*" and (n := _normalized(t.children[0])) is not None \
            and (scale := _along(t, "*", n)) is not None:
        return Fused(n.op, n.x, n.axes, scale=scale, epsilon=n.epsilon)
    if t.op_label == "+" and len(t.children) == 2 and t.children[0].op_label == "*" \
            and (n := _normalized(t.children[0].children[0])) is not None \
            and (scale := _along(t.children[0], "*", n)) is not None and (bias := _along(t, "+", n)) is not None:
        return Fused(n.op, n.x, n.axes, scale=scale, bias=bias, epsilon=n.epsilon)
    return None


def recognize(t: Tensor) -> Fused | None:
    """The ONNX operator `t` is the result of, if it is a softmax, a log-softmax or a layer norm."""
    if t.op_label == "/":
        return softmax(t)
    if t.op_label == "-":
        return log_softmax(t)
    if t.op_label in ("*", "+"):
        return layer_norm(t)
    return None


def gelu_approximation(t: Tensor) -> str:
    """`"none"` if the `gelu` tensor `t` computes the erf form, else `"tanh"`: `t` is `x * gate`
    (`activations.gelu`), the tanh form's gate computed through `exp` (`sigmoid(2u)`), so `erf`
    in the gate's computation is what tells the two apart."""
    gate = t.children[1]
    unops = {a.op for a in asg.flatten_with_comments(gate.own_forward) if isinstance(a, asg.AccumUnop)}
    return "none" if ops.Unop.ERF in unops else "tanh"
