"""The assignments IR: whole-array accumulating operations, and their lowering to loops.

Projections are lazy (`Lazy`) because shape inference finishes only when a program is
compiled; an assignment can be built long before its loops are known.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar, cast

from einjit.errors import EinjitError
from einjit.ir import expr as ex
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import (
    Affine,
    AxisIndex,
    FixedIdx,
    Iterator,
    Projections,
    StaticSymbol,
    SubAxis,
    Symbol,
    get_symbol,
    index_symbols,
    make_affine,
    subst_index,
)
from einjit.ir.tnode import Tnode

T = TypeVar("T")


class Lazy(Generic[T]):
    """A value computed on first use and then remembered.

    `key`, when given, describes cheaply what the value is a function of (hashable, printing
    the same in every process for the same inputs), or returns None when only computing it
    tells: the program cache keys a program by it without computing the value."""

    __slots__ = ("_thunk", "_value", "_forced", "_key", "_known_key")

    def __init__(self, thunk: Callable[[], T], key: Callable[[], object] | None = None):
        self._thunk: Callable[[], T] | None = thunk
        self._value: T | None = None
        self._forced = False
        self._key = key
        self._known_key: object = None

    def key(self) -> object:
        """What the value is a function of (see the class), or None when unknown; remembered
        once known (it describes inputs that no longer change, such as solved shapes)."""
        if self._known_key is None and self._key is not None:
            self._known_key = self._key()
        return self._known_key

    @classmethod
    def of(cls, value: T) -> "Lazy[T]":
        lz = cls(lambda: value)
        lz._value, lz._forced = value, True
        return lz

    def force(self) -> T:
        if not self._forced:
            assert self._thunk is not None  # dropped only once forced
            self._value, self._forced = self._thunk(), True
            self._thunk = None
        return cast(T, self._value)  # set once forced (T itself may include None)

    def on_force(self, effect: Callable[[T], None]) -> None:
        """Run `effect` on the value when it is computed (now, if it already was)."""
        if self._forced:
            effect(cast(T, self._value))
            return
        thunk = self._thunk
        assert thunk is not None  # dropped only once forced

        def then() -> T:
            value = thunk()
            effect(value)
            return value

        self._thunk = then

    __call__ = force


class LoweringError(EinjitError, ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Node:
    """A buffer: the node's own array on this device."""

    tn: Tnode


@dataclass(frozen=True, slots=True)
class MergeBuffer:
    """A buffer: the copy of the node's array received from another device."""

    tn: Tnode


Buffer = Node | MergeBuffer


@dataclass(frozen=True, slots=True)
class Noop:
    pass


@dataclass(frozen=True, slots=True)
class Seq:
    first: "Asgns"
    second: "Asgns"


@dataclass(frozen=True, slots=True)
class BlockComment:
    message: str
    body: "Asgns"


@dataclass(frozen=True, slots=True)
class AccumBinop:
    initialize_neutral: bool
    accum: ops.Binop
    op: ops.Binop
    lhs: Tnode
    rhs1: Buffer
    rhs2: Buffer
    projections: Lazy[Projections] = field(compare=False)


@dataclass(frozen=True, slots=True)
class AccumUnop:
    initialize_neutral: bool
    accum: ops.Binop
    op: ops.Unop
    lhs: Tnode
    rhs: Buffer
    projections: Lazy[Projections] = field(compare=False)


@dataclass(frozen=True, slots=True)
class AccumTernop:
    initialize_neutral: bool
    accum: ops.Binop
    op: ops.Ternop
    lhs: Tnode
    rhs1: Buffer
    rhs2: Buffer
    rhs3: Buffer
    projections: Lazy[Projections] = field(compare=False)


@dataclass(frozen=True, slots=True)
class AccumExpr:
    """`Accum_op` with a whole expression tree on the right (`expr.Expr`): `lhs (accum)= rhs`
    where `rhs`'s k-th leaf reads `args[k]` at `projections.project_rhs[k]`. One assignment
    for what one-operation assignments spell with an intermediate tensor per operation
    (written `~fused(...)` in `%cd`)."""

    initialize_neutral: bool
    accum: ops.Binop
    lhs: Tnode
    rhs: ex.Expr
    args: tuple["Buffer", ...]
    projections: Lazy[Projections] = field(compare=False)


