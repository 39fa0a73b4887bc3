"""Building and reading loop nests around one scalar statement: what the scheduling stage's
rewrites (`schedule.py`, `schedule_conv.py`) share to take a nest apart and build new ones."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

from einjit.ir import low_level as ll
from einjit.ir import ops, provenance
from einjit.ir.indexing import AxisIndex, Iterator, Symbol, get_symbol, index_symbols, make_affine, subst_index
from einjit.ir.tnode import LOCAL, Tnode


def reads(sc: ll.LLScalar, tn: Tnode) -> bool:
    """Whether `sc` reads `tn` (its own array or its merge buffer): a term reading the node a
    nest accumulates into cannot be moved or split like the others."""
    return any(isinstance(x, (ll.Get, ll.GetMergeBuffer)) and x.tn is tn for x in ll.iter_scalars(sc))


def symbols(sc: ll.LLScalar) -> set[Symbol]:
    """The loop symbols `sc` depends on: which loops an operand varies along decides which
    operand is packed and which loops its panel is filled inside."""
    out: set[Symbol] = set()
    for x in ll.iter_scalars(sc):
        match x:
            case ll.Get(_, idcs) | ll.GetMergeBuffer(_, idcs):
                out.update(s for idx in idcs for s in index_symbols(idx))
            case ll.EmbedIndex(idx):
                out.update(index_symbols(idx))
    return out


def subst(sc: ll.LLScalar, env: dict[Symbol, AxisIndex]) -> ll.LLScalar:
    """`sc` with loop symbols replaced by indices, to read an operand from a block, a panel or
    a lane instead of the original loop. Local scopes are not entered: the rewrites take only
    nests without them (`interchange.reorderable`)."""
    match sc:
        case ll.Get(tn, idcs):
            return ll.Get(tn, tuple(subst_index(env, i) for i in idcs))
        case ll.GetMergeBuffer(tn, idcs):
            return ll.GetMergeBuffer(tn, tuple(subst_index(env, i) for i in idcs))
        case ll.EmbedIndex(idx):
            return ll.EmbedIndex(subst_index(env, idx))
        case ll.Unop() | ll.Binop() | ll.Ternop():
            return ll.map_operands(sc, lambda x: subst(x, env))
    return sc


def read_from(stmt: ll.LLStmt, nodes: dict[Tnode, Tnode], *, notes: bool = False) -> ll.LLStmt:
    """`stmt` reading `nodes[t]` wherever it read a node `t` of `nodes` (its writes unchanged).
    With `notes`, the statements' comments name `nodes[t]` where they named `t`: the copies
    stage drops `t`, and a comment naming it would point the reader of the C at nothing."""
    return retarget(stmt, nodes, notes=notes)


def retarget(stmt: ll.LLStmt, nodes: dict[Tnode, Tnode], *, writes: bool = False, notes: bool = False,
             at: Callable[[tuple[AxisIndex, ...]], tuple[AxisIndex, ...]] | None = None) -> ll.LLStmt:
    """`stmt` accessing `nodes[t]` at `at(idcs)` wherever it read `t` at `idcs` — and wrote it,
    with `writes` — for each node `t` of `nodes` (`at` None: the same indices). What the copies
    stage, bf16's shared widening and row buffers (a node shrunk to a row) share; `notes` as
    in `read_from`."""
    return _Retarget(nodes, writes, notes, at).walk(stmt)


@dataclass(frozen=True, slots=True)
class _Retarget:
    """One `retarget` call. A class, not closures calling themselves: those are reference
    cycles, and a compile left hundreds of them to the cyclic collector."""

    nodes: dict[Tnode, Tnode]
    writes: bool
    notes: bool
    at: Callable[[tuple[AxisIndex, ...]], tuple[AxisIndex, ...]] | None

    def moved(self, ix: tuple[AxisIndex, ...]) -> tuple[AxisIndex, ...]:
        return ix if self.at is None else self.at(ix)

    def note(self, debug: str) -> str:
        if not self.notes or not debug:
            return debug
        for old, new in self.nodes.items():
            debug = re.sub(rf"\b{re.escape(old.name)}\b", new.name, debug)
        return debug

    def sc(self, x: ll.LLScalar) -> ll.LLScalar:
        match x:
            case ll.Get(tn, idcs) if tn in self.nodes:
                return ll.Get(self.nodes[tn], self.moved(idcs))
            case ll.LocalScope(sid, body, orig):
                return ll.LocalScope(sid, self.walk(body), orig)
        return ll.map_operands(x, self.sc)

    def walk(self, s: ll.LLStmt) -> ll.LLStmt:
        nodes, writes, sc, note = self.nodes, self.writes, self.sc, self.note
        match s:
            case ll.Seq(a, b):
                return ll.Seq(self.walk(a), self.walk(b))
            case ll.ForLoop(body=body):
                return dataclasses.replace(s, body=self.walk(body))
            case ll.Set(tn, idcs, value, debug) if writes and tn in nodes:
                return ll.Set(nodes[tn], self.moved(idcs), sc(value), note(debug))
            case ll.Set(llsc=value, debug=debug):
                return dataclasses.replace(s, llsc=sc(value), debug=note(debug))
            case ll.SetFromVec(tn=tn, idcs=idcs, arg=value, debug=debug) if writes and tn in nodes:
                return dataclasses.replace(s, tn=nodes[tn], idcs=self.moved(idcs), arg=sc(value), debug=note(debug))
            case ll.SetFromVec(arg=value, debug=debug):
                return dataclasses.replace(s, arg=sc(value), debug=note(debug))
            case ll.ZeroOut(tn) if writes and tn in nodes:
                return ll.ZeroOut(nodes[tn])
            case ll.SetLocal(value=value):
                return dataclasses.replace(s, value=sc(value))
        return s


def whole_loops(stmt: ll.LLStmt) -> tuple[dict[Symbol, int], ll.LLStmt] | None:
    """The extents of the perfect nest of loops around `stmt`'s innermost body, and that body,
    when every loop runs unclipped from 0 (a body that is not a loop has none); None otherwise."""
    extent: dict[Symbol, int] = {}
    while isinstance(stmt, ll.ForLoop):
        if stmt.start is not None or stmt.stop is not None or stmt.from_ != 0:
            return None
        extent[stmt.index] = stmt.to_ + 1
        stmt = stmt.body
    return extent, stmt


def identity_copy(stmt: ll.LLStmt) -> tuple[Tnode, Tnode] | None:
    """`(copy, source)` when `stmt` copies all of a node into another of its dims, cell by cell
    at the same index (in its precision: a copy, a rounding or a widening): a perfect nest of
    unclipped loops from 0, in any order, one per axis over the whole of it. The copies stage
    drops such nests, bf16's stages share and fold them."""
    whole = whole_loops(stmt)
    if whole is None:
        return None
    extent, stmt = whole
    match stmt:
        case ll.Set(x, idcs, ll.Get(y, src)) if idcs == src and x is not y and x.dims == y.dims:
            symbols = [idx.symbol for idx in idcs if isinstance(idx, Iterator)]
            if (len(symbols) == len(idcs) == len(extent) == len(set(symbols))
                    and all(extent.get(s) == d for s, d in zip(symbols, x.dims, strict=True))):
                return x, y
    return None


