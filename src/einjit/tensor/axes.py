"""Explicit axis views: one output axis of `D` cells seen as `parts x D/parts`, and back.

An einsum spec that names two axes where the argument has one does not split it: shape
inference is free to give the extra axis size 1, which for attention means one head. These
two operations say the split out loud: `split_axis(x, 4)` views the last feature axis of 64
as `4 x 16` (row-major, as `reshape` would: `y[h, e] = x[16*h + e]`), refusing a size that
4 does not divide, and `merge_axes` is its inverse. Both are affine reads of one einsum, so
their gradients are the same index read back and the compiled code copies nothing when the
consumer is inlined.
"""

from __future__ import annotations

from einjit.shape import Dim, Kind, ShapeError
from einjit.shape.inference import provisional_row
from einjit.tensor.notation import Template, make_op
from einjit.tensor.operation import Like, as_tensor
from einjit.tensor.tensor import Tensor

_VIEW = (Template("t =: t1"), Template("g1 =+ g"))


def _output_sizes(x: Tensor, what: str) -> list[int]:
    """The sizes of `x`'s output axes, from what inference can derive now (a view needs them to
    write its strides)."""
    row = x.shape.output
    if any(not isinstance(d, Dim) for d in row.dims):
        row = provisional_row(x.shape, Kind.OUTPUT)
    sizes = [d.d if isinstance(d, Dim) else None for d in row.dims]
    if not sizes or None in sizes:
        raise ShapeError(f"einjit: {what}: the output axes of {x.label_str} (shape {x.shape}) are not known yet; "
                         f"a view needs their sizes")
    return [d for d in sizes if d is not None]


def _axis(sizes: list[int], axis: int, what: str, x: Tensor, span: int = 1) -> int:
    n = len(sizes)
    if not -n <= axis < n or axis % n + span > n:
        raise ShapeError(f"einjit: {what}: output axis {axis} is out of range for {x.label_str}, whose output axes "
                         f"are {sizes}")
    return axis % n


def _view(x: Tensor, rhs: list[str], lhs: list[str], sizes: list[int], name: str, label) -> Tensor:
    spec = f"... | -> {', '.join(rhs)} => ... | -> {', '.join(lhs)}"
    fwd, bwd = _VIEW
    return make_op(name, [x], logic=spec, forward=fwd, backprop=bwd, label=label, output_dims=sizes)


def split_axis(a: Like, parts: int, *, axis: int = -1, label=None) -> Tensor:
    """Output axis `axis` of `D` cells as two axes `parts x D // parts` (the first the slower),
    e.g. a `d_model` feature axis as `heads x head_dim`. A `parts` that does not divide `D` is
    an error, never a silently smaller axis."""
    x = as_tensor(a)
    what = f"split_axis of {x.label_str}"
    sizes = _output_sizes(x, what)
    k = _axis(sizes, axis, what, x)
    d = sizes[k]
    if not isinstance(parts, int) or parts < 1 or d % parts:
        raise ShapeError(f"einjit: {what}: cannot split output axis {axis} of {d} cells into {parts!r} equal parts "
                         f"(shape {x.shape}); parts must be a positive divisor of {d}")
    inner = d // parts
    names = [f"a{j}" for j in range(len(sizes))]
    rhs = names[:k] + [f"{inner}*hi+lo" if parts > 1 and inner > 1 else "hi" if inner == 1 else "lo"] + names[k + 1:]
    lhs = names[:k] + ["hi", "lo"] + names[k + 1:]
    return _view(x, rhs, lhs, sizes[:k] + [parts, inner] + sizes[k + 1:], "split_axis", label)


def merge_axes(a: Like, *, axis: int = -2, label=None) -> Tensor:
    """Output axes `axis` and `axis + 1` (`A x B`) as one axis of `A * B` cells, row-major: the
    inverse of `split_axis` (`merge_axes(split_axis(x, h)) == x`)."""
    x = as_tensor(a)
    what = f"merge_axes of {x.label_str}"
    sizes = _output_sizes(x, what)
    if len(sizes) < 2:
        raise ShapeError(f"einjit: {what}: needs two output axes to merge, {x.label_str} has {sizes}")
    k = _axis(sizes, axis, what, x, span=2)
    outer, inner = sizes[k], sizes[k + 1]
    names = [f"a{j}" for j in range(len(sizes))]
    rhs = names[:k] + ["hi", "lo"] + names[k + 2:]
    merged = "+".join(t for t, n in ((f"{inner}*hi" if inner > 1 else "hi", outer), ("lo", inner)) if n > 1) or "0"
    lhs = names[:k] + [merged] + names[k + 2:]
    return _view(x, rhs, lhs, sizes[:k] + [outer * inner] + sizes[k + 2:], "merge_axes", label)