@dataclass(frozen=True, slots=True)
class Fused:
    """`AccumExpr`s over one iteration space, lowered to one loop nest whose body does each
    member's update of a cell in order: an optimizer's `m`, `v` and `p` of one element in one
    pass, instead of a nest (and a pass over memory) per tensor. Each member's lhs is indexed
    by the iterators themselves, and a node one member writes is read (by any member) only at
    that cell, so the nest computes what the members in sequence would."""

    members: tuple[AccumExpr, ...]


@dataclass(frozen=True, slots=True)
class SetVecUnop:
    """`lhs[.., k : k+length] := op(rhs[..])`: the last lhs axis is filled by the vector op."""

    op: ops.VecUnop
    lhs: Tnode
    rhs: Buffer
    projections: Lazy[Projections] = field(compare=False)


@dataclass(frozen=True, slots=True)
class FetchConstant:
    """A constant fill; the value may be lazy when it depends on inferred shapes (e.g. a mean)."""

    value: "float | Lazy[float]"

    def number(self) -> float:
        return float(self.value.force() if isinstance(self.value, Lazy) else self.value)


@dataclass(frozen=True, slots=True)
class ConstantFill:
    """Fill with `values` in row-major order, repeating them cyclically when `strict` is False."""

    values: tuple[float, ...]
    strict: bool = True


@dataclass(frozen=True, slots=True)
class RangeOverOffsets:
    """Each cell gets its own row-major offset: 0, 1, 2, ..."""


@dataclass(frozen=True, slots=True)
class Slice:
    """`array[...] := sliced[batch_idx, ...]`: the leading axis of `sliced` fixed by a static symbol."""

    batch_idx: StaticSymbol
    sliced: Tnode


@dataclass(frozen=True, slots=True)
class EmbedSymbol:
    static_sym: StaticSymbol


@dataclass(frozen=True, slots=True)
class CausalMask:
    """Each cell is 1 where its index along `key_axis` is at most its index along `query_axis`
    plus `offset` (plus the value of `offset_symbol`, a run-time decoding position), else 0.
    Axes count the node's dims; negative ones from the end.

    Computed from the indices alone, so the optimizer inlines it into its reader as a
    comparison: no `T x T` array exists in the optimized code."""

    query_axis: int
    key_axis: int
    offset: int = 0
    offset_symbol: StaticSymbol | None = None


FetchOp = FetchConstant | ConstantFill | RangeOverOffsets | Slice | EmbedSymbol | CausalMask


@dataclass(frozen=True, slots=True)
class Fetch:
    array: Tnode
    fetch_op: FetchOp


Asgns = Noop | Seq | BlockComment | AccumBinop | AccumUnop | AccumTernop | AccumExpr | Fused | SetVecUnop | Fetch


def sequence(*items: Asgns) -> Asgns:
    """Sequence assignments, dropping `Noop`s."""
    kept = [a for a in items if not isinstance(a, Noop)]
    if not kept:
        return Noop()
    out = kept[-1]
    for a in reversed(kept[:-1]):
        out = Seq(a, out)
    return out


def flatten(asgns: Asgns) -> list[Asgns]:
    out: list[Asgns] = []
    stack = [asgns]
    while stack:
        a = stack.pop()
        match a:
            case Seq(x, y):
                stack.append(y)
                stack.append(x)
            case Noop():
                pass
            case _:
                out.append(a)
    return out


def lhs_of(a: Asgns) -> Tnode | None:
    """The node an assignment writes; None for a `Fused` group (see `lhs_nodes`)."""
    match a:
        case (AccumBinop(lhs=tn) | AccumUnop(lhs=tn) | AccumTernop(lhs=tn) | AccumExpr(lhs=tn) | SetVecUnop(lhs=tn)
              | Fetch(array=tn)):
            return tn
    return None


def lhs_nodes(a: Asgns) -> list[Tnode]:
    """Every node an assignment writes, in order."""
    if isinstance(a, Fused):
        return [m.lhs for m in a.members]
    tn = lhs_of(a)
    return [] if tn is None else [tn]


def rhs_buffers(a: Asgns) -> list[Buffer]:
    match a:
        case AccumBinop(rhs1=r1, rhs2=r2):
            return [r1, r2]
        case AccumUnop(rhs=r) | SetVecUnop(rhs=r):
            return [r]
        case AccumTernop(rhs1=r1, rhs2=r2, rhs3=r3):
            return [r1, r2, r3]
        case AccumExpr(args=args):
            return list(args)
        case Fused(members):
            return [b for m in members for b in m.args]
        case Fetch(fetch_op=Slice(sliced=tn)):
            return [Node(tn)]
    return []


