"""The reference interpreter of the low-level IR: the oracle every backend and pass is tested
against.

It executes one scalar at a time, in the precision of the node being computed, with NumPy
scalar arithmetic. It has to be obviously right, not fast; but every differential test runs it,
so it first turns each statement and expression into a Python closure (once per run: the
precision each operation computes in, its NumPy function and the shape of each index are
decided then, not again for every cell) and then runs the closures. A closure does what
matching the node would do at that point, in the same order, so the values (and the errors)
are those of a walk over the tree. Reads are bounds-checked (NumPy would silently wrap
negative indices), and reading a node that has no array — a virtual node whose computation
was not inlined — is an error when the read runs. A run-time index (`GatherIdx`) is clamped
into its range, as every backend clamps it. Floating-point exceptions are ignored for the
whole run, as in the generated C.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping

import numpy as np

from einjit import memory
from einjit.errors import EinjitError
from einjit.ir import bf16, ops
from einjit.ir import low_level as ll
from einjit.ir.fma import fma_rounded_once
from einjit.ir.indexing import Affine, AxisIndex, FixedIdx, GatherIdx, Iterator, SubAxis, Symbol
from einjit.ir.precision import combine_prec
from einjit.ir.tnode import Tnode

Run = Callable[[], None]
Value = Callable[[], Any]
Index = Callable[[], int]


class InterpretError(EinjitError, RuntimeError):
    pass


class _Machine:
    def __init__(self, arrays: dict[Tnode, np.ndarray], bindings: Mapping[Symbol, int],
                 merge_buffers: Mapping[Tnode, np.ndarray]):
        self.arrays = arrays
        self.bindings = bindings
        self.merge = merge_buffers
        self.locals: dict[ll.ScopeId, object] = {}
        self.slots: dict[Symbol, list[int | None]] = {}

    def slot(self, s: Symbol) -> list[int | None]:
        """The one-element list holding `s`'s value while a loop (or a static binding) binds it,
        None otherwise: the loop over `s` and every index reading it share it."""
        found = self.slots.get(s)
        if found is None:
            found = self.slots[s] = [self.bindings.get(s)]
        return found

    def index(self, idx: AxisIndex) -> int:
        return self.index_of(idx)()

    def array(self, tn: Tnode) -> np.ndarray:
        arr = self.arrays.get(tn)
        if arr is None:
            if tn.is_virtual():
                raise InterpretError(f"einjit interpreter: {tn.debug_name()} is virtual and has no array")
            arr = self.arrays[tn] = memory.zeros(tn.debug_name(), tn.dims, tn.prec.dtype)
        return arr

    def index_of(self, idx: AxisIndex) -> Index:
        """The closure computing an axis index's current value."""
        match idx:
            case FixedIdx(i):
                return lambda: i
            case Iterator(s):
                value = self.slot(s)

                def iterator() -> int:
                    v = value[0]
                    if v is None:
                        raise _unbound(s)
                    return v
                return iterator
            case Affine(symbols, offset):
                terms = [(c, self.slot(s), s) for c, s in symbols]

                def affine() -> int:
                    total = 0
                    for c, value, s in terms:
                        v = value[0]
                        if v is None:
                            raise _unbound(s)
                        total += c * v
                    return offset + total
                return affine
            case SubAxis():
                return lambda: 0
            case GatherIdx(ids, idcs, size):
                cell = self.cell(ids, idcs)

                def gathered() -> int:
                    arr = self.array(ids)
                    value = int(arr[cell(arr)])
                    return min(max(value, 0), size - 1)
                return gathered
        raise TypeError(idx)

    def cell(self, tn: Tnode, idcs: tuple[AxisIndex, ...]) -> Callable[[np.ndarray], tuple[int, ...]]:
        """The closure giving the position of `tn[idcs]` in `arr`, checked against its bounds
        (written out for one to three axes, the cells almost every program reads)."""
        parts = [self.index_of(i) for i in idcs]

        def out_of_bounds(pos: tuple[int, ...], shape: tuple[int, ...]) -> InterpretError:
            return InterpretError(f"einjit interpreter: index {pos} out of bounds for {tn.debug_name()} "
                                  f"with dims {shape}")

        match parts:
            case [f0]:
                def position1(arr: np.ndarray) -> tuple[int, ...]:
                    p0, shape = f0(), arr.shape
                    if len(shape) != 1 or not 0 <= p0 < shape[0]:
                        raise out_of_bounds((p0,), shape)
                    return (p0,)
                return position1
            case [f0, f1]:
                def position2(arr: np.ndarray) -> tuple[int, ...]:
                    p0, p1, shape = f0(), f1(), arr.shape
                    if len(shape) != 2 or not (0 <= p0 < shape[0] and 0 <= p1 < shape[1]):
                        raise out_of_bounds((p0, p1), shape)
                    return (p0, p1)
                return position2
            case [f0, f1, f2]:
                def position3(arr: np.ndarray) -> tuple[int, ...]:
                    p0, p1, p2, shape = f0(), f1(), f2(), arr.shape
                    if len(shape) != 3 or not (0 <= p0 < shape[0] and 0 <= p1 < shape[1] and 0 <= p2 < shape[2]):
                        raise out_of_bounds((p0, p1, p2), shape)
                    return (p0, p1, p2)
                return position3

        def position(arr: np.ndarray) -> tuple[int, ...]:
            pos, shape = tuple([f() for f in parts]), arr.shape
            if len(pos) != len(shape) or any(not 0 <= p < d for p, d in zip(pos, shape, strict=True)):
                raise out_of_bounds(pos, shape)
            return pos
        return position

    def block(self, stmt: ll.LLStmt) -> Run:
        """The closure running `stmt`'s statements in order."""
        steps = [f for s in ll.flatten(stmt) if (f := self.stmt(s)) is not None]
        if len(steps) == 1:
            return steps[0]

        def run_all() -> None:
            for f in steps:
                f()
        return run_all

    def stmt(self, s: ll.LLStmt) -> Run | None:
        """The closure running one (non-`Seq`) statement; None for comments."""
        match s:
            case ll.ForLoop(index=index, body=body):
                current, run_body, bound = self.slot(index), self.block(body), self.index
                # a loop without clips always runs the same range; a clipped one's depends on outer indices
                fixed = ll.loop_range(s, bound) if s.start is None and s.stop is None else None

                def loop() -> None:
                    for v in fixed if fixed is not None else ll.loop_range(s, bound):
                        current[0] = v
                        run_body()
                    current[0] = None
                return loop
            case ll.Set(tn, idcs, ll.Get(src, at), _) if tn.prec is ops.bf16 and src.prec is ops.bf16:
                # a bf16 cell copied into a bf16 cell is copied as it is (`c_syntax`: no round trip)
                to_cell, from_cell = self.cell(tn, idcs), self.cell(src, at)

                def copy() -> None:
                    arr, cells = self.array(tn), self.array(src)
                    arr[to_cell(arr)] = cells[from_cell(cells)]
                return copy
            case ll.Set(tn, idcs, llsc, _):
                to_cell, value, prec = self.cell(tn, idcs), self.scalar(llsc, tn.prec), tn.prec

                def set_() -> None:
                    arr = self.array(tn)
                    arr[to_cell(arr)] = _stored(value(), prec)
                return set_
            case ll.SetFromVec(tn, idcs, length, vec_unop, arg, _):
                to_cell, counter_of = self.cell(tn, idcs), self.scalar(arg, ops.int64)

                def set_from_vec() -> None:
                    arr = self.array(tn)
                    pos = to_cell(arr)
                    if pos[-1] + length > arr.shape[-1]:
                        raise InterpretError(f"einjit interpreter: vector write of {length} past the end of "
                                             f"{tn.debug_name()} at {pos}")
                    counter = int(counter_of())
                    match vec_unop:
                        case ops.VecUnop.UNIFORM_HASH:
                            values = ops.uniform_hash(counter, length)
                    for k, v in enumerate(values):
                        arr[pos[:-1] + (pos[-1] + k,)] = _stored(v, tn.prec)
                return set_from_vec
            case ll.SetLocal(sid, value):
                local, prec, locals_ = self.scalar(value, sid.tn.prec), sid.tn.prec, self.locals

                def set_local() -> None:
                    locals_[sid] = _rounded(local(), prec)
                return set_local
            case ll.ZeroOut(tn):
                def zero_out() -> None:
                    self.array(tn)[...] = 0
                return zero_out
            case ll.Comment() | ll.Noop():
                return None
            case ll.StagedCompilation():
                return _raise(InterpretError("einjit interpreter: cannot execute backend-staged code"))
        return _raise(TypeError(f"not a low-level statement: {s!r}"))

    def scalar(self, sc: ll.LLScalar, prec: ops.Prec) -> Value:
        """The closure computing `sc` in `prec` (or the wider precision one of its reads has)."""
        prec = prec.computed_in
        dt = prec.dtype.type
        wide = combine_prec(prec, sc)
        if wide is not prec:
            widened = self.scalar(sc, wide)
            return lambda: dt(widened())
        match sc:
            case ll.Constant(v) | ll.ConstantBits(v):
                return lambda: dt(v)
            case ll.Get(tn, idcs):
                cell = self.cell(tn, idcs)
                if tn.prec is ops.bf16:
                    return lambda: dt(bf16.cell_from_bits((arr := self.array(tn))[cell(arr)]))
                return lambda: dt((arr := self.array(tn))[cell(arr)])
            case ll.GetMergeBuffer(tn, idcs):
                cell, merge = self.cell(tn, idcs), self.merge

                def merged() -> Any:
                    if tn not in merge:
                        raise InterpretError(f"einjit interpreter: no merge buffer for {tn.debug_name()}")
                    arr = merge[tn]
                    return dt(_loaded(arr[cell(arr)], tn.prec))
                return merged
            case ll.GetLocal(sid):
                locals_ = self.locals
                return lambda: dt(locals_[sid])
            case ll.LocalScope(sid, body, _):
                run_body, zero, locals_ = self.block(body), sid.tn.prec.computed_in.dtype.type(0), self.locals

                def scope() -> Any:
                    locals_[sid] = zero
                    run_body()
                    return dt(locals_.pop(sid))
                return scope
            case ll.EmbedIndex(idx):
                index = self.index_of(idx)
                return lambda: dt(index())
            case ll.Unop(op, a):
                fa, unop = self.scalar(a, prec), op.numpy
                return lambda: dt(unop(fa()))
            case ll.Binop(op, a, b):
                fa, fb = self.scalar(a, prec), self.scalar(b, prec)
                binop = _FLOAT_OPERATORS.get(op, op.numpy) if prec.dtype.type in _FLOATS else op.numpy
                return lambda: dt(binop(fa(), fb()))
            case ll.Ternop(ops.Ternop.WHERE, c, a, b):
                fc, fa, fb = self.scalar(c, prec), self.scalar(a, prec), self.scalar(b, prec)
                return lambda: fa() if fc() != 0 else fb()
            case ll.Ternop(ops.Ternop.FMA, a, b, c) if prec.is_float:
                fa, fb, fc = self.scalar(a, prec), self.scalar(b, prec), self.scalar(c, prec)
                fused = fma_rounded_once(np.dtype(dt))
                return lambda: fused(fa(), fb(), fc())
            case ll.Ternop(op, a, b, c):
                fa, fb, fc, ternop = self.scalar(a, prec), self.scalar(b, prec), self.scalar(c, prec), op.numpy
                return lambda: dt(ternop(fa(), fb(), fc()))
        raise TypeError(f"not a low-level scalar: {sc!r}")


_FLOATS = (np.float32, np.float64)
_FLOAT_OPERATORS: dict[ops.Binop, Callable[[Any, Any], Any]] = {
    ops.Binop.ADD: operator.add, ops.Binop.SUB: operator.sub, ops.Binop.MUL: operator.mul,
    ops.Binop.DIV: operator.truediv, ops.Binop.CMPLT: operator.lt, ops.Binop.CMPEQ: operator.eq,
    ops.Binop.CMPNE: operator.ne, ops.Binop.AND: lambda a, b: (a != 0) & (b != 0),
    ops.Binop.OR: lambda a, b: (a != 0) | (b != 0)}
"""Python's operators on two NumPy float32 (float64) scalars give the bits of the operation's
ufunc (IEEE arithmetic and comparisons, NaNs and infinities alike) without a ufunc call per
cell, the interpreter's largest cost."""


def _unbound(s: Symbol) -> InterpretError:
    return InterpretError(f"einjit interpreter: symbol {s!r} is not bound by a loop or a static binding")


def _raise(error: Exception) -> Run:
    """A statement that fails when it runs (not when the program is read)."""
    def fail() -> None:
        raise error
    return fail


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
    program = machine.block(llc)
    with np.errstate(all="ignore"):
        program()
    return arrays
