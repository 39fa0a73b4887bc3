"""The C-like low-level IR of seed 000: loops over scalar statements.

Statements (`LLStmt`) and scalar expressions (`LLScalar`) are frozen dataclasses; passes
`match` on them. One deliberate simplification of the seed: a scalar argument does not carry
its own precision. Every scalar expression is computed in the precision of the node it is
stored into (`Set.tn`, or the node of a `LocalScope`'s scope id), which is what the seed's
lowering produces anyway; renderers cast array reads whose precision differs.

`ForLoop.to_` is inclusive, as in the seed (`for i = from_ to to_`).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable
from typing import Iterator as PyIterator

from einjit.ir import naming, ops
from einjit.ir.indexing import Affine, AxisIndex, FixedIdx, Symbol, gather_indices
from einjit.ir.indexing import Iterator as IndexIterator
from einjit.ir.tnode import Tnode

RECURSION_LIMIT = 20_000
"""The passes, printers and renderers recurse over expressions, and a chain of inlined
pointwise nodes is one deep expression: a few hundred inlined nodes need more than Python's
default of 1000 frames."""


@contextlib.contextmanager
def deep_recursion() -> PyIterator[None]:
    """Run a walk over low-level code with room for `RECURSION_LIMIT` frames."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, RECURSION_LIMIT))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)

_scope_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class ScopeId:
    """A local scalar variable; it has the precision of `tn`, the node it computes a cell of."""

    tn: Tnode
    id: int

    def __repr__(self) -> str:
        names = naming.current()
        return names.local(self).removesuffix("_") if names is not None else f"v{self.id}"


def fresh_scope_id(tn: Tnode) -> ScopeId:
    return ScopeId(tn, next(_scope_ids))


# ---------------------------------------------------------------- statements


@dataclass(frozen=True, slots=True)
class Noop:
    pass


@dataclass(frozen=True, slots=True)
class Comment:
    message: str


@dataclass(frozen=True, slots=True)
class StagedCompilation:
    """Backend-provided code, rendered by calling `render`; blocks virtualization (code 8)."""

    render: Callable[[], str] = field(compare=False)


@dataclass(frozen=True, slots=True)
class Seq:
    first: "LLStmt"
    second: "LLStmt"


@dataclass(frozen=True, slots=True)
class ForLoop:
    """`unroll`: a request to the compiler to unroll the loop completely (the scheduling stage
    sets it on register-block rows, so their accumulators can live in registers). `parallel`:
    the iterations are independent — each writes its own cells, and routine-local nodes
    written inside are fully written before being read in every iteration — so they may run
    on several threads. `keep_order`: the loops of the perfect nest starting here are in the
    order the scheduling stage chose, which later stages must keep (a window reduction runs
    its vector loop innermost, where interchange, counting unit strides, would put another).
    None of the three changes what the loop computes. `start` / `stop`: bounds that depend on
    outer loop indices (a triangular loop, `LoopClip`); `from_` / `to_` stay the loop's widest
    range, which is what passes that only need the extent read. `prefetch`: cells whose cache
    lines are requested at the top of every iteration (`Prefetch`, a hint that reads nothing);
    a pass that rebuilds the loop may drop them."""

    index: Symbol
    from_: int
    to_: int
    body: "LLStmt"
    trace_it: bool = True
    unroll: bool = False
    parallel: bool = False
    keep_order: bool = False
    start: "LoopClip | None" = None
    stop: "LoopClip | None" = None
    prefetch: "tuple[Prefetch, ...]" = ()


@dataclass(frozen=True, slots=True)
class Prefetch:
    """A request for the cache line `ahead` elements past `tn[idcs]` (row-major), ahead of its
    use. A hint: it reads nothing and changes no value, and backends without prefetch leave it
    out. The address may lie past the array's end (the next block after the last one): a
    prefetch never faults, and renderers compute the address as an integer."""

    tn: Tnode
    idcs: tuple[AxisIndex, ...]
    ahead: int
    write: bool = False
    """With intent to write: the line comes exclusive, so a store to it does not wait again."""


@dataclass(frozen=True, slots=True)
class LoopClip:
    """A loop bound computed from outer loop indices: the iterations kept are those with
    `scale * index >= bound` (a loop's `start`) or `scale * index < bound` (its `stop`), within
    `from_ .. to_`. The scheduler clips loops whose other iterations would only add zeros or
    write cells nobody reads (`sched.causal`)."""

    bound: AxisIndex
    scale: int = 1