def guessed_nodes(asgns: Asgns) -> list[Tnode]:
    """Every node written or read, in order of first appearance."""
    seen: dict[int, Tnode] = {}
    for a in flatten_with_comments(asgns):
        for tn in lhs_nodes(a) + [b.tn for b in rhs_buffers(a)]:
            seen.setdefault(tn.id, tn)
    return list(seen.values())


def flatten_with_comments(asgns: Asgns) -> list[Asgns]:
    """Like `flatten`, but also looks inside block comments."""
    out: list[Asgns] = []
    for a in flatten(asgns):
        if isinstance(a, BlockComment):
            out.extend(flatten_with_comments(a.body))
        else:
            out.append(a)
    return out


# ---------------------------------------------------------------- printing


def _buf(b: Buffer) -> str:
    return b.tn.name if isinstance(b, Node) else f"{b.tn.name}.merge"


#: Seed 004 spells the relu-gate accumulation `=?/` (`=:?/`), without the infix operator's `-`.
_ACCUM_SPELLING = {ops.Binop.RELU_GATE: "?/"}


def to_doc(asgns: Asgns, indent: str = "") -> str:
    """A `%cd`-like rendering: `c =:+ a * b;` with the projections' spec as a comment."""
    lines: list[str] = []
    for a in flatten(asgns):
        match a:
            case BlockComment(msg, body):
                lines.append(f"{indent}# {msg}\n{to_doc(body, indent + '  ')}")
                continue
            case AccumBinop(init, accum, op, lhs, r1, r2, _):
                rhs = (f"{_buf(r1)} {op.infix} {_buf(r2)}" if not op.infix.isalnum()
                       else f"{op.symbol}({_buf(r1)}, {_buf(r2)})")
            case AccumUnop(init, accum, op, lhs, r, _):
                rhs = _buf(r) if op is ops.Unop.IDENTITY else f"{op.symbol}({_buf(r)})"
            case AccumTernop(init, accum, op, lhs, r1, r2, r3, _):
                rhs = f"{op.symbol}({_buf(r1)}, {_buf(r2)}, {_buf(r3)})"
            case AccumExpr():
                lines.append(f"{indent}{_expr_doc(a)};\n")
                continue
            case Fused(members):
                lines.append(f"{indent}~fused({'; '.join(_expr_doc(m) for m in members)});\n")
                continue
            case SetVecUnop(op, lhs, r, _):
                lines.append(f"{indent}{lhs.name} := {op.symbol}({_buf(r)});\n")
                continue
            case Fetch(tn, fop):
                lines.append(f"{indent}{tn.name} := {_fetch_doc(fop)};\n")
                continue
            case _:
                raise TypeError(f"not an assignment: {a!r}")
        lines.append(f"{indent}{lhs.name} {_asgn_doc(init, accum)} {rhs};\n")
    return "".join(lines)


def _asgn_doc(init: bool, accum: ops.Binop) -> str:
    spelling = "" if accum is ops.Binop.ARG2 else _ACCUM_SPELLING.get(accum, accum.infix)
    return "=" + (":" if init else "") + spelling


def _expr_doc(a: AccumExpr) -> str:
    return f"{a.lhs.name} {_asgn_doc(a.initialize_neutral, a.accum)} {ex.to_doc(a.rhs, [_buf(b) for b in a.args])}"


def _fetch_doc(fop: FetchOp) -> str:
    match fop:
        case FetchConstant(v):
            return repr(v) if not isinstance(v, Lazy) else "<lazy constant>"
        case ConstantFill(values, strict):
            shown = ", ".join(repr(v) for v in values[:6]) + (", ..." if len(values) > 6 else "")
            return f"fill[{shown}]" + ("" if strict else " (cyclic)")
        case RangeOverOffsets():
            return "range_over_offsets"
        case Slice(sym, sliced):
            return f"{sliced.name}[{sym!r}, ...]"
        case EmbedSymbol(sym):
            return f"embed({sym!r})"
        case CausalMask(q, k, off, sym):
            shift = f"{off:+d}" if off else ""
            return f"causal_mask(axis {k} <= axis {q}{'' if sym is None else f' + {sym!r}'}{shift})"
    raise TypeError(fop)


# ---------------------------------------------------------------- lowering


def _check_fixed(tn: Tnode, idcs: tuple[AxisIndex, ...], what: str) -> None:
    dims = tn.dims
    if len(idcs) != len(dims):
        raise LoweringError(f"einjit: {what} {tn.debug_name()} has dims {dims} but is indexed by {len(idcs)} indices")
    for pos, (idx, d) in enumerate(zip(idcs, dims, strict=True)):
        if isinstance(idx, FixedIdx) and not 0 <= idx.index < d:
            raise LoweringError(
                f"einjit: fixed index {idx.index} out of range for axis {pos} of {what} "
                f"{tn.debug_name()} with dims {dims}")


