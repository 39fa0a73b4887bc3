"""The reference interpreter of the low-level IR: the oracle every backend and pass is tested
against.

It executes one scalar at a time, in the precision of the node being computed, with NumPy
scalar arithmetic. Slow by design: it has to be obviously right, not fast. Reads are
bounds-checked (NumPy would silently wrap negative indices), and reading a node that has no
array — a virtual node whose computation was not inlined — is an error. A run-time index
(`GatherIdx`) is clamped into its range, as every backend clamps it.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from einjit import memory
from einjit.errors import EinjitError
from einjit.ir import bf16, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, AxisIndex, FixedIdx, GatherIdx, Iterator, SubAxis, Symbol
from einjit.ir.precision import combine_prec
from einjit.ir.tnode import Tnode


class InterpretError(EinjitError, RuntimeError):
    pass


class _Machine:
    def __init__(self, arrays: dict[Tnode, np.ndarray], env: dict[Symbol, int],
                 merge_buffers: Mapping[Tnode, np.ndarray]):
        self.arrays = arrays
        self.env = env
        self.merge = merge_buffers
        self.locals: dict[ll.ScopeId, object] = {}

    def index(self, idx: AxisIndex) -> int:
        match idx:
            case FixedIdx(i):
                return i
            case Iterator(s):
                return self._sym(s)
            case Affine(symbols, offset):
                return offset + sum(c * self._sym(s) for c, s in symbols)
            case SubAxis():
                return 0
            case GatherIdx(ids, idcs, size):
                arr = self.array(ids)
                value = int(arr[self.position(ids, arr, idcs)])
                return min(max(value, 0), size - 1)
        raise TypeError(idx)

    def _sym(self, s: Symbol) -> int:
        try:
            return self.env[s]
        except KeyError:
            raise InterpretError(f"einjit interpreter: symbol {s!r} is not bound by a loop or a static "
                                 f"binding") from None

    def position(self, tn: Tnode, arr: np.ndarray, idcs: tuple[AxisIndex, ...]) -> tuple[int, ...]:
        pos = tuple(self.index(i) for i in idcs)
        if len(pos) != arr.ndim or any(not 0 <= p < d for p, d in zip(pos, arr.shape, strict=True)):
            raise InterpretError(f"einjit interpreter: index {pos} out of bounds for {tn.debug_name()} "
                                 f"with dims {arr.shape}")
        return pos

    def array(self, tn: Tnode) -> np.ndarray:
        arr = self.arrays.get(tn)
        if arr is None:
            if tn.is_virtual():
                raise InterpretError(f"einjit interpreter: {tn.debug_name()} is virtual and has no array")
            arr = self.arrays[tn] = memory.zeros(tn.debug_name(), tn.dims, tn.prec.dtype)
        return arr

    def exec(self, stmt: ll.LLStmt) -> None:
        for s in ll.flatten(stmt):
            match s:
                case ll.ForLoop(index=index, body=body):
                    for v in ll.loop_range(s, self.index):
                        self.env[index] = v
                        self.exec(body)
                    self.env.pop(index, None)
                case ll.Set(tn, idcs, ll.Get(src, at), _) if tn.prec is ops.bf16 and src.prec is ops.bf16:
                    # a bf16 cell copied into a bf16 cell is copied as it is (`c_syntax`: no round trip)
                    arr, cells = self.array(tn), self.array(src)
                    arr[self.position(tn, arr, idcs)] = cells[self.position(src, cells, at)]
                case ll.Set(tn, idcs, llsc, _):
                    arr = self.array(tn)
                    arr[self.position(tn, arr, idcs)] = _stored(self.eval(llsc, tn.prec), tn.prec)
                case ll.SetFromVec(tn, idcs, length, vec_unop, arg, _):
                    arr = self.array(tn)
                    pos = self.position(tn, arr, idcs)
                    if pos[-1] + length > arr.shape[-1]:
                        raise InterpretError(f"einjit interpreter: vector write of {length} past the end of "
                                             f"{tn.debug_name()} at {pos}")
                    counter = int(self.eval(arg, ops.int64))
                    match vec_unop:
                        case ops.VecUnop.UNIFORM_HASH:
                            values = ops.uniform_hash(counter, length)
                    for k, cell in enumerate(values):
                        arr[pos[:-1] + (pos[-1] + k,)] = _stored(cell, tn.prec)
                case ll.SetLocal(sid, value):
                    self.locals[sid] = _rounded(self.eval(value, sid.tn.prec), sid.tn.prec)
                case ll.ZeroOut(tn):
                    self.array(tn)[...] = 0
                case ll.Comment() | ll.Noop():
                    pass
                case ll.StagedCompilation():
                    raise InterpretError("einjit interpreter: cannot execute backend-staged code")
                case _:
                    raise TypeError(f"not a low-level statement: {s!r}")

    def eval(self, sc: ll.LLScalar, prec: ops.Prec):
        prec = prec.computed_in
        dt = prec.dtype.type
        wide = combine_prec(prec, sc)
        if wide is not prec:
            return dt(self.eval(sc, wide))
        match sc:
            case ll.Constant(v):
                return dt(v)
            case ll.ConstantBits(b):
                return dt(b)
            case ll.Get(tn, idcs):
                arr = self.array(tn)
                return dt(_loaded(arr[self.position(tn, arr, idcs)], tn.prec))
            case ll.GetMergeBuffer(tn, idcs):
                if tn not in self.merge:
                    raise InterpretError(f"einjit interpreter: no merge buffer for {tn.debug_name()}")
                arr = self.merge[tn]
                return dt(_loaded(arr[self.position(tn, arr, idcs)], tn.prec))
            case ll.GetLocal(sid):
                return dt(self.locals[sid])
            case ll.LocalScope(sid, body, _):
                self.locals[sid] = sid.tn.prec.computed_in.dtype.type(0)
                self.exec(body)
                return dt(self.locals.pop(sid))
            case ll.EmbedIndex(idx):
                return dt(self.index(idx))
            case ll.Unop(op, a):
                return dt(ops.apply_unop(op, self.eval(a, prec)))
            case ll.Binop(op, a, b):
                return dt(ops.apply_binop(op, self.eval(a, prec), self.eval(b, prec)))
            case ll.Ternop(ops.Ternop.WHERE, c, a, b):
                return self.eval(a, prec) if self.eval(c, prec) != 0 else self.eval(b, prec)
            case ll.Ternop(ops.Ternop.FMA, a, b, c):
                x, y, z = (self.eval(e, prec) for e in (a, b, c))
                if prec.is_float and prec.itemsize < 8:
                    with np.errstate(all="ignore"):
                        return dt(np.float64(x) * np.float64(y) + np.float64(z))
                return dt(ops.apply_ternop(ops.Ternop.FMA, x, y, z))
            case ll.Ternop(op, a, b, c):
                return dt(ops.apply_ternop(op, *(self.eval(e, prec) for e in (a, b, c))))
        raise TypeError(f"not a low-level scalar: {sc!r}")


def _loaded(cell, prec: ops.Prec):
    """A cell's value: a bf16 cell holds a bit pattern, widened to its float32 value."""
    return bf16.cell_from_bits(cell) if prec is ops.bf16 else cell


def _stored(value, prec: ops.Prec):
    """What a cell of `prec` holds for `value`: a bf16 cell its rounded bit pattern."""
    return bf16.cell_to_bits(value) if prec is ops.bf16 else value


def _rounded(value, prec: ops.Prec):
    """A local's value: a bf16 node's local holds the float32 value of a bf16 number."""
    return bf16.cell_from_bits(bf16.cell_to_bits(value)) if prec is ops.bf16 else value


def run(llc: ll.LLStmt, arrays: dict[Tnode, np.ndarray] | None = None, bindings: Mapping[Symbol, int] | None = None,
        merge_buffers: Mapping[Tnode, np.ndarray] | None = None) -> dict[Tnode, np.ndarray]:
    """Execute `llc` on `arrays` in place; nodes without an array get a zeroed one.

    `bindings` gives the values of static symbols. Returns the (possibly extended) arrays.
    """
    arrays = {} if arrays is None else arrays
    machine = _Machine(arrays, dict(bindings or {}), merge_buffers or {})
    machine.exec(llc)
    return arrays
