"""Random numbers inside compiled routines: the seed's `Set_vec_unop` fed by a seeded counter.

`uniform(like, seed=s)` is a tensor of `like`'s shape whose forward code fills it with
`VecUnop.UNIFORM_HASH` (splitmix64 of a counter, identical on every backend and in the
interpreter): one vector assignment per row of the last axis, the row's counter being
`counter * rows + row`, so cell `k` of the flattened tensor hashes `counter * size + k`.
The counter is a hosted one-cell tensor that the same forward code increments after use, so
each run of a routine draws fresh numbers and a rerun from the same seed draws the same ones.

The counter starts at a stream base derived from the seed and from how many random tensors
were drawn from that seed before (in program order), so two dropout layers with one seed get
different masks. Counters are doubles: `counter * rows` must stay below 2**53, which the
stream layout keeps true for up to 2**17 rows (cells / last-axis length).
"""

from __future__ import annotations

import collections
import math

import numpy as np

from einjit import shape as sh
from einjit.ir import assignments as asg
from einjit.ir import ops
from einjit.ir.indexing import FixedIdx, Iterator, Projections, SubAxis, get_symbol
from einjit.ir.tnode import Tnode
from einjit.tensor.notation import cd, infer_projections
from einjit.tensor.operation import Like, as_tensor, binop, cos, log, sqrt
from einjit.tensor.state import state
from einjit.tensor.tensor import (
    GradSpec,
    Tensor,
    TensorError,
    default_prec,
    make_node,
    new_label,
    register,
)

_STREAM_BITS = 16
_STEP_BITS = 20
_MAX_ROWS = 1 << (53 - _STREAM_BITS - _STEP_BITS)
_drawn: collections.Counter[int] = collections.Counter()
_counters: dict[int, Tensor] = {}


def stream_base(seed: int, index: int) -> int:
    """The first counter of the `index`-th random tensor drawn from `seed`."""
    mixed = ops.splitmix64(ops.splitmix64(int(seed) & ((1 << 64) - 1)) ^ int(index))
    return (mixed >> (64 - _STREAM_BITS)) << _STEP_BITS


def _rows(dims: tuple[int, ...]) -> tuple[int, ...]:
    return dims[:-1] if len(dims) > 1 else (1,)


def _vector_projections(u: Tnode, counter: Tnode) -> asg.Lazy:
    def build() -> Projections:
        rows = _rows(u.dims)
        its = tuple(get_symbol() for _ in rows)
        lhs = tuple(Iterator(s) for s in its[:len(u.dims) - 1]) + (SubAxis(),)
        return Projections(rows, its, u.dims, (rows,), lhs, (tuple(Iterator(s) for s in its),),
                           f"{u.debug_name()} := uniform_hash({counter.debug_name()})")

    return asg.Lazy(build)


def _offset_projections(rows_tn: Tnode, counter: Tnode, count_rows: Tnode) -> asg.Lazy:
    def build() -> Projections:
        rows = rows_tn.dims
        its = tuple(get_symbol() for _ in rows)
        idx = tuple(Iterator(s) for s in its)
        return Projections(rows, its, rows, ((1,), (1,)), idx, ((FixedIdx(0),), (FixedIdx(0),)),
                           f"{rows_tn.debug_name()} += {counter.debug_name()} * {count_rows.debug_name()}")

    return asg.Lazy(build)


def _row_count(u: Tnode) -> float:
    n = int(np.prod(_rows(u.dims)))
    if n >= _MAX_ROWS:
        raise TensorError(f"einjit: random tensor {u.debug_name()} has {n} rows before its last axis; at most "
                          f"{_MAX_ROWS - 1} are supported (make the last axis longer)")
    return float(n)


def uniform(like: Like, *, seed: int = 0, label=None) -> Tensor:
    """Uniform numbers in [0, 1) with `like`'s shape, drawn anew each time the routine runs."""
    x = as_tensor(like)
    lbl = new_label(label, "uniform")
    shape = sh.Shape.make(debug_name=".".join(lbl))
    proj = infer_projections(shape, None, [x.shape], f"random tensor {'.'.join(lbl)}")
    p = default_prec()
    u = Tensor(label=lbl, op_label="uniform", shape=shape, update_step=None, children=(x,),
               value_tn=make_node(lbl, shape, p), grad_tn=None, projections=proj)
    index = _drawn[seed]
    _drawn[seed] += 1
    counter = state(lbl + ["counter"], float(stream_base(seed, index)), prec=ops.double)
    row_counters = Tnode(lbl + ["row_counters"], lambda: _rows(u.value_tn.dims), ops.double)
    count_rows = Tnode(lbl + ["rows"], (1,), ops.double)
    u.own_forward = asg.sequence(
        asg.Fetch(row_counters, asg.RangeOverOffsets()),
        asg.Fetch(count_rows, asg.FetchConstant(asg.Lazy(lambda: _row_count(u.value_tn)))),
        asg.AccumBinop(False, ops.Binop.ADD, ops.Binop.MUL, row_counters, asg.Node(counter.value_tn),
                       asg.Node(count_rows), _offset_projections(row_counters, counter.value_tn, count_rows)),
        asg.SetVecUnop(ops.VecUnop.UNIFORM_HASH, u.value_tn, asg.Node(row_counters),
                       _vector_projections(u.value_tn, row_counters)),
        cd("c =+ 1", c=counter.value).asgns)
    _counters[u.id] = counter
    register(u)
    return u


def normal(like: Like, *, seed: int = 0, label=None) -> Tensor:
    """Standard normal numbers with `like`'s shape (Box-Muller over two uniform draws)."""
    u1, u2 = uniform(like, seed=seed), uniform(like, seed=seed)
    radius = sqrt(-2.0 * log(1.0 - u1))
    return binop("*", radius, cos(2.0 * math.pi * u2), label=label or "normal", grad_spec=GradSpec.PROHIBIT_GRAD)


def reset_streams() -> None:
    """Start stream numbering afresh, as in a new process: the next program built draws the
    same numbers as the first one built after import (for reruns inside one process)."""
    _drawn.clear()


def counter(u: Tensor) -> Tensor:
    """The hosted counter of a random tensor: set its value to replay or skip draws."""
    try:
        return _counters[u.id]
    except KeyError:
        raise TensorError(f"einjit: tensor {u.label_str} is not a random tensor") from None
