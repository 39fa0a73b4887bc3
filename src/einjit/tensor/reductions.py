"""Reductions: sum, mean, max, min, logsumexp, softmax and log_softmax.

Each reduction takes either a unary einsum spec (`"...|...->...c => ...|...->..."`) or the
PyTorch-like `axis=` / `keepdims=` form, which is translated into such a spec from the axes the
argument's shape knows when the reduction is built. Axes count in memory layout order (batch,
output, input), as `Tensor.dims` lists them, so a `batch|->classes` logits tensor has the
batch at axis 0 and the classes at axis -1, as in NumPy.

The stable compositions (`softmax`, `log_softmax`, `logsumexp`) reduce with the axis removed
and broadcast back with a binary einsum, so no reduced axis ever meets its source pointwise:
that is how the `=> ...|0` widening trap is avoided. The max they subtract carries no
gradient: the result does not depend on the shift, so its exact derivative is zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from einjit import shape as sh
from einjit.ir import assignments as asg
from einjit.shape.row import RowVar
from einjit.tensor.notation import Template, make_op
from einjit.tensor.operation import (
    Like,
    _lazy_number,
    as_tensor,
    binop,
    einsum,
    exp,
    log,
)
from einjit.tensor.tensor import GradSpec, Tensor, TensorError

_MAX = (Template("t =:^^ t1"), Template("g1 =+ eq_gate(t1, t, g)"))
_MIN = (Template("t =:vv t1"), Template("g1 =+ eq_gate(t1, t, g)"))
_BROADCAST_BINARY = {
    "-": (Template("t =: t1 - t2"), Template("g1 =+ g; g2 =- g")),
    "+": (Template("t =: t1 + t2"), Template("g1 =+ g; g2 =+ g")),
    "/": (Template("t =: t1 / t2"), Template("g1 =+ g / t2; g2 =- (g * t) / t2")),
    "*": (Template("t =: t1 * t2"), Template("g1 =+ g * t2; g2 =+ t1 * g")),
}
_ALL = "...|...->... => 0"
SpecOrAxes = str | int | Sequence[int] | None
"""A reduction's second argument: a unary einsum spec, or the layout axes as NumPy takes them."""
_KINDS = ("batch", "output", "input")


def _known_rows(x: Tensor) -> dict[str, tuple[int, bool]]:
    """Per kind: the number of axes known now and whether the row may still grow (leading)."""
    return {kind: (len(x.shape.row(sh.Kind(kind)).dims), isinstance(x.shape.row(sh.Kind(kind)).bcast, RowVar))
            for kind in _KINDS}


def axis_specs(x: Tensor, axis: int | Sequence[int] | None, keepdims: bool, *, closed: bool = False
               ) -> tuple[str, str, str]:
    """(full slot, reduced slot, reduce spec) for reducing `x` over layout axes `axis`.

    `closed`: a row that loses an axis gets no row variable in either slot, so it has exactly
    the axes known now. Otherwise the result's row variable is the argument's, and a later
    broadcast of the result against a one-cell axis closes it (to its least upper bound) to
    `[1]` — in the argument too, which then gains a leading size-1 axis."""
    rows = _known_rows(x)
    names: list[tuple[str, str]] = []
    for kind in _KINDS:
        names += [(kind, f"a{len(names) + k}") for k in range(rows[kind][0])]
    n = len(names)
    wanted = range(n) if axis is None else [axis] if isinstance(axis, int) else list(axis)
    picked = set()
    for a in wanted:
        if not -n <= a < n:
            raise TensorError(f"einjit: cannot reduce tensor {x.label_str} over axis {a}: its shape {x.shape} has "
                              f"{n} known axes (batch, output, input); use an einsum spec for axes not inferred yet")
        picked.add(a % n)

    shut = {names[a][0] for a in picked} if closed and not keepdims else set()

    def slot(drop: bool) -> str:
        parts = {}
        for kind in _KINDS:
            entries = ["..."] if rows[kind][1] and kind not in shut else []
            for k, (knd, name) in enumerate(names):
                if knd != kind:
                    continue
                if k in picked and drop:
                    if keepdims:
                        entries.append("0")
                    continue
                entries.append(name)
            parts[kind] = ", ".join(entries)
        return f"{parts['batch']} | {parts['input']} -> {parts['output']},"

    full, reduced = slot(False), slot(True)
    return full, reduced, f"{full} => {reduced}"


def _spec(x: Tensor, spec: SpecOrAxes, axis, keepdims: bool) -> str:
    if spec is not None and not isinstance(spec, str):
        # `sum(x, -1)`, as NumPy and PyTorch take it: a second argument that is not a spec is the axes.
        if axis is not None:
            raise TensorError(f"einjit: reducing tensor {x.label_str}: axes given twice ({spec!r} and axis={axis!r})")
        spec, axis = None, _axes(x, spec)
    if spec is not None and (axis is not None or keepdims):
        raise TensorError("einjit: give a reduction either an einsum spec or axis=/keepdims=, not both")
    if spec is not None:
        return spec
    if axis is None and not keepdims:
        return _ALL
    return axis_specs(x, axis, keepdims)[2]


