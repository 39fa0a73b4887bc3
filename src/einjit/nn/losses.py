"""Losses, each reduced to one cell (`reduction="mean"` or `"sum"`) or left per cell (`"none"`).

All are compositions of stable pieces: cross-entropy is `logsumexp(z) - z[target]` (or
`- sum(target * z)` for one-hot or probability targets) with the max subtracted inside
`logsumexp`, and `bce_with_logits` is `softplus(z) - z * y`, so logits of 1e4 give finite
losses and finite gradients.
"""

from __future__ import annotations

import numpy as np

from einjit.ir import ops
from einjit.shape import Dim, ShapeError
from einjit.tensor import activations, reductions
from einjit.tensor.gather import integer_ids, take
from einjit.tensor.operation import Like, as_tensor, einsum, ndarray, relu
from einjit.tensor.tensor import Tensor, TensorError

_REDUCTIONS = ("mean", "sum", "none")


def one_hot(labels, num_classes: int, *, dtype=np.float32) -> np.ndarray:
    """Integer class labels as one-hot rows; a label outside `0 .. num_classes-1` is an error."""
    return np.eye(num_classes, dtype=dtype)[class_ids(labels, num_classes)]


def class_ids(labels, num_classes: int) -> np.ndarray:
    """Integer class labels as an int32 array; a label outside `0 .. num_classes-1` is an error
    naming it and where it is."""
    arr, where = integer_ids(labels, num_classes, "class labels")
    if where is not None:
        raise TensorError(f"einjit: class label {int(arr[where])} at index {where} is outside the class range "
                          f"0..{num_classes - 1}")
    return arr.astype(np.int32)


def _reduce(per_cell: Tensor, reduction: str, label: str) -> Tensor:
    if reduction not in _REDUCTIONS:
        raise TensorError(f"einjit: {label}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    match reduction:
        case "mean":
            return reductions.mean(per_cell, label=label)
        case "sum":
            return reductions.sum(per_cell, label=label)
    return per_cell


def _class_count(logits: Tensor, axis: int) -> int:
    full, _, _ = reductions.axis_specs(logits, axis, False)
    dims = [d for row in (logits.shape.batch, logits.shape.output, logits.shape.input) for d in row.dims]
    d = dims[axis]
    if not isinstance(d, Dim):
        raise ShapeError(f"einjit: cross_entropy: the class axis {axis} of {logits.label_str} ({full}) has no "
                         f"known size yet; pass one-hot targets as a tensor")
    return int(d.d)


def _labels_for(logits: Tensor, arr: np.ndarray) -> np.ndarray:
    """Integer labels shaped like the logits' batch axes (trailing axes of size 1 allowed)."""
    batch = [d.d if isinstance(d, Dim) else None for d in logits.shape.batch.dims]
    n = len(batch)
    fits = arr.ndim >= n and all(d == 1 for d in arr.shape[n:]) and all(
        b is None or b == a for a, b in zip(arr.shape[:n], batch, strict=False))
    if not fits:
        raise TensorError(f"einjit: cross_entropy: integer labels of shape {arr.shape} do not fit the batch axes "
                          f"{[b if b is not None else '?' for b in batch]} of the logits {logits.label_str}: give one "
                          f"label per sample")
    return arr.reshape(arr.shape[:n])


def cross_entropy(logits: Tensor, target: Like, *, axis: int = -1, reduction: str = "mean",
                  label: str | None = None) -> Tensor:
    """Softmax cross-entropy along the class axis, as `F.cross_entropy`. `target` is one of:
    a tensor of class ids in an integer precision, one per batch cell of the logits
    (`ej.input("y", batch_dims=[B, T], prec="int32")`; ids outside the classes are clamped,
    see `ej.take`); a NumPy array of integer labels (checked on the host); or a float tensor of
    one-hot rows or class probabilities of the logits' shape. Class ids are gathered — the
    target's logit is read, not summed against one-hot rows — so the loss costs one
    `logsumexp` per row, and its gradient `softmax(z) - onehot(target)` is scattered."""
    if isinstance(target, (np.ndarray, list, tuple)):
        arr = _labels_for(logits, np.asarray(target))
        n_batch = len(logits.shape.batch.dims)
        ids = class_ids(arr, _class_count(logits, axis))
        target = ndarray(ids, batch_axes=n_batch, prec=ops.int32, label="targets")
    y = as_tensor(target)
    # Closed: the per-sample loss has the logits' rows less the class axis, and nothing that
    # multiplies it later can reach back and give the logits a leading size-1 axis.
    full, reduced, _ = reductions.axis_specs(logits, axis, False, closed=True)
    if y.value_tn.prec.is_float:
        picked = einsum(f"{full}; {full} => {reduced}", y, logits, label="target_logit")
    else:
        picked = take(logits, y, spec=f"{full}; {full} => {reduced}", label="target_logit")
    per_sample = reductions.broadcast_op("-", reductions.logsumexp(logits, axis, closed=True), picked,
                                         f"{reduced}; {reduced} => {reduced}")
    return _reduce(per_sample, reduction, label or "cross_entropy")


def mse(pred: Tensor, target: Like, *, reduction: str = "mean", label: str | None = None) -> Tensor:
    diff = pred - as_tensor(target)
    return _reduce(diff * diff, reduction, label or "mse")


def bce_with_logits(logits: Tensor, target: Like, *, reduction: str = "mean", label: str | None = None) -> Tensor:
    """Binary cross-entropy of `sigmoid(logits)` against targets in [0, 1]."""
    return _reduce(activations.softplus(logits) - logits * as_tensor(target), reduction, label or "bce_with_logits")


def hinge(scores: Tensor, target: Like, *, margin: float = 1.0, reduction: str = "mean",
          label: str | None = None) -> Tensor:
    """`max(0, margin - y * s)` for labels `y` of ±1."""
    return _reduce(relu(margin - as_tensor(target) * scores), reduction, label or "hinge")
