"""Gather: rows of a table at integer indices held in a tensor, without one-hot rows.

`take(table, ids)` has the shape of `table @ one_hot(ids)` — the table's input axis is the
row axis, its output axes the row's contents, and the result has `ids`' batch axes — but its
code reads one row per id: the table's row axis is indexed by `GatherIdx(ids, ..)`, a run-time
index of the low-level IR (see `ir.indexing.GatherIdx`). Its gradient scatter-adds each
result row into the row of the table's gradient it came from (`np.add.at`), so repeated ids
accumulate.

Bounds: an id outside `0 .. rows-1` is clamped into that range (reads row 0 or the last row,
and the gradient goes there) by every backend and by the interpreter alike; no access ever
leaves the table. Inputs given as NumPy arrays are checked on the host first (`check_ids`),
which names the bad id and its position.
"""

from __future__ import annotations

import numpy as np

from einjit import shape as sh
from einjit.ir import assignments as asg
from einjit.ir import ops
from einjit.ir.indexing import (
    AxisIndex,
    FixedIdx,
    GatherIdx,
    Iterator,
    Projections,
    Symbol,
    index_symbols,
    subst_index,
)
from einjit.ir.tnode import Tnode
from einjit.tensor.notation import infer_projections
from einjit.tensor.tensor import Tensor, TensorError, make_node, new_label, register


def integer_ids(ids: object, rows: int, what: str) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """`ids` as an int64 array, and the index of its first value outside `0 .. rows-1` (None
    when all lie inside); non-integer values are a `TensorError` naming `what`."""
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and np.all(arr == np.round(arr))):
        raise TensorError(f"einjit: {what} must be integers, got dtype {arr.dtype}")
    wide = arr.astype(np.int64)
    bad = (wide < 0) | (wide >= rows)
    return wide, (tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else None)


def check_ids(ids: object, rows: int, what: str) -> np.ndarray:
    """`ids` as an int32 array whose values all lie in `0 .. rows-1`, or a `TensorError`
    naming the first bad id and where it is."""
    wide, where = integer_ids(ids, rows, f"{what}: indices")
    if where is not None:
        raise TensorError(f"einjit: {what}: id {int(wide[where])} at index {where} is outside 0..{rows - 1}")
    return wide.astype(np.int32)


def _gathered(p: Projections, ids: Tnode, where: str) -> tuple[tuple[AxisIndex, ...], tuple[Symbol, ...],
                                                               tuple[int, ...]]:
    """From the projections of `table @ ids`: the table's indices, with a run-time index
    replacing the summed loop, and the loops that remain."""
    lhs_syms = {s for i in p.project_lhs for s in index_symbols(i)}
    summed = [s for s in p.product_iterators if s not in lhs_syms]
    rows_axes = [k for k, i in enumerate(p.project_rhs[0]) if any(s in summed for s in index_symbols(i))]
    if len(summed) != 1 or len(rows_axes) != 1 or p.project_rhs[0][rows_axes[0]] != Iterator(summed[0]):
        raise sh.ShapeError(f"einjit: {where}: the table must have exactly one axis that the ids index (its "
                            f"input axis, or the one the spec sums over); got table dims {p.rhs_dims[0]} and "
                            f"ids dims {p.rhs_dims[1]}")
    v = summed[0]
    rows = p.rhs_dims[0][rows_axes[0]]
    for i, d in zip(p.project_rhs[1], p.rhs_dims[1], strict=True):
        if v in index_symbols(i) and d != 1:
            raise sh.ShapeError(f"einjit: {where}: the ids have an axis of {d} where the table has its {rows} "
                                f"rows; give one id per batch cell (output axis of size 1), not one-hot rows")
    gather = GatherIdx(ids, tuple(subst_index({v: FixedIdx(0)}, i) for i in p.project_rhs[1]), rows)
    table_idcs = tuple(subst_index({v: gather}, i) for i in p.project_rhs[0])
    keep = [k for k, s in enumerate(p.product_iterators) if s != v]
    return table_idcs, tuple(p.product_iterators[k] for k in keep), tuple(p.product_space[k] for k in keep)


def take(table: Tensor, ids: Tensor, *, spec: str | None = None, label=None) -> Tensor:
    """Rows of `table` picked by the integer tensor `ids`: `table @ one_hot(ids)` computed as a
    read of one row per id, with a scatter-add gradient into the table.

    `table` has one input axis, the rows (`ej.param("wte", input_dims=[V], output_dims=[D])`);
    `ids` holds one id per cell of its batch axes in an integer precision
    (`ej.input("ids", batch_dims=[B, T], prec="int32")`); the result has `ids`' batch axes and
    the table's output axes. Ids outside `0 .. V-1` are clamped into that range (see the module
    docstring); check NumPy ids on the host with `check_ids`.

    `spec`, an einsum spec `table; ids => result`, picks along another axis: the one axis of
    the table it sums over is the gathered one, where `ids` has size 1. `"...|->c; ...|->c =>
    ...|->0"`, say, picks `logits[b, ids[b]]` (what `nn.cross_entropy` does with class ids);
    the default is compose (`@`), as above.
    """
    if not isinstance(table, Tensor) or not isinstance(ids, Tensor):
        raise TensorError(f"einjit: take: table and ids must be tensors, got {type(table).__name__} and "
                          f"{type(ids).__name__}")
    if ids.value_tn.prec.is_float:
        raise TensorError(f"einjit: take: the ids {ids.label_str} must have an integer precision (e.g. "
                          f"ej.input(..., prec='int32')), not {ids.value_tn.prec.name}")
    lbl = new_label(label, "take")
    where = f"take ({'.'.join(lbl)})"
    shape = sh.Shape.make(debug_name=".".join(lbl))
    proj = infer_projections(shape, spec or "@", [table.shape, ids.shape], where)
    prec = table.value_tn.prec
    diff = table.grad_tn is not None
    t = Tensor(label=lbl, op_label="take", shape=shape, update_step=None, children=(table, ids),
               value_tn=make_node(lbl, shape, prec), grad_tn=make_node(lbl + ["grad"], shape, prec) if diff else None,
               projections=proj)

    def forward() -> Projections:
        p = proj.force()
        table_idcs, its, space = _gathered(p, ids.value_tn, where)
        return Projections(space, its, p.lhs_dims, (p.rhs_dims[0],), p.project_lhs, (table_idcs,),
                           f"{t.value_tn.name} = {table.value_tn.name}[{ids.value_tn.name}]")

    def backward() -> Projections:
        p = proj.force()
        table_idcs, its, space = _gathered(p, ids.value_tn, where)
        return Projections(space, its, p.rhs_dims[0], (p.lhs_dims,), table_idcs, (p.project_lhs,),
                           f"{table.value_tn.name}.grad[{ids.value_tn.name}] += {t.value_tn.name}.grad")

    t.own_forward = asg.AccumUnop(True, ops.Binop.ARG2, ops.Unop.IDENTITY, t.value_tn, asg.Node(table.value_tn),
                                  asg.Lazy(forward))
    if diff:
        assert table.grad_tn is not None and t.grad_tn is not None  # diff
        t.own_backprop = asg.AccumUnop(False, ops.Binop.ADD, ops.Unop.IDENTITY, table.grad_tn,
                                       asg.Node(t.grad_tn), asg.Lazy(backward))
    register(t)
    return t
