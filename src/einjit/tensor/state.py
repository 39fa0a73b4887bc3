"""State tensors: hosted, non-differentiable values that compiled routines read and update in
place (random-number counters, running statistics, a learning rate), and that Python reads or
sets between runs through the shared host array."""

from __future__ import annotations

import numpy as np

from einjit import shape as sh
from einjit.ir import ops, provenance
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
    t.value_tn.array = np.ascontiguousarray(arr, dtype=p.dtype)
    t._fwd_done = True
    return t