def nest(loops: list[tuple[Symbol, int]], body: ll.LLStmt, unrolled: frozenset[Symbol] = frozenset(),
         parallel: Symbol | None = None) -> ll.LLStmt:
    """Loops `(symbol, extent)` from 0, outermost first, around `body`; those in `unrolled`
    marked for complete unrolling, the one named `parallel` for threads."""
    for s, n in reversed(loops):
        body = ll.ForLoop(s, 0, n - 1, body, unroll=s in unrolled, parallel=s == parallel)
    return body


def scheduler_local(label: str, dims: tuple[int, ...], prec: ops.Prec) -> Tnode:
    """A node the scheduler introduces (a packed panel, an accumulator block, partial sums):
    local to the routine, with the provenance that says so in memory reports and errors."""
    return Tnode(label, dims, prec, memory_mode=LOCAL, provenance=provenance.SCHEDULED_LOCAL)


def unit_stride_axis_symbol(tn: Tnode, idcs: tuple[AxisIndex, ...]) -> Symbol | None:
    """The loop symbol indexing the innermost axis of `tn[idcs]` longer than one, when that
    index is a plain iterator: the loop along which the access is contiguous."""
    for d, idx in reversed(list(zip(tn.dims, idcs, strict=True))):
        if d == 1:
            continue
        return idx.symbol if isinstance(idx, Iterator) else None
    return None


VECTOR_PRECS = (ops.single, ops.double)
"""The precisions a register block is stored as vectors in (the C backend's vector types)."""

VECTOR_BINOPS = (ops.Binop.ADD, ops.Binop.SUB, ops.Binop.MUL)
"""The binary operations a loop over a block's lanes may compute as vectors, besides FMA."""


