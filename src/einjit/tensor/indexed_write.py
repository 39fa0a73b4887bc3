"""Indexed write: a slice of a buffer overwritten in place at a position known only at run time.

A KV cache is the case in point: the decode routine computes the keys and values of one new
token and stores them at position `pos` of a `[B, T_max, H, Dh]` buffer that persists between
calls, then attends over the buffer. One compilation serves every position — the routine is
called with new positions, never recompiled. The position is either

- a static symbol (`ej.get_static_symbol()`), an argument of the compiled routine:
  `write_at(cache, value, pos, axis=1)` lowers to `cache[.., pos + i, ..] := value[.., i, ..]`,
  an affine index whose static part is the symbol. Bounds are checked twice: lowering gives
  the symbol the range `0 .. T_max - n` (`StaticSymbol.infer_range`), so a call with a
  position outside it is refused before any code runs (`StaticRangeError`), and the renderers
  check that every index stays inside the buffer over that range; or
- a hosted integer: an integer tensor (`ej.input("pos", batch_dims=[1], prec="int32")`, or one
  a routine computes) holding one position per written row, read inside the routine when it
  runs: `cache[.., positions[i], ..] := value[.., i, ..]`, through a run-time index
  (`ir.indexing.GatherIdx`). A position outside `0 .. T_max - 1` is clamped to the nearest end
  (`-3` writes row 0, `T_max + 5` row `T_max - 1`), as every gather in einjit clamps: the
  write never leaves the buffer whatever the data holds. The positions need not be
  consecutive; two rows at the same position leave one of them there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from einjit import shape as sh
from einjit.ir import assignments as asg
from einjit.ir import ops, provenance
from einjit.ir.indexing import (
    Affine,
    AxisIndex,
    FixedIdx,
    GatherIdx,
    Iterator,
    Projections,
    StaticSymbol,
    Symbol,
    get_symbol,
)
from einjit.ir.tnode import MemoryType, hosted
from einjit.tensor.notation import infer_projections
from einjit.tensor.tensor import Tensor, TensorError, default_prec, make_node, new_label, register


def buffer(label: str, *, batch_dims: Sequence[int] = (), output_dims: Sequence[int] = (1,),
           input_dims: Sequence[int] = (), prec: ops.Prec | str | np.dtype | type | None = None) -> Tensor:
    """A zero-filled, hosted, non-differentiable tensor that routines update in place and that
    keeps its values between calls (a KV cache): write into it with `write_at`. Its values are
    readable and settable from the host (`.value.numpy()`, `.set_values`)."""
    lbl = new_label(label, "buffer")
    if any(int(d) < 1 for row in (batch_dims, output_dims, input_dims) for d in row):
        raise sh.ShapeError(f"einjit: buffer {label!r}: dims must be positive, got batch {list(batch_dims)}, "
                            f"output {list(output_dims)}, input {list(input_dims)}")
    shape = sh.Shape.make(batch_dims=[int(d) for d in batch_dims], output_dims=[int(d) for d in output_dims],
                          input_dims=[int(d) for d in input_dims], debug_name=label)
    p = default_prec() if prec is None else ops.as_prec(prec)
    t = Tensor(label=lbl, op_label="buffer", shape=shape, update_step=None, children=(),
               value_tn=make_node(lbl, shape, p), grad_tn=None, projections=None)
    t.value_tn.update_memory_mode(hosted(MemoryType.CHANGED_ON_DEVICES), provenance.STATE)
    t.value_tn.host_array()
    t._fwd_done = True
    return t


def write_at(cache: Tensor, value: Tensor, pos: StaticSymbol | Tensor, *, axis: int, label=None) -> Tensor:
    """Overwrite `cache[.., pos : pos + n, ..]` (along layout axis `axis`) with `value`, whose
    dims equal the cache's except along `axis`, where it has `n` cells; returns the cache as
    updated, a tensor to read it through (its code runs the write first).

    `cache` must be a stored non-differentiable tensor (`buffer`). `pos` is a static symbol,
    bound per call (`to_routine(..., bindings={pos: ref})`, then `ref.value = t`; a position
    past `T_max - n` is refused when the routine is called, `StaticRangeError`), or an integer
    tensor of `n` cells (all its axes of size 1 but one), the position of each of the `n` rows,
    read when the routine runs and clamped into `0 .. T_max - 1` (see the module). `axis`
    counts the cache's axes in memory order (batch, output, input); negative counts from the
    end. The write is not differentiable: no gradient flows from reads of the cache to `value`
    (a cache serves inference; training attends over freshly computed keys instead).
    """
    if not isinstance(cache, Tensor) or not isinstance(value, Tensor):
        raise TensorError("einjit: write_at: the cache and the value must be tensors")
    if isinstance(pos, Tensor):
        if pos.value_tn.prec.is_float:
            raise TensorError(f"einjit: write_at: the position tensor {pos.label_str} must have an integer "
                              f"precision (e.g. ej.input(..., prec='int32')), not {pos.value_tn.prec.name}")
    elif not isinstance(pos, StaticSymbol):
        raise TensorError(f"einjit: write_at: the position must be a static symbol (ej.get_static_symbol()) or an "
                          f"integer tensor, got {type(pos).__name__}")
    if cache.grad_tn is not None:
        raise TensorError(f"einjit: write_at: the cache {cache.label_str} is differentiable; write only into "
                          f"non-differentiable buffers (ej.buffer)")
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TensorError(f"einjit: write_at: axis must be an int, got {axis!r}")
    lbl = new_label(label, "write_at")
    where = f"write_at ({'.'.join(lbl)})"
    shape = sh.Shape.make(debug_name=".".join(lbl))
    same = infer_projections(shape, None, [cache.shape], where)
    children = (cache, value) if isinstance(pos, StaticSymbol) else (cache, value, pos)
    out = Tensor(label=lbl, op_label="write_at", shape=shape, update_step=None, children=children,
                 value_tn=cache.value_tn, grad_tn=None, projections=same)

    def projections() -> Projections:
        dims, vdims = cache.value_tn.dims, value.value_tn.dims
        if not -len(dims) <= axis < len(dims):
            raise TensorError(f"einjit: {where}: axis {axis} is out of range for the cache {cache.label_str} "
                              f"with dims {dims}")
        k = axis % len(dims)
        if len(vdims) != len(dims) or any(a != b for j, (a, b) in enumerate(zip(dims, vdims, strict=True))
                                          if j != k) or vdims[k] > dims[k]:
            raise sh.ShapeError(f"einjit: {where}: the value {value.label_str} has dims {vdims}; the cache "
                                f"{cache.label_str} has {dims}: they must be equal except along axis {k}, where "
                                f"the value may be shorter")
        its = tuple(get_symbol() for _ in vdims)
        rhs = tuple(Iterator(s) for s in its)
        if isinstance(pos, StaticSymbol):
            pos.infer_range(dims[k] - vdims[k] + 1)
            at: AxisIndex = Affine(((1, its[k]), (1, pos.symbol)))
            shown = f"{pos!r} + .."
        else:
            at = GatherIdx(pos.value_tn, _row_positions(pos, vdims[k], its[k], where), dims[k])
            shown = f"{pos.value_tn.name}[..]"
        lhs = tuple(at if j == k else Iterator(s) for j, s in enumerate(its))
        return Projections(vdims, its, dims, (vdims,), lhs, (rhs,),
                           f"{cache.value_tn.name}[{shown}] := {value.value_tn.name}")

    out.own_forward = asg.AccumUnop(False, ops.Binop.ARG2, ops.Unop.IDENTITY, cache.value_tn,
                                    asg.Node(value.value_tn), asg.Lazy(projections))
    register(out)
    return out


def _row_positions(pos: Tensor, n: int, row: Symbol, where: str) -> tuple[AxisIndex, ...]:
    """The index into the position tensor of the row that loop symbol `row` (over `n` rows)
    writes: its one axis of size `n`, every other axis at 0."""
    dims = pos.value_tn.dims
    long = [j for j, d in enumerate(dims) if d != 1]
    if int(np.prod(dims)) != n or len(long) > 1:
        raise sh.ShapeError(f"einjit: {where}: the position tensor {pos.label_str} has dims {dims}; it must hold "
                            f"one position per written row ({n} cells, every axis of size 1 but one)")
    return tuple(Iterator(row) if j in long else FixedIdx(0) for j in range(len(dims)))
