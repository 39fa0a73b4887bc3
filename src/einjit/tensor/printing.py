"""Readable tensors: the shape in the seed's `batch|input->output` notation, then the values and
gradients laid out with their axis kinds named."""

from __future__ import annotations

import numpy as np

from einjit.ir import bf16
from einjit.ir.tnode import Tnode
from einjit.tensor.tensor import Tensor


def _kinds(t: Tensor) -> list[str]:
    try:
        nb, no, ni = (len(t.shape.batch.dims), len(t.shape.output.dims), len(t.shape.input.dims))
    except AttributeError:
        return []
    return ["batch"] * nb + ["output"] * no + ["input"] * ni


def _array_text(tn: Tnode | None, kinds: list[str], what: str) -> str:
    if tn is None or tn.array is None:
        return f"  {what}: (not computed yet)\n"
    arr = bf16.as_values(tn.array, tn.prec)
    if len(kinds) == arr.ndim:
        axes = ", ".join(f"{k} {d}" for k, d in zip(kinds, arr.shape, strict=True))
    else:
        axes = str(arr.shape)
    body = np.array2string(arr, precision=5, suppress_small=True, max_line_width=100, threshold=200)
    body = "\n".join("    " + line for line in body.splitlines())
    return f"  {what} [{axes}]:\n{body}\n"


def render_tensor(t: Tensor) -> str:
    kind = "differentiable" if t.grad_tn is not None else "non-differentiable"
    head = f"Tensor {t.label_str} #{t.id} ({t.op_label}, {kind}) : {t.shape}\n"
    kinds = _kinds(t)
    text = head + _array_text(t.value_tn, kinds, "value")
    if t.grad_tn is not None:
        text += _array_text(t.grad_tn, kinds, "grad")
    return text