def vector_ops_only(sc: ll.LLScalar, prec: ops.Prec, lane: Symbol | None = None) -> bool:
    """Whether `sc` is made of reads in `prec`, constants, FMAs and `VECTOR_BINOPS` only: what
    the C backend computes on whole vectors (anything else would address single lanes). With
    `lane`, a read stored narrower but computed in `prec` (bf16 in a float block) that does
    not depend on `lane` counts too: the C backend widens it once and broadcasts it (a vector
    load would take its cells for floats)."""
    for x in ll.iter_scalars(sc):
        match x:
            case ll.Get(tn) if tn.prec is prec:
                pass
            case ll.Get(tn, idcs) if lane is not None and tn.prec.computed_in is prec \
                    and not any(lane in index_symbols(idx) for idx in idcs):
                pass
            case ll.Constant() | ll.Ternop(ops.Ternop.FMA):
                pass
            case ll.Binop(op) if op in VECTOR_BINOPS:
                pass
            case _:
                return False
    return True


@dataclass(frozen=True)
class RegisterBlock:
    """A block of accumulators, `rows` × `width` cells, that gcc must keep in registers.

    With `lanes` > 1 it is stored as `width // lanes` vectors per row: dims `(rows, width //
    lanes, lanes)`, provenance `REGISTER_BLOCK`. The C backend declares it as an array of
    vectors and renders each loop over its lanes as one vector operation; once the row and
    vector loops are unrolled every index is a constant and gcc -O2 keeps the array in vector
    registers. A float array whose column loop gcc vectorized itself stays in memory at -O2
    (on AVX2 one accumulator of a 4×16 block went through the stack at every step, a
    store-to-load chain that ran `a @ b` at a quarter of the FMA peak). With `lanes` == 1 (a
    width no vector divides, half precision) it is a plain `(rows, width)` local.

    A cell's column is `column`: `lanes*vector + lane`, or `col` itself with one lane; `at`
    indexes the block, `loops` runs over a row's columns (the vector loop unrolled)."""

    node: Tnode
    lanes: int
    col: Symbol
    vector: Symbol
    lane: Symbol

    @property
    def width(self) -> int:
        return self.node.dims[1] * self.node.dims[2] if self.lanes > 1 else self.node.dims[1]

    @property
    def column(self) -> AxisIndex:
        return make_affine(((self.lanes, self.vector), (1, self.lane))) if self.lanes > 1 else Iterator(self.col)

    def at(self, row: AxisIndex) -> tuple[AxisIndex, ...]:
        return (row, Iterator(self.vector), Iterator(self.lane)) if self.lanes > 1 else (row, Iterator(self.col))

    def loops(self) -> list[tuple[Symbol, int]]:
        if self.lanes == 1:
            return [(self.col, self.width)]
        return [(self.vector, self.width // self.lanes), (self.lane, self.lanes)]

    @property
    def unrolled(self) -> frozenset[Symbol]:
        return frozenset({self.vector})

    def by_column(self, sc: ll.LLScalar) -> ll.LLScalar:
        """`sc`, written with `col` for the column, reading along the block's `column`."""
        return subst(sc, {self.col: self.column})

    def cell(self, idcs: tuple[AxisIndex, ...]) -> tuple[AxisIndex, ...]:
        return tuple(subst_index({self.col: self.column}, idx) for idx in idcs)


def vector_lanes(width: int, prec: ops.Prec, vector_bytes: int) -> int:
    """The lanes of a register block's vectors: the largest power of two dividing `width`, at
    most a machine vector; 1 where no vector of two or more lanes fits."""
    if prec not in VECTOR_PRECS:
        return 1
    lanes = width & -width
    lanes = min(lanes, max(1, vector_bytes // prec.itemsize))
    return lanes if lanes >= 2 else 1


def one_vector(label: str, lanes: int, prec: ops.Prec) -> Tnode:
    """A register block of one vector of `lanes` lanes, dims `(1, 1, lanes)`."""
    return Tnode(label, (1, 1, lanes), prec, memory_mode=LOCAL, provenance=provenance.REGISTER_BLOCK)


def register_block(rows: int, width: int, prec: ops.Prec, vector_bytes: int, col: Symbol,
                   label: str = "acc") -> RegisterBlock:
    """An accumulator block of `rows` × `width` cells whose columns loops over `col` address;
    `vector_bytes` 0 keeps it scalar."""
    lanes = vector_lanes(width, prec, vector_bytes) if vector_bytes else 1
    if lanes == 1:
        node = scheduler_local(label, (rows, width), prec)
    else:
        node = Tnode(label, (rows, width // lanes, lanes), prec, memory_mode=LOCAL,
                     provenance=provenance.REGISTER_BLOCK)
    return RegisterBlock(node, lanes, col, get_symbol("jv"), get_symbol("jl"))