Ranges = dict[Symbol, tuple[int, int]]


def _index_range(idx: AxisIndex, ranges: Ranges) -> tuple[int, int] | None:
    """The least and greatest values an affine index takes over the loops (None if unknown).
    A plain iterator counts too: a window padded after its end only (`o-0:1`) projects to one,
    and its loop runs past the array."""
    if isinstance(idx, Iterator):
        return ranges.get(idx.symbol)
    if not isinstance(idx, Affine):
        return None
    lo = hi = idx.offset
    for c, s in idx.symbols:
        if s not in ranges:
            return None
        a, b = c * ranges[s][0], c * ranges[s][1]
        lo, hi = lo + min(a, b), hi + max(a, b)
    return lo, hi


def _in_bounds_guard(idcs: tuple[AxisIndex, ...], dims: tuple[int, ...], ranges: Ranges) -> ll.LLScalar | None:
    """A condition that an affine read stays inside the array, where it might not (padding)."""
    conds: list[ll.LLScalar] = []
    for idx, d in zip(idcs, dims, strict=True):
        rng = _index_range(idx, ranges)
        if rng is None:
            continue
        lo, hi = rng
        if lo < 0:
            conds.append(ll.Binop(ops.Binop.CMPLT, ll.Constant(-1.0), ll.EmbedIndex(idx)))
        if hi >= d:
            conds.append(ll.Binop(ops.Binop.CMPLT, ll.EmbedIndex(idx), ll.Constant(float(d))))
    if not conds:
        return None
    out = conds[0]
    for c in conds[1:]:
        out = ll.Binop(ops.Binop.AND, out, c)
    return out


def _get(buf: Buffer, idcs: tuple[AxisIndex, ...], ranges: Ranges) -> ll.LLScalar:
    _check_fixed(buf.tn, idcs, "argument")
    read = ll.Get(buf.tn, idcs) if isinstance(buf, Node) else ll.GetMergeBuffer(buf.tn, idcs)
    guard = _in_bounds_guard(idcs, buf.tn.dims, ranges)
    if guard is None:
        return read
    return ll.Ternop(ops.Ternop.WHERE, guard, read, ll.Constant(0.0))


def _fresh_env(proj: Projections) -> tuple[dict[Symbol, AxisIndex], list[Symbol]]:
    fresh = [get_symbol(s.name) for s in proj.product_iterators]
    return {s: Iterator(f) for s, f in zip(proj.product_iterators, fresh, strict=True)}, fresh


def _loops(syms: list[Symbol], dims: tuple[int, ...], body: ll.LLStmt) -> ll.LLStmt:
    return _bounded_loops([(s, 0, d - 1) for s, d in zip(syms, dims, strict=True)], body)


def _bounded_loops(bounds: list[tuple[Symbol, int, int]], body: ll.LLStmt) -> ll.LLStmt:
    for s, lo, hi in reversed(bounds):
        body = ll.ForLoop(s, lo, hi, body, True)
    return body


#: Up to this many copies of a loop nest, writing through padding peels one copy per kernel
#: position (an 8x8 kernel): narrowed loops without conditions. Beyond it, the written axis
#: becomes the loop (`_substituted_nest`).
MAX_PEELED = 64


@dataclass(frozen=True)
class _PaddedNest:
    """One loop nest of a write through padding: symbols replaced (by constants or by affine
    indices of new loops), the loops' ranges, and a condition a cell's update needs (None if
    every iteration updates)."""

    subst: dict[Symbol, AxisIndex]
    ranges: Ranges
    loops: tuple[Symbol, ...]
    valid: ll.LLScalar | None = None


def _unsafe_axes(lhs: Tnode, lhs_idcs: tuple[AxisIndex, ...], ranges: Ranges) -> list[tuple[Affine, int]]:
    unsafe: list[tuple[Affine, int]] = []
    for idx, d in zip(lhs_idcs, lhs.dims, strict=True):
        rng = _index_range(idx, ranges)
        if rng is not None and (rng[0] < 0 or rng[1] >= d):
            unsafe.append((Affine(((1, idx.symbol),), 0) if isinstance(idx, Iterator) else cast(Affine, idx), d))
    return unsafe