def ceil_div(a: int, b: int) -> int:
    """`ceil(a / b)` for `b > 0`."""
    return -(-a // b)


def loop_range(loop: ForLoop, value: Callable[[AxisIndex], int]) -> range:
    """The iterations of `loop`, its clips evaluated by `value` (an axis index's current value)."""
    lo, hi = loop.from_, loop.to_ + 1
    if loop.start is not None:
        lo = max(lo, ceil_div(value(loop.start.bound), loop.start.scale))
    if loop.stop is not None:
        hi = min(hi, ceil_div(value(loop.stop.bound), loop.stop.scale))
    return range(lo, hi)


@dataclass(frozen=True, slots=True)
class ZeroOut:
    tn: Tnode


@dataclass(frozen=True, slots=True)
class Set:
    tn: Tnode
    idcs: tuple[AxisIndex, ...]
    llsc: "LLScalar"
    debug: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class SetFromVec:
    """Writes `length` consecutive cells along the last axis, starting at `idcs`."""

    tn: Tnode
    idcs: tuple[AxisIndex, ...]
    length: int
    vec_unop: ops.VecUnop
    arg: "LLScalar"
    debug: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class SetLocal:
    id: ScopeId
    value: "LLScalar"


LLStmt = Noop | Comment | StagedCompilation | Seq | ForLoop | ZeroOut | Set | SetFromVec | SetLocal


# ---------------------------------------------------------------- scalars


@dataclass(frozen=True, slots=True)
class LocalScope:
    """A statement block computing one scalar into a local variable, used as an expression."""

    id: ScopeId
    body: LLStmt
    orig_indices: tuple[AxisIndex, ...]


@dataclass(frozen=True, slots=True)
class GetLocal:
    id: ScopeId


@dataclass(frozen=True, slots=True)
class Get:
    tn: Tnode
    idcs: tuple[AxisIndex, ...]


@dataclass(frozen=True, slots=True)
class GetMergeBuffer:
    """A read from the merge buffer holding a copy of `tn` from another device."""

    tn: Tnode
    idcs: tuple[AxisIndex, ...]


@dataclass(frozen=True, slots=True)
class Ternop:
    op: ops.Ternop
    arg1: "LLScalar"
    arg2: "LLScalar"
    arg3: "LLScalar"


@dataclass(frozen=True, slots=True)
class Binop:
    op: ops.Binop
    arg1: "LLScalar"
    arg2: "LLScalar"


@dataclass(frozen=True, slots=True)
class Unop:
    op: ops.Unop
    arg: "LLScalar"


@dataclass(frozen=True, slots=True)
class Constant:
    value: float


@dataclass(frozen=True, slots=True)
class ConstantBits:
    """An exact integer constant (bit patterns, counters): never rounded through a float."""

    bits: int


@dataclass(frozen=True, slots=True)
class EmbedIndex:
    idx: AxisIndex


LLScalar = LocalScope | GetLocal | Get | GetMergeBuffer | Ternop | Binop | Unop | Constant | ConstantBits | EmbedIndex


# ---------------------------------------------------------------- helpers


def seq(*stmts: LLStmt) -> LLStmt:
    """A sequence without `Noop`s, built as a balanced tree so passes recurse shallowly."""
    items = [s for st in stmts for s in flatten(st)]
    return _balanced(items)


def _balanced(items: list[LLStmt]) -> LLStmt:
    if not items:
        return Noop()
    if len(items) == 1:
        return items[0]
    mid = len(items) // 2
    return Seq(_balanced(items[:mid]), _balanced(items[mid:]))


def flatten(stmt: LLStmt) -> PyIterator[LLStmt]:
    """The non-`Seq`, non-`Noop` statements of a sequence, in order (iteratively)."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        match s:
            case Seq(a, b):
                stack.append(b)
                stack.append(a)
            case Noop():
                pass
            case _:
                yield s


def scalar_children(sc: LLScalar) -> tuple[LLScalar, ...]:
    match sc:
        case Ternop(_, a, b, c):
            return (a, b, c)
        case Binop(_, a, b):
            return (a, b)
        case Unop(_, a):
            return (a,)
        case _:
            return ()


def map_operands(sc: LLScalar, f: Callable[[LLScalar], LLScalar]) -> LLScalar:
    """`sc` rebuilt with `f` applied to each operand of an operation (left to right, so passes
    with effects see operands in program order); any other scalar as it is. The one place a
    pass rebuilds an operation from its rewritten children."""
    match sc:
        case Unop(op, a):
            return Unop(op, f(a))
        case Binop(op, a, b):
            return Binop(op, f(a), f(b))
        case Ternop(op, a, b, c):
            return Ternop(op, f(a), f(b), f(c))
    return sc


def block_statements(stmt: LLStmt) -> PyIterator[LLStmt]:
    """The statements of a block and of its loops (loops included), not those inside local
    scopes — which only ever set locals."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        match s:
            case Seq(a, b):
                stack.append(b)
                stack.append(a)
            case Noop():
                pass
            case ForLoop(body=body):
                yield s
                stack.append(body)
            case _:
                yield s


def deep_parts(root: "LLStmt | LLScalar") -> "PyIterator[LLStmt | LLScalar]":
    """Every statement and every expression under `root`, local-scope bodies included, pre-order.

    Inlining nests computations inside each other, so code gets as deep as the longest chain
    of virtual nodes; an explicit stack keeps the walk linear in the size of the code whatever
    its depth (nested generators would cost the depth at every step, and recursion would hit
    Python's limit)."""
    stack: list = [root]
    while stack:
        x = stack.pop()
        match x:
            case Seq(a, b):
                stack.append(b)
                stack.append(a)
                continue
            case Noop():
                continue
        yield x
        match x:
            case ForLoop(body=body) | LocalScope(body=body):
                stack.append(body)
            case Set(llsc=sc) | SetFromVec(arg=sc) | SetLocal(value=sc):
                stack.append(sc)
            case _:
                stack.extend(reversed(scalar_children(x)))


_STMT_TYPES = (Comment, StagedCompilation, ForLoop, ZeroOut, Set, SetFromVec, SetLocal)


def iter_stmts(stmt: LLStmt) -> PyIterator[LLStmt]:
    """Every statement, including those nested in loops and local scopes, pre-order."""
    return (x for x in deep_parts(stmt) if isinstance(x, _STMT_TYPES))


def iter_scalars(sc: LLScalar) -> PyIterator[LLScalar]:
    """The scalar and its sub-expressions (not descending into local scope bodies)."""
    stack = [sc]
    while stack:
        s = stack.pop()
        yield s
        stack.extend(scalar_children(s))


_remembered: ContextVar[dict[int, tuple[LLStmt, tuple[Tnode, ...]]] | None] = ContextVar(
    "einjit_remembered_nodes", default=None)


@contextlib.contextmanager
def remembered_nodes() -> PyIterator[None]:
    """Inside, `nodes_of` walks each statement once: a compile asks for the nodes of the same
    top-level statements in many passes (local storage, scratch planning, layout, rendering,
    the program cache: nine walks of the whole 12-block GPT-2 step). Statements are
    immutable, so an answer stays right while the statement lives; the memo holds each one
    it answers for, so that its id is not reused, and is dropped on leaving (nested uses
    share the outer memo)."""
    if _remembered.get() is not None:
        yield
        return
    token = _remembered.set({})
    try:
        yield
    finally:
        _remembered.reset(token)


def nodes_of(stmt: LLStmt) -> list[Tnode]:
    """Every tensor node the code touches, in order of first appearance."""
    memo = _remembered.get()
    if memo is None:
        return list(_nodes_of(stmt))
    seen: dict[int, Tnode] = {}
    for s in flatten(stmt):
        hit = memo.get(id(s))
        if hit is None or hit[0] is not s:
            hit = memo[id(s)] = (s, _nodes_of(s))
        for tn in hit[1]:
            seen.setdefault(tn.id, tn)
    return list(seen.values())


def _nodes_of(stmt: LLStmt) -> tuple[Tnode, ...]:
    seen: dict[int, Tnode] = {}
    for x in deep_parts(stmt):
        match x:
            case Set(tn=tn, idcs=idcs) | SetFromVec(tn=tn, idcs=idcs) | Get(tn, idcs) | GetMergeBuffer(tn, idcs):
                for g in gather_indices(idcs):
                    seen.setdefault(g.ids.id, g.ids)
                seen.setdefault(tn.id, tn)
            case ZeroOut(tn):
                seen.setdefault(tn.id, tn)
            case LocalScope(id=sid):
                seen.setdefault(sid.tn.id, sid.tn)
    return tuple(seen.values())


def flat_coefficients(tn: Tnode, idcs: tuple[AxisIndex, ...]) -> dict[Symbol, int] | None:
    """The row-major offset of the cell `tn[idcs]` as a coefficient per loop symbol (fixed
    indices add a constant, left out); None when an index is read at run time or a sub-axis."""
    coeffs: dict[Symbol, int] = {}
    for stride, idx in zip(row_major_strides(tn.dims), idcs, strict=True):
        match idx:
            case FixedIdx():
                pass
            case IndexIterator(s):
                coeffs[s] = coeffs.get(s, 0) + stride
            case Affine(terms):
                for c, s in terms:
                    coeffs[s] = coeffs.get(s, 0) + c * stride
            case _:
                return None
    return coeffs


def row_major_strides(dims: tuple[int, ...]) -> list[int]:
    """The element strides of a C-contiguous array of shape `dims`."""
    out, acc = [], 1
    for d in reversed(dims):
        out.append(acc)
        acc *= d
    return list(reversed(out))


# ---------------------------------------------------------------- printing


def _idx(idcs: tuple[AxisIndex, ...]) -> str:
    return ", ".join(repr(i) for i in idcs)


def scalar_to_doc(sc: LLScalar, cstyle: bool = False, indent: str = "") -> str:
    match sc:
        case LocalScope(id=sid, body=body):
            inner = stmt_to_doc(body, cstyle, indent + "  ")
            return f"({sid!r} := 0;\n{inner}{indent}  {sid!r})" if not cstyle else \
                f"({{ {sid.tn.prec.computed_in.c_type} {sid!r} = 0;\n{inner}{indent}  {sid!r}; }})"
        case GetLocal(sid):
            return repr(sid)
        case Get(tn, idcs):
            return f"{tn.name}[{_idx(idcs)}]"
        case GetMergeBuffer(tn, idcs):
            return f"merge_buffer({tn.name})[{_idx(idcs)}]"
        case Ternop(op, a, b, c):
            args = [scalar_to_doc(x, cstyle, indent) for x in (a, b, c)]
            if cstyle:
                return op.c_template.format(*args, f="")
            return f"{op.symbol}({', '.join(args)})"
        case Binop(op, a, b):
            x, y = scalar_to_doc(a, cstyle, indent), scalar_to_doc(b, cstyle, indent)
            if cstyle:
                return op.c_template.format(x, y, f="")
            if op.infix.isalnum() or op in (ops.Binop.MAX, ops.Binop.MIN, ops.Binop.ARG1, ops.Binop.ARG2):
                return f"{op.symbol}({x}, {y})"
            return f"({x} {op.infix} {y})"
        case Unop(op, a):
            x = scalar_to_doc(a, cstyle, indent)
            if cstyle:
                return op.c_template.format(x, f="")
            return x if op is ops.Unop.IDENTITY else f"{op.symbol}({x})"
        case Constant(v):
            return repr(float(v))
        case ConstantBits(b):
            return f"{b}"
        case EmbedIndex(i):
            return f"({i!r})"
    raise TypeError(f"not a low-level scalar: {sc!r}")


def stmt_to_doc(stmt: LLStmt, cstyle: bool = False, indent: str = "") -> str:
    out: list[str] = []
    for s in flatten(stmt):
        match s:
            case Comment(msg):
                out.append(f"{indent}/* {msg} */\n")
            case StagedCompilation(render):
                out.append(f"{indent}{render()}\n")
            case ForLoop(index, from_, to_, body, trace_it, unroll, parallel, keep_order, start, stop, prefetch):
                clips = "".join(f" ({what} {clip.scale}*{index!r} {rel} {clip.bound!r})"
                                for what, rel, clip in (("start", ">=", start), ("stop", "<", stop)) if clip)
                clips += "".join(f" (prefetch{' for write' if p.write else ''} {p.tn.name}[{_idx(p.idcs)}] + {p.ahead})"
                                 for p in prefetch)
                note = ("" if trace_it else " (untraced)") + (" (unrolled)" if unroll else "") + \
                    (" (parallel)" if parallel else "") + (" (order kept)" if keep_order else "") + clips
                head = (f"for (int {index!r} = {from_}; {index!r} <= {to_}; ++{index!r}) {{"
                        + (" /* order kept */" if keep_order else "") + (f" /*{clips} */" if clips else "") if cstyle
                        else f"for {index!r} = {from_} to {to_}{note} {{")
                out.append(f"{indent}{head}\n{stmt_to_doc(body, cstyle, indent + '  ')}{indent}}}\n")
            case ZeroOut(tn):
                out.append(f"{indent}zero_out({tn.name});\n")
            case Set(tn, idcs, llsc, debug):
                rhs = scalar_to_doc(llsc, cstyle, indent)
                eq = "=" if cstyle else ":="
                note = f" /* {debug} */" if debug and cstyle else ""
                out.append(f"{indent}{tn.name}[{_idx(idcs)}] {eq} {rhs};{note}\n")
            case SetFromVec(tn, idcs, length, vec_unop, arg, _):
                out.append(f"{indent}{tn.name}[{_idx(idcs)} : +{length}] := "
                           f"{vec_unop.symbol}({scalar_to_doc(arg, cstyle, indent)});\n")
            case SetLocal(sid, value):
                eq = "=" if cstyle else ":="
                out.append(f"{indent}{sid!r} {eq} {scalar_to_doc(value, cstyle, indent)};\n")
            case _:
                raise TypeError(f"not a low-level statement: {s!r}")
    return "".join(out)


def to_doc(stmt: LLStmt) -> str:
    """The `%cd`-like rendering used in debug output and golden tests."""
    return stmt_to_doc(stmt, cstyle=False)


def to_doc_cstyle(stmt: LLStmt) -> str:
    """A C-like rendering, close to what the C backend emits."""
    return stmt_to_doc(stmt, cstyle=True)