def sum(a: Like, spec: SpecOrAxes = None, *, axis=None, keepdims: bool = False, label=None) -> Tensor:
    """Sum over axes: an einsum spec, or `axis=`/`keepdims=`; by default everything into one cell."""
    x = as_tensor(a)
    return einsum(_spec(x, spec, axis, keepdims), x, label=label or "sum")


def mean(a: Like, spec: SpecOrAxes = None, *, axis=None, keepdims: bool = False, label=None) -> Tensor:
    """Like `sum`, divided by the number of summed cells (known once shapes are inferred)."""
    x = as_tensor(a)
    spec = _spec(x, spec, axis, keepdims)
    if spec == _ALL:
        s = sum(x, spec)
        count = asg.Lazy(lambda: float(np.prod(x.dims)) / float(np.prod(s.dims)))
        return binop("/", s, _lazy_number(count), label=label or "mean")
    # A partial reduction may remove every output axis; a one-cell divisor would put one back.
    scaled = binop("*", x, _lazy_number(asg.Lazy(lambda: float(np.prod(out.dims)) / float(np.prod(x.dims)))))
    out = sum(scaled, spec, label=label or "mean")
    return out


def _extremum(which, a: Like, spec, axis, keepdims, label, grad_spec=GradSpec.IF_NEEDED) -> Tensor:
    x = as_tensor(a)
    fwd, bwd = which
    return make_op("max" if which is _MAX else "min", [x], logic=_spec(x, spec, axis, keepdims), forward=fwd,
                   backprop=bwd, grad_spec=grad_spec, label=label)


def max(a: Like, spec: SpecOrAxes = None, *, axis=None, keepdims: bool = False, label=None) -> Tensor:
    """Maximum over axes (the gradient goes to every cell equal to the maximum)."""
    return _extremum(_MAX, a, spec, axis, keepdims, label)


def min(a: Like, spec: SpecOrAxes = None, *, axis=None, keepdims: bool = False, label=None) -> Tensor:
    """Minimum over axes (the gradient goes to every cell equal to the minimum)."""
    return _extremum(_MIN, a, spec, axis, keepdims, label)


def _axes(x: Tensor, given: object) -> int | list[int]:
    """The layout axes a reduction's positional argument names (an int or a sequence of ints)."""
    def one(a: object) -> int:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise TensorError(f"einjit: reducing tensor {x.label_str}: the second argument is an einsum spec "
                              f"(str) or axes (int or sequence of ints), got {a!r} ({type(a).__name__})")
        return int(a)
    if isinstance(given, Sequence):
        return [one(a) for a in given]
    return one(given)


amax, amin = max, min


def broadcast_op(op: str, full: Tensor, reduced: Tensor, spec: str, *, label=None) -> Tensor:
    """`full op reduced` where `reduced` lacks some of `full`'s axes: `spec` is `"full; reduced => full"`."""
    fwd, bwd = _BROADCAST_BINARY[op]
    return make_op(op, [full, reduced], logic=spec, forward=fwd, backprop=bwd, label=label)


def stable_parts(x: Tensor, axis: int, *, closed: bool = False) -> tuple[Tensor, str, str]:
    """`x - max(x)` over `axis`, the reduce spec and the broadcast spec (`closed`: see
    `axis_specs`)."""
    full, reduced, spec = axis_specs(x, axis, False, closed=closed)
    m = _extremum(_MAX, x, spec, None, False, None, GradSpec.PROHIBIT_GRAD)
    bspec = f"{full}; {reduced} => {full}"
    return broadcast_op("-", x, m, bspec), spec, bspec


def logsumexp(a: Like, axis: int = -1, *, label=None, closed: bool = False) -> Tensor:
    """`log(sum(exp(x)))` over `axis` (removed), computed as `m + log(sum(exp(x - m)))`
    (`closed`: see `axis_specs`)."""
    x = as_tensor(a)
    shifted, spec, _ = stable_parts(x, axis, closed=closed)
    m = shifted.children[1]
    return binop("+", m, log(einsum(spec, exp(shifted))), label=label or "logsumexp")


def softmax(a: Like, axis: int = -1, *, label=None) -> Tensor:
    """`exp(x - max) / sum(exp(x - max))` along `axis`: finite for any finite logits."""
    x = as_tensor(a)
    shifted, spec, bspec = stable_parts(x, axis)
    e = exp(shifted)
    return broadcast_op("/", e, einsum(spec, e), bspec, label=label or "softmax")


def log_softmax(a: Like, axis: int = -1, *, label=None) -> Tensor:
    """`(x - max) - log(sum(exp(x - max)))` along `axis`."""
    x = as_tensor(a)
    shifted, spec, bspec = stable_parts(x, axis)
    return broadcast_op("-", shifted, log(einsum(spec, exp(shifted))), bspec, label=label or "log_softmax")