def _padded_nests(lhs: Tnode, lhs_idcs: tuple[AxisIndex, ...], ranges: Ranges, fresh: list[Symbol]
                  ) -> list[_PaddedNest]:
    """Writes through an affine index that can leave the array (the gradient of a padded
    convolution) cannot be guarded by a conditional value: the address itself is out of
    bounds. Small kernels peel; larger ones loop over the written cells instead."""
    unsafe = _unsafe_axes(lhs, lhs_idcs, ranges)
    if not unsafe:
        return [_PaddedNest({}, ranges, tuple(fresh))]
    peeled = _peeled_nests(unsafe, ranges)
    if len(peeled) <= MAX_PEELED:
        return [_PaddedNest(env, narrowed, tuple(s for s in fresh if s not in env)) for env, narrowed in peeled]
    substituted = _substituted_nest(unsafe, lhs_idcs, ranges, fresh)
    if substituted is not None:
        return [substituted]
    return [_PaddedNest(env, narrowed, tuple(s for s in fresh if s not in env)) for env, narrowed in peeled]


def _peeled_nests(unsafe: list[tuple[Affine, int]], ranges: Ranges) -> list[tuple[dict[Symbol, AxisIndex], Ranges]]:
    """Per padded axis, the loop with the widest range stays a loop with bounds narrowed to the
    cells inside the array, and the other symbols of that index (the kernel's) are enumerated:
    one copy of the nest per value. Returns, per copy, the substitution of the enumerated
    symbols and the narrowed ranges."""
    kept: set[Symbol] = set()
    enumerated: list[Symbol] = []
    for idx, _ in unsafe:
        syms = [s for _, s in idx.symbols]
        free = [s for s in syms if s not in enumerated]
        widest = max(free, key=lambda s: ranges[s][1] - ranges[s][0], default=None)
        if widest is not None:
            kept.add(widest)
        enumerated += [s for s in syms if s != widest and s not in enumerated and s not in kept]
    values = [range(ranges[s][0], ranges[s][1] + 1) for s in enumerated]
    nests = []
    for point in itertools.product(*values):
        env: dict[Symbol, AxisIndex] = {s: FixedIdx(v) for s, v in zip(enumerated, point, strict=True)}
        narrowed: Ranges | None = {s: r for s, r in ranges.items() if s not in env}
        for idx, d in unsafe:
            if narrowed is None:
                break
            narrowed = _narrow(subst_index(env, idx), d, narrowed)
        if narrowed is not None:
            nests.append((env, narrowed))
    return nests


def _substituted_nest(unsafe: list[tuple[Affine, int]], lhs_idcs: tuple[AxisIndex, ...], ranges: Ranges,
                      fresh: list[Symbol]) -> _PaddedNest | None:
    """A change of variables: on each padded axis `c*o + rest = j` (`c` = ±1), the written
    cell `j` becomes a loop over the array, and `o = c*(j - rest)` an affine index. Each
    `(o, rest)` inside the array is one `(j, rest)`, so every update happens once; the ones
    whose `o` leaves its own range are skipped by a condition, and reads follow the new
    indices with their usual bounds guards. None when an axis has no unit-coefficient symbol
    of its own (stride and dilation both above 1)."""
    subst: dict[Symbol, AxisIndex] = {}
    new_ranges = dict(ranges)
    conds: list[ll.LLScalar] = []
    loops = list(fresh)
    for idx, d in unsafe:
        others = [i for i in lhs_idcs if i is not idx]
        candidates = [(c, s) for c, s in idx.symbols if abs(c) == 1 and s not in subst
                      and not any(s in index_symbols(i) for i in others)]
        if not candidates:
            return None
        c, s = max(candidates, key=lambda cs: ranges[cs[1]][1] - ranges[cs[1]][0])
        j = get_symbol(s.name)
        rest = [(-c * ci, si) for ci, si in idx.symbols if si != s]
        expr = make_affine([(c, j), *rest], -c * idx.offset)
        subst[s] = expr
        lo, hi = new_ranges.pop(s)
        new_ranges[j] = (0, d - 1)
        loops[loops.index(s)] = j
        conds += [ll.Binop(ops.Binop.CMPLT, ll.Constant(float(lo - 1)), ll.EmbedIndex(expr)),
                  ll.Binop(ops.Binop.CMPLT, ll.EmbedIndex(expr), ll.Constant(float(hi + 1)))]
    valid = conds[0]
    for cond in conds[1:]:
        valid = ll.Binop(ops.Binop.AND, valid, cond)
    return _PaddedNest(subst, new_ranges, tuple(loops), valid)


