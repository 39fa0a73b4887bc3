"""Tensors whose values come from the host between routine calls: data inputs and scalars.

A constant literal (`ej.ndarray`) is fixed when created, so the only way to feed new data to
a compiled routine used to be a new graph and a new compilation. An input is a hosted node of
the seed's `Volatile` memory type — it changes on the host and is copied to devices (with the
CPU context, shared with them) — so a routine compiled once reads whatever was last written
with `set_values`. Inputs and scalars are never differentiated and never constant-folded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from einjit import shape as sh
from einjit.ir import ops, provenance
from einjit.ir.tnode import MemoryType, hosted
from einjit.tensor.tensor import Tensor, default_prec, make_node, new_label, register


def _dims(what: str, label: str, dims: Sequence[int]) -> list[int | None]:
    out: list[int | None] = [int(d) for d in dims]
    if any(int(d) < 1 for d in dims):
        raise sh.ShapeError(f"einjit: {what} of input {label!r} must be positive, got {list(dims)}")
    return out


def input(label: str, *, batch_dims: Sequence[int] = (), input_dims: Sequence[int] = (),
          output_dims: Sequence[int] = (1,), prec: ops.Prec | str | np.dtype | type | None = None,
          values: object = None) -> Tensor:
    """A data input, like a placeholder: fixed dims, values set per step with `set_values`.

    `ej.input("x", batch_dims=[64], output_dims=[2])` holds a batch of 64 points of 2
    coordinates: a NumPy array of shape `(64, 2)` (batch axes first, then output axes, then
    input axes — the memory layout). Its values are zeros until set; `values=` sets them now.
    """
    lbl = new_label(label, "input")
    shape = sh.Shape.make(batch_dims=_dims("batch_dims", label, batch_dims),
                          input_dims=_dims("input_dims", label, input_dims),
                          output_dims=_dims("output_dims", label, output_dims), debug_name=label)
    p = default_prec() if prec is None else ops.as_prec(prec)
    t = Tensor(label=lbl, op_label="input", shape=shape, update_step=None, children=(),
               value_tn=make_node(lbl, shape, p), grad_tn=None, projections=None)
    t.value_tn.update_memory_mode(hosted(MemoryType.VOLATILE), provenance.INPUT)
    t.value_tn.host_array()
    t._fwd_done = True
    register(t)
    if values is not None:
        t.set_values(values)
    return t


def scalar(value: float, *, label: str, prec: ops.Prec | str | np.dtype | type | None = None) -> Tensor:
    """A one-cell input holding `value`, e.g. a learning rate changed between steps with
    `lr.set_values(0.01)` — no recompilation, unlike a number literal, which is compiled in."""
    return input(label, output_dims=(1,), prec=prec, values=value)

