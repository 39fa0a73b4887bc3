"""State tensors: hosted, non-differentiable values that compiled routines read and update in
place (random-number counters, running statistics, a learning rate), and that Python reads or
sets between runs through the shared host array."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

from einjit import shape as sh
from einjit.ir import assignments as asg
from einjit.ir import bf16, ops, provenance
from einjit.ir.tnode import MemoryType, hosted
from einjit.tensor.tensor import Tensor, default_prec, make_node


def state(label: list[str], values, *, prec: ops.Prec | None = None) -> Tensor:
    """A tensor with output axes shaped like `values`, initialized to them."""
    arr = np.atleast_1d(np.asarray(values, dtype=np.float64))
    p = prec or default_prec()
    shape = sh.Shape.make(batch_dims=[], input_dims=[], output_dims=list(arr.shape), debug_name=".".join(label))
    t = Tensor(label=label, op_label="state", shape=shape, update_step=None, children=(),
               value_tn=make_node(label, shape, p), grad_tn=None, projections=None)
    t.value_tn.update_memory_mode(hosted(MemoryType.CHANGED_ON_DEVICES), provenance.STATE)
    t.value_tn.array = bf16.as_cells(arr, p)
    t._fwd_done = True
    return t


_drivers: dict[int, weakref.WeakMethod] = {}


def drive(t: Tensor, before_run: Callable[[], None]) -> None:
    """`before_run` (a bound method) sets `t` before every run of a step whose code reads it:
    an optimizer's learning rate follows its schedule in every loop that runs such steps."""
    _drivers[t.value_tn.id] = weakref.WeakMethod(before_run)


def drivers(code: asg.Asgns) -> list[Callable[[], None]]:
    """What must run before each call of a routine compiled from `code`, in order of first use."""
    found = [_drivers[tn.id]() for tn in asg.guessed_nodes(code) if tn.id in _drivers]
    return [f for f in found if f is not None]