def _narrow(idx: AxisIndex, d: int, ranges: Ranges) -> Ranges | None:
    """Ranges with the one loop symbol of `idx` restricted to keep `idx` within `[0, d)`; None
    when no value fits."""
    match idx:
        case FixedIdx(i):
            return ranges if 0 <= i < d else None
        case Iterator(s):
            coeff, s, offset = 1, s, 0
        case Affine(((coeff, s),), offset):
            pass
        case _:
            raise LoweringError(f"einjit: cannot bound the write index {idx!r} to the array")
    lo, hi = ranges[s]
    lo, hi = max(lo, -(offset // coeff)), min(hi, (d - 1 - offset) // coeff)
    return {**ranges, s: (lo, hi)} if lo <= hi else None


def _fill(tn: Tnode, value: ll.LLScalar, debug: str) -> ll.LLStmt:
    syms = [get_symbol() for _ in tn.dims]
    return _loops(syms, tn.dims, ll.Set(tn, tuple(Iterator(s) for s in syms), value, debug))


def _unop_rhs(op: ops.Unop) -> Callable[[list[ll.LLScalar]], ll.LLScalar]:
    return lambda xs: xs[0] if op is ops.Unop.IDENTITY else ll.Unop(op, xs[0])


def _binop_rhs(op: ops.Binop) -> Callable[[list[ll.LLScalar]], ll.LLScalar]:
    return lambda xs: ll.Binop(op, xs[0], xs[1])


def _ternop_rhs(op: ops.Ternop) -> Callable[[list[ll.LLScalar]], ll.LLScalar]:
    return lambda xs: ll.Ternop(op, xs[0], xs[1], xs[2])


def _expr_rhs(tree: ex.Expr) -> Callable[[list[ll.LLScalar]], ll.LLScalar]:
    return lambda xs: ex.to_scalar(tree, xs)


def _lower_accum(init: bool, accum: ops.Binop, lhs: Tnode, proj: Projections, bufs: list[Buffer],
                 make_rhs: Callable[[list[ll.LLScalar]], ll.LLScalar], debug: str) -> ll.LLStmt:
    if lhs.dims != proj.lhs_dims:
        raise LoweringError(f"einjit: {debug}: projections expect lhs dims {proj.lhs_dims}, "
                            f"{lhs.debug_name()} has {lhs.dims}")
    env, fresh = _fresh_env(proj)
    ranges = {s: (0, d - 1) for s, d in zip(fresh, proj.product_space, strict=True)}
    total = proj.is_surjective() and proj.is_injective()
    lhs_idcs = tuple(subst_index(env, i) for i in proj.project_lhs)
    bodies = []
    for nest in _padded_nests(lhs, lhs_idcs, ranges, fresh):
        idcs = tuple(subst_index(nest.subst, i) for i in lhs_idcs)
        _check_fixed(lhs, idcs, "assigned-to")
        args = [_get(b, tuple(subst_index(nest.subst, subst_index(env, i)) for i in p), nest.ranges)
                for b, p in zip(bufs, proj.project_rhs, strict=True)]
        value = _accumulate(init and total, accum, lhs, idcs, make_rhs(args), debug)
        if nest.valid is not None:
            value = ll.Ternop(ops.Ternop.WHERE, nest.valid, value, ll.Get(lhs, idcs))
        loops = [(s, *nest.ranges[s]) for s in nest.loops]
        bodies.append(_bounded_loops(loops, ll.Set(lhs, idcs, value, debug)))
    body = ll.seq(*bodies)
    if init and not total:
        neutral = accum.neutral
        if neutral is None:
            raise LoweringError(f"einjit: {debug}: accumulation {accum.name} has no neutral element "
                                f"to initialize {lhs.debug_name()}")
        return ll.seq(_neutral_fill(lhs, accum, neutral), body)
    return body


def _neutral_fill(lhs: Tnode, accum: ops.Binop, neutral: float) -> ll.LLStmt:
    """The neutral initialization of `lhs`: a zero neutral element is the node's `Zero_out`,
    as OCANNL lowers `=:+` (one statement the backends render as they see fit); any other
    is a fill loop."""
    if neutral == 0.0:
        return ll.ZeroOut(lhs)
    return _fill(lhs, ll.Constant(neutral), f"{lhs.name} := neutral of {accum.symbol}")


#: Accumulations where `neutral ⊕ x == x`: only these may skip combining with the neutral
#: element when every cell is written once (seed 004: `lhs = neutral; lhs = lhs ⊕ rhs`).
_NEUTRAL_IS_IDENTITY = frozenset({ops.Binop.ADD, ops.Binop.MUL, ops.Binop.MAX, ops.Binop.MIN, ops.Binop.RELU_GATE})


def _accumulate(fresh: bool, accum: ops.Binop, lhs: Tnode, idcs: tuple[AxisIndex, ...], value: ll.LLScalar,
                debug: str) -> ll.LLScalar:
    """`lhs ⊕ value`, or for a cell written once after its neutral initialization (`fresh`),
    `neutral ⊕ value` — which is `value` itself only for the accumulations that allow it, so
    `=:-` gives `-x` pointwise as it gives `-sum(x)` reduced."""
    if accum is ops.Binop.ARG2:
        return value
    if not fresh:
        return ll.Binop(accum, ll.Get(lhs, idcs), value)
    if accum in _NEUTRAL_IS_IDENTITY:
        return value
    if accum.neutral is None:
        raise LoweringError(f"einjit: {debug}: accumulation {accum.name} has no neutral element "
                            f"to initialize {lhs.debug_name()}")
    return ll.Binop(accum, ll.Constant(accum.neutral), value)


def _lower_fetch(tn: Tnode, fop: FetchOp) -> ll.LLStmt:
    dims = tn.dims
    syms = [get_symbol() for _ in dims]
    idcs = tuple(Iterator(s) for s in syms)
    match fop:
        case FetchConstant():
            v = fop.number()
            if v == 0.0 and math.copysign(1.0, v) > 0:
                return ll.ZeroOut(tn)  # as in OCANNL: a zero fill is the node's Zero_out
            return _fill(tn, ll.Constant(v), f"{tn.name} := {v!r}")
        case RangeOverOffsets():
            strides = ll.row_major_strides(dims)
            offset = Affine(tuple((st, s) for st, s in zip(strides, syms, strict=True)), 0) if syms else FixedIdx(0)
            return _loops(syms, dims, ll.Set(tn, idcs, ll.EmbedIndex(offset), f"{tn.name} := offsets"))
        case ConstantFill(values, strict):
            size = tn.size
            if strict and len(values) != size:
                raise LoweringError(f"einjit: constant fill of {tn.debug_name()} with dims {dims} needs "
                                    f"{size} values, got {len(values)}")
            if not values:
                raise LoweringError(f"einjit: constant fill of {tn.debug_name()} with no values")
            stmts = []
            for off in range(size):
                pos, rest = [], off
                for d in reversed(dims):
                    pos.append(rest % d)
                    rest //= d
                stmts.append(ll.Set(tn, tuple(FixedIdx(p) for p in reversed(pos)),
                                    ll.Constant(float(values[off % len(values)])), ""))
            return ll.seq(*stmts)
        case Slice(sym, sliced):
            if sliced.dims[1:] != dims:
                raise LoweringError(f"einjit: slice of {sliced.debug_name()} {sliced.dims} into "
                                    f"{tn.debug_name()} {dims}: trailing dims differ")
            read = ll.Get(sliced, (Iterator(sym.symbol),) + idcs)
            return _loops(syms, dims, ll.Set(tn, idcs, read, f"{tn.name} := {sliced.name}[{sym!r}]"))
        case EmbedSymbol(sym):
            return _fill(tn, ll.EmbedIndex(Iterator(sym.symbol)), f"{tn.name} := {sym!r}")
        case CausalMask(q, k, off, sym):
            n = len(dims)
            if not (-n <= q < n and -n <= k < n) or q % n == k % n:
                raise LoweringError(f"einjit: causal mask {tn.debug_name()} with dims {dims}: query axis {q} and "
                                    f"key axis {k} must be two different axes")
            q, k = q % n, k % n
            terms = [(1, syms[q])] + ([] if sym is None else [(1, sym.symbol)])
            limit = ll.EmbedIndex(make_affine(terms, off + 1))
            keep = ll.Binop(ops.Binop.CMPLT, ll.EmbedIndex(Iterator(syms[k])), limit)
            return _loops(syms, dims, ll.Set(tn, idcs, keep, f"{tn.name} := {_fetch_doc(fop)}"))
    raise TypeError(fop)


def _describe(a: Asgns) -> str:
    return to_doc(a).strip().rstrip(";")


def to_low_level(asgns: Asgns) -> ll.LLStmt:
    """Lower assignments to loops; every assignment gets fresh loop symbols."""
    out: list[ll.LLStmt] = []
    for a in flatten(asgns):
        match a:
            case BlockComment(msg, body):
                out.append(ll.Comment(msg))
                out.append(to_low_level(body))
            case AccumBinop(init, accum, op, lhs, r1, r2, proj):
                out.append(_lower_accum(init, accum, lhs, proj.force(), [r1, r2],
                                        _binop_rhs(op), _describe(a)))
            case AccumUnop(init, accum, op, lhs, r, proj):
                out.append(_lower_accum(init, accum, lhs, proj.force(), [r],
                                        _unop_rhs(op), _describe(a)))
            case AccumTernop(init, accum, op, lhs, r1, r2, r3, proj):
                out.append(_lower_accum(init, accum, lhs, proj.force(), [r1, r2, r3],
                                        _ternop_rhs(op), _describe(a)))
            case AccumExpr(init, accum, lhs, tree, args, proj):
                out.append(_lower_accum(init, accum, lhs, proj.force(), list(args), _expr_rhs(tree), _describe(a)))
            case Fused(members):
                out.append(_lower_fused(members))
            case SetVecUnop(op, lhs, r, proj):
                out.append(_lower_set_vec(op, lhs, r, proj.force(), _describe(a)))
            case Fetch(tn, fop):
                out.append(_lower_fetch(tn, fop))
            case _:
                raise TypeError(f"not an assignment: {a!r}")
    return ll.seq(*out)


def _lower_set_vec(op: ops.VecUnop, lhs: Tnode, rhs: Buffer, proj: Projections, debug: str) -> ll.LLStmt:
    """The last lhs axis must be `SubAxis` in the projections: the vector op covers it."""
    if not proj.project_lhs or not isinstance(proj.project_lhs[-1], SubAxis):
        raise LoweringError(f"einjit: {debug}: the last lhs axis of a vector assignment must be a sub-axis")
    env, fresh = _fresh_env(proj)
    ranges = {s: (0, d - 1) for s, d in zip(fresh, proj.product_space, strict=True)}
    lhs_idcs = tuple(subst_index(env, i) for i in proj.project_lhs[:-1]) + (FixedIdx(0),)
    arg = _get(rhs, tuple(subst_index(env, i) for i in proj.project_rhs[0]), ranges)
    return _loops(fresh, proj.product_space, ll.SetFromVec(lhs, lhs_idcs, lhs.dims[-1], op, arg, debug))



def _lower_fused(members: tuple[AccumExpr, ...]) -> ll.LLStmt:
    """One loop nest over the members' common iteration space (see `Fused`): the members'
    projections must agree (the same space, the lhs indexed alike, iterators matched by
    position) and write every cell of the lhs once."""
    if not members:
        return ll.Noop()
    projs = [m.projections.force() for m in members]
    first = projs[0]
    fresh = [get_symbol(s.name) for s in first.product_iterators]
    ranges = {s: (0, d - 1) for s, d in zip(fresh, first.product_space, strict=True)}
    written = {m.lhs.id for m in members}
    cell: tuple[AxisIndex, ...] = ()
    sets: list[ll.LLStmt] = []
    for m, proj in zip(members, projs, strict=True):
        debug = _expr_doc(m)
        env: dict[Symbol, AxisIndex] = {s: Iterator(f) for s, f in zip(proj.product_iterators, fresh, strict=True)}
        idcs = tuple(subst_index(env, i) for i in proj.project_lhs)
        cell = cell or idcs
        if (proj.product_space != first.product_space or idcs != cell or m.lhs.dims != proj.lhs_dims
                or not (proj.is_surjective() and proj.is_injective())):
            raise LoweringError(f"einjit: fused {debug}: the lhs {m.lhs.debug_name()} {m.lhs.dims} must be written "
                                f"once per cell of the nest's iteration space {first.product_space}, indexed as "
                                f"the group's first lhs (its projections: space {proj.product_space}, lhs indexed "
                                f"{proj.project_lhs})")
        reads = []
        for b, rhs_idcs in zip(m.args, proj.project_rhs, strict=True):
            at = tuple(subst_index(env, i) for i in rhs_idcs)
            if isinstance(b, Node) and b.tn.id in written and at != cell:
                raise LoweringError(f"einjit: fused {debug}: {b.tn.debug_name()} is written in the same nest, so "
                                    f"it can be read only at the cell being updated, not at {rhs_idcs}")
            reads.append(_get(b, at, ranges))
        value = _accumulate(m.initialize_neutral, m.accum, m.lhs, cell, ex.to_scalar(m.rhs, reads), debug)
        sets.append(ll.Set(m.lhs, cell, value, debug))
    return _loops(fresh, first.product_space, ll.seq(*sets))
