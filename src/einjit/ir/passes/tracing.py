"""Tracing, the first pass of `optimize_proc` (seed 000, `visit_llc`).

The code is executed symbolically: loops run (at most `max_tracing_dim` of their first
iterations), indices become concrete positions, and every write and read of every tensor node
is recorded. The result is a `TracedArray` per node plus `reverse_node_map`, the loop symbols
each node's writes are indexed by. Tracing decides nothing; `virtualize.decide_from_trace` and
`virtualize.virtual_llc` turn these facts into memory modes.

Unrolling only a prefix of each loop keeps tracing cheap while still seeing the access
pattern of the whole nest: a node read twice at one position, or read before it is written,
shows in the first iterations already.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import (
    Affine,
    AxisIndex,
    FixedIdx,
    GatherIdx,
    Iterator,
    Symbol,
    gather_indices,
    index_symbols,
)
from einjit.ir.structure import structure
from einjit.ir.tnode import Tnode

Position = tuple[int, ...]


class Recurrent(enum.Enum):
    """The visit count of a position read before anything wrote it (the node is an input)."""

    RECURRENT = "recurrent"

    def __repr__(self) -> str:
        return "RECURRENT"


RECURRENT = Recurrent.RECURRENT
Visits = int | Recurrent


@dataclass(frozen=True, slots=True)
class VirtualizeSettings:
    """What the optimizer may do (seed 000, `virtualize_settings`).

    `max_visits`: a node whose cell is read more often than this stays materialized, unless its
    computation is simple enough to recompute for free (see `inline_simple_computations`) or
    costs no more memory traffic to recompute than to read (`inline_broadcast_arithmetic`).
    `max_tracing_dim`: how many iterations of each loop tracing executes.
    `max_tracing_nest`: how many iterations of a whole loop nest tracing executes, about: once
    the enclosing loops' traced iterations reach it, inner loops run only their first two
    iterations (enough to see a cell read twice). Without it a 7-deep convolution nest traces
    5^7 iterations, and tracing dominated the compile time of convolutional models; at 125
    rather than 25 it still took 0.18 s of the MNIST-size convnet step's compile (0.07 s now),
    for the same generated code.
    `enable_device_only`: nodes the optimizer materializes may live on the device only; when
    False they are made hosted, so every intermediate result can be read from the host.
    `inline_scalar_constexprs`: inline scalar constant expressions however often they are read.
    `inline_simple_computations`: inline computations made of a single read, index embeddings
    and scalar constant expressions however often they are read.
    `inline_broadcast_arithmetic`: inline however often they are read the pointwise `+ - *` of
    one full-size operand and broadcast ones (`x - mean[row]`), whose recomputation reads no
    more memory than reading them would (`ir/passes/recompute.py`).
    `inline_complex_computations`: inline computations that loop over a reduction; off by
    default because without common-subexpression elimination each read replays the loop.
    `inline_single_use_reductions`: inline a reduction anyway when no cell of it is read more
    than once — a row sum read by one pointwise consumer — since the loop then runs once per
    cell, as it would stored; only when it is no contraction (which the scheduling stage
    blocks as its own nest) and its innermost loop reads memory contiguously (see
    `TracedArray.is_local_reduction`).
    `virtualize` / `simplify`: switch the two transformations off, to compare with the
    unoptimized program.
    `schedule` / `interchange`: the CPU loop stages (`ir/sched/schedule.py`, `ir/sched/interchange.py`);
    backends that map loops to threads themselves (CUDA) use the code before them.
    `fuse`: the CPU loop fusion stage (`ir/sched/fusion.py`), which fuses consecutive nests over
    the same ranges (bit-identical; off to see one nest per node, e.g. in the profiler).
    `reassociate`: the scheduling stage may split a float reduction into independent partial
    sums (vector lanes, blocked summation), which changes rounding — usually for the better —
    but makes results differ from sequential summation in the last bits. Only that stage ever
    reassociates; turn it off for results bit-identical to the unscheduled program.
    `causal`: the CPU stage clipping loops to a causal mask's triangle (`ir/sched/causal.py`):
    results are those of the full loops; off, to compare with them.
    `local_storage`: a stored node that one routine writes before reading, and that no other
    routine compiled so far uses, becomes routine-local (`ir/passes/local_storage.py`): declared in
    the generated function instead of kept in the context between calls.
    """

    max_visits: int = 1
    max_tracing_dim: int = 5
    max_tracing_nest: int = 25
    enable_device_only: bool = True
    inline_scalar_constexprs: bool = True
    inline_simple_computations: bool = True
    inline_broadcast_arithmetic: bool = True
    inline_complex_computations: bool = False
    inline_single_use_reductions: bool = True
    virtualize: bool = True
    simplify: bool = True
    schedule: bool = True
    interchange: bool = True
    fuse: bool = True
    reassociate: bool = True
    causal: bool = True
    local_storage: bool = True

    def __post_init__(self) -> None:
        if self.max_visits < 0:
            raise ValueError(f"einjit: max_visits must be >= 0, got {self.max_visits}")
        if self.max_tracing_dim < 1:
            raise ValueError(f"einjit: max_tracing_dim must be >= 1, got {self.max_tracing_dim}")
        if self.max_tracing_nest < 1:
            raise ValueError(f"einjit: max_tracing_nest must be >= 1, got {self.max_tracing_nest}")


@dataclass(slots=True, eq=False)
class TracedArray:
    """What tracing learned about one tensor node. Mutable: it is filled in as the trace runs.

    `assignments`: positions written. `written_boxes`: per axis `(lo, hi)` ranges of cells that
    loop iterations tracing skipped have written (exact: only for writes indexed by distinct
    loop symbols and fixed indices), so that a later read of such a cell is not taken for a
    read before write (a set: a loop left partly untraced inside another traced loop records
    the same box once per outer iteration; boxes inside others are kept, as dropping them cost
    more than the reads that scan them). `accesses`: positions read, with how often, or `RECURRENT` when read
    before written. `zero_initialized_by_code`: the first thing the code
    does to the node is `ZeroOut`. `read_before_write`: some position is recurrent.
    `read_only`: never written nor zeroed here. `is_scalar_constexpr`: all dims are 1 and the
    node is assigned once, before any read, from constants and other scalar constexprs.
    `is_accessing`: its computation reads non-constexpr nodes. `is_simple`: every assignment is
    a single read, or a function of constants and index embeddings only — recomputing it costs
    no more than reading it. `is_complex`: an assignment sits in a loop (of more than one
    iteration) that does not index the node, i.e. a reduction: inlining it replays that loop at
    every read. `is_local_reduction`: in every reduction computing the node, a single node varies
    along the reduction loops (no contraction `a[i,k] * b[k,j]`), and the innermost reduction
    loop walks the last axis of size above one of what it reads (unit stride): inlined into its
    one consumer, the loop stays as cheap as stored. `run_time_indexed`: some access of the
    node goes through a `GatherIdx`, or the node holds the indices of one: which cells are
    touched is data, so the node cannot be inlined.
    """

    tn: Tnode
    assignments: set[Position] = field(default_factory=set)
    written_boxes: set[tuple[tuple[int, int], ...]] = field(default_factory=set)
    accesses: dict[Position, Visits] = field(default_factory=dict)
    zero_initialized_by_code: bool = False
    zeroed_out: bool = False
    read_before_write: bool = False
    read_only: bool = False
    is_scalar_constexpr: bool = False
    is_accessing: bool = False
    is_complex: bool = False
    is_simple: bool = True
    is_local_reduction: bool = True
    run_time_indexed: bool = False

    def is_written(self, pos: Position) -> bool:
        """Whether the code traced so far has written (or zeroed) the cell at `pos`."""
        return (self.zeroed_out or pos in self.assignments
                or any(all(lo <= p <= hi for p, (lo, hi) in zip(pos, box, strict=True)) for box in self.written_boxes))

    def max_visits(self) -> Visits:
        """The largest visit count of any position (`RECURRENT` dominates), 0 if never read."""
        if any(v is RECURRENT for v in self.accesses.values()):
            return RECURRENT
        return max((v for v in self.accesses.values() if not isinstance(v, Recurrent)), default=0)


@dataclass(frozen=True, slots=True)
class Trace:
    """The result of `visit_llc`. `reverse_node_map` maps a loop symbol to the node whose
    computation owns the loop: the first node written with that symbol in its indices or
    written inside the loop — so a reduction loop outside the loops of the written indices,
    or around a write at fixed indices, belongs to the computation too."""

    traced_store: dict[Tnode, TracedArray]
    reverse_node_map: dict[Symbol, Tnode]
    merge_node: Tnode | None


@dataclass(slots=True)
class _State:
    """What the trace has learned so far, changed only by `_apply`."""

    store: dict[Tnode, TracedArray] = field(default_factory=dict)
    reverse_node_map: dict[Symbol, Tnode] = field(default_factory=dict)
    merge_node: Tnode | None = None

    def node(self, tn: Tnode) -> TracedArray:
        ta = self.store.get(tn)
        if ta is None:
            ta = self.store[tn] = TracedArray(tn)
        return ta


_Spec = tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]
"""Indices compiled for tracing, per axis `(kind, value, terms)`: kind 0 is the constant
`value`, kind 1 the symbol of id `value`, kind 2 `value` plus the (coefficient, symbol id)
`terms`."""
Env = dict[int, int]
"""The values of the traced loop symbols, by symbol id (a `Symbol` hashes in Python code,
and tracing looks symbols up more than anything else)."""

_READ, _GATHERED, _SET, _SET_VEC, _ZERO, _OWN, _BOX, _MERGE = range(8)
"""What a traced statement does to the trace, as the first field of an event:
`(_READ, tn, position, reads_own_cell)`, `(_GATHERED, tn)` (accessed through run-time
indices), `(_SET, tn, position, value, first_visit, is_reduction, is_local_reduction)`,
`(_SET_VEC, tn, positions, value, first_visit, is_reduction)`, `(_ZERO, tn)`,
`(_OWN, tn, symbols)`, `(_BOX, tn, box)` (cells skipped iterations wrote), `(_MERGE, tn)`."""


def _compile(idcs: tuple[AxisIndex, ...]) -> _Spec:
    out: list[tuple[int, int, tuple[tuple[int, int], ...]]] = []
    for idx in idcs:
        match idx:
            case FixedIdx(i):
                out.append((0, i, ()))
            case Iterator(s):
                out.append((1, s.id, ()))
            case Affine(symbols, offset):
                out.append((2, offset, tuple((c, s.id) for c, s in symbols)))
            case _:
                out.append((0, 0, ()))
    return tuple(out)


def _evaluate(env: Env, spec: _Spec) -> Position:
    get = env.get
    out = []
    for kind, value, terms in spec:
        if kind == 1:
            out.append(get(value, 0))
        elif kind == 0:
            out.append(value)
        else:
            for c, sid in terms:
                value += c * get(sid, 0)
            out.append(value)
    return tuple(out)


def lookup(env: dict[Symbol, int], idcs: tuple[AxisIndex, ...]) -> Position:
    """Concrete position of `idcs`; symbols not bound by a traced loop (static ones) count as 0."""
    pos = []
    for idx in idcs:
        match idx:
            case FixedIdx(i):
                pos.append(i)
            case Iterator(s):
                pos.append(env.get(s, 0))
            case Affine(symbols, offset):
                pos.append(offset + sum(c * env.get(s, 0) for c, s in symbols))
            case _:
                pos.append(0)
    return tuple(pos)


def visit_llc(llc: ll.LLStmt, *, settings: VirtualizeSettings) -> Trace:
    """Trace `llc`: record every node's writes and reads, and derive the per-node facts.

    Each top-level statement is executed symbolically once per structure: statements that
    differ only in their nodes and symbols (the same layer in every block of a deep model)
    replay the events the first one recorded, on their own nodes and symbols. Executing is
    what costs (loops run, indices are evaluated); replaying costs one step per event, so the
    trace of a model of identical blocks takes little more than one block's execution."""
    st = _State()
    recorded: dict[Hashable, tuple[list[Tnode], list[Symbol], list[tuple]]] = {}
    for stmt in ll.flatten(llc):
        found = structure(stmt, _dims)
        known = recorded.get(found.key)
        if known is None:
            recorder = _Recorder(settings.max_tracing_dim, settings.max_tracing_nest)
            recorder.stmt(stmt, {}, (), True)
            known = recorded[found.key] = (found.nodes, found.symbols, recorder.events)
        _apply(st, known[2], dict(zip(known[0], found.nodes, strict=True)),
               dict(zip(known[1], found.symbols, strict=True)))
    for ta in st.store.values():
        ta.read_only = not ta.zeroed_out and not ta.assignments
        ta.read_before_write = any(v is RECURRENT for v in ta.accesses.values())
    return Trace(st.store, st.reverse_node_map, st.merge_node)


def _dims(tn: Tnode) -> tuple[int, ...]:
    """What tracing a statement depends on of a node besides its place in the code."""
    return tn.dims


def _is_scalar_dims(tn: Tnode) -> bool:
    return all(d == 1 for d in tn.dims)


@dataclass(slots=True)
class _Recorder:
    """Executes one top-level statement symbolically and records its effects on the trace as
    events, in program order. Nothing it records depends on what other statements did, so the
    events hold for any statement of the same structure."""

    max_tracing_dim: int
    max_tracing_nest: int
    events: list[tuple] = field(default_factory=list)
    write_templates: dict[int, tuple[ll.ForLoop, list]] = field(default_factory=dict)
    specs: dict[int, tuple[tuple[AxisIndex, ...], _Spec, tuple[GatherIdx, ...]]] = field(default_factory=dict)
    owned: set[tuple[int, ...]] = field(default_factory=set)
    flat: dict[int, tuple[ll.LLStmt, list[ll.LLStmt]]] = field(default_factory=dict)
    """Each block's statements (`ll.flatten`), by the block's id: a loop body is run once per
    traced iteration."""
    plain: dict[int, tuple[ll.LLScalar, list[tuple[Tnode, tuple[AxisIndex, ...]]] | None]] = field(
        default_factory=dict)
    """Per expression (by id): its reads in program order, when reading is all it does to the
    trace (no local scope, merge buffer or `where`); None otherwise."""

    def stmt(self, stmt: ll.LLStmt, env: Env, loops: tuple[tuple[Symbol, int], ...], first_visit: bool,
             traced: int = 1) -> None:
        """`loops` are the enclosing loops with their trip counts; `first_visit` holds during
        the first iteration of every enclosing loop, when per-computation facts are collected;
        `traced`: how many iterations of the enclosing loops tracing runs."""
        events = self.events
        flat = self.flat.get(id(stmt))
        if flat is None or flat[0] is not stmt:
            flat = self.flat[id(stmt)] = (stmt, list(ll.flatten(stmt)))
        for s in flat[1]:
            match s:
                case ll.ForLoop(index, from_, to_, body, trace_it):
                    count = self.max_tracing_dim if traced < self.max_tracing_nest else min(2, self.max_tracing_dim)
                    last = min(to_, from_ + count - 1) if trace_it else min(to_, from_)
                    inner = loops + ((index, to_ - from_ + 1),)
                    for v in range(from_, last + 1):
                        self.stmt(body, {**env, index.id: v}, inner, first_visit and v == from_,
                                  traced * (last - from_ + 1))
                    if last < to_:
                        self.skipped_writes(s, env)
                case ll.ZeroOut(tn):
                    events.append((_ZERO, tn))
                case ll.Set(tn, idcs, llsc, _):
                    pos = self.position(env, idcs)
                    self.gathered(tn, idcs, env)
                    self.scalar(llsc, env, (tn, pos))
                    if first_visit:
                        events.append((_SET, tn, pos, llsc, True, _is_reduction(loops, idcs),
                                       _is_local_reduction(tn, loops, idcs, llsc)))
                    else:
                        events.append((_SET, tn, pos, llsc, False, False, True))
                    self.own_symbols(s, tn, idcs, loops)
                case ll.SetFromVec(tn, idcs, length, _, arg, _):
                    pos = self.position(env, idcs)
                    self.scalar(arg, env, None)
                    cells = tuple(pos[:-1] + (pos[-1] + k,) if pos else pos for k in range(length))
                    events.append((_SET_VEC, tn, cells, arg, first_visit, first_visit and _is_reduction(loops, idcs)))
                    self.own_symbols(s, tn, idcs, loops)
                case ll.SetLocal(_, value):
                    self.scalar(value, env, None)
                case ll.Comment() | ll.StagedCompilation() | ll.Noop():
                    pass
                case _:
                    raise TypeError(f"not a low-level statement: {s!r}")

    def spec(self, idcs: tuple[AxisIndex, ...]) -> tuple[tuple[AxisIndex, ...], _Spec, tuple[GatherIdx, ...]]:
        """Compiled indices and their run-time indices, cached per index tuple of the code."""
        hit = self.specs.get(id(idcs))
        if hit is None:
            hit = self.specs[id(idcs)] = (idcs, _compile(idcs), tuple(gather_indices(idcs)))
        return hit

    def position(self, env: Env, idcs: tuple[AxisIndex, ...]) -> Position:
        """`lookup` on compiled indices. A run-time index counts as cell 0 of its axis."""
        return _evaluate(env, self.spec(idcs)[1])

    def gathered(self, tn: Tnode, idcs: tuple[AxisIndex, ...], env: Env) -> None:
        """An access of `tn` at `idcs` that goes through run-time indices: `tn` and the ids
        arrays are marked, and each read of an ids array is counted as a read."""
        found = self.spec(idcs)[2]
        if not found:
            return
        self.events.append((_GATHERED, tn))
        for g in found:
            self.events.append((_READ, g.ids, self.position(env, g.idcs), False))
            self.events.append((_GATHERED, g.ids))

    def scalar(self, sc: ll.LLScalar, env: Env, own: tuple[Tnode, Position] | None) -> None:
        plain = self.plain.get(id(sc))
        if plain is None or plain[0] is not sc:
            plain = self.plain[id(sc)] = (sc, _plain_reads(sc))
        if plain[1] is not None:
            events = self.events
            for tn, idcs in plain[1]:
                self.gathered(tn, idcs, env)
                pos = self.position(env, idcs)
                events.append((_READ, tn, pos, own is not None and own[0] is tn and own[1] == pos))
            return
        match sc:
            case ll.Get(tn, idcs):
                self.gathered(tn, idcs, env)
                pos = self.position(env, idcs)
                self.events.append((_READ, tn, pos, own is not None and own[0] is tn and own[1] == pos))
            case ll.GetMergeBuffer(tn, _):
                self.events.append((_MERGE, tn))
            case ll.LocalScope(_, body, _):
                self.stmt(body, env, (), True)
            case ll.Ternop(ops.Ternop.WHERE, cond, then, other):
                self.scalar(cond, env, own)
                taken = _index_condition(cond, env)
                if taken is None or taken:
                    self.scalar(then, env, own)
                if taken is None or not taken:
                    self.scalar(other, env, own)
            case _:
                for child in ll.scalar_children(sc):
                    self.scalar(child, env, own)

    def skipped_writes(self, loop: ll.ForLoop, env: Env) -> None:
        """After a loop whose iterations were not all traced: the box of cells each write in
        it covers over all its iterations (enclosing loops at their current values)."""
        for tn, template, length in self.templates(loop):
            box = []
            for spec in template:
                if isinstance(spec, int):
                    if spec not in env:
                        break
                    box.append((env[spec], env[spec]))
                else:
                    box.append(spec)
            else:
                if box:
                    box[-1] = (box[-1][0], box[-1][1] + length - 1)
                self.events.append((_BOX, tn, tuple(box)))

    def templates(self, loop: ll.ForLoop) -> list[tuple[Tnode, _Template, int]]:
        """The writes inside `loop` whose box tracing can record, each as the per-axis ranges
        over the loops inside `loop`, or the id of the enclosing loop symbol whose current
        value it takes. A loop is typically left partly untraced once per iteration of its
        enclosing loops, so this is computed once per loop."""
        cached = self.write_templates.get(id(loop))
        if cached is not None:
            return cached[1]
        out: list[tuple[Tnode, _Template, int]] = []
        _write_templates(loop, {}, out)
        self.write_templates[id(loop)] = (loop, out)
        return out

    def own_symbols(self, stmt: ll.LLStmt, tn: Tnode, idcs: tuple[AxisIndex, ...],
                    loops: tuple[tuple[Symbol, int], ...]) -> None:
        """The loop symbols `tn` owns. Only a statement's first execution in a nest of loops
        can add any: its later ones meet the same symbols, already taken."""
        key = (id(stmt), *(sym.id for sym, _ in loops))
        if key in self.owned:
            return
        self.owned.add(key)
        syms = [s for idx in idcs for s in index_symbols(idx)] + [s for s, _ in loops]
        self.events.append((_OWN, tn, tuple(syms)))


_Template = tuple["tuple[int, int] | int", ...]


def _write_templates(stmt: ll.LLStmt, ranges: dict[Symbol, tuple[int, int]],
                     out: list[tuple[Tnode, _Template, int]]) -> None:
    """`_Recorder.templates` of the writes in `stmt`, inside loops over `ranges`, into `out`."""
    for s in ll.flatten(stmt):
        match s:
            case ll.ForLoop(index, from_, to_, body, _) if from_ <= to_:
                _write_templates(body, {**ranges, index: (from_, to_)}, out)
            case ll.Set(tn, idcs, _, _):
                _add_template(tn, idcs, ranges, 1, out)
            case ll.SetFromVec(tn, idcs, length, _, _, _):
                _add_template(tn, idcs, ranges, length, out)


def _add_template(tn: Tnode, idcs: tuple[AxisIndex, ...], ranges: dict[Symbol, tuple[int, int]], length: int,
                  out: list[tuple[Tnode, _Template, int]]) -> None:
    template: list[tuple[int, int] | int] = []
    for idx in idcs:
        match idx:
            case FixedIdx(i):
                template.append((i, i))
            case Iterator(sym):
                template.append(ranges.get(sym, sym.id))
            case _:
                return
    syms = [idx.symbol for idx in idcs if isinstance(idx, Iterator)]
    if len(syms) == len(set(syms)):
        out.append((tn, tuple(template), length))


def _plain_reads(sc: ll.LLScalar) -> list[tuple[Tnode, tuple[AxisIndex, ...]]] | None:
    """The reads of `sc` in the order `_Recorder.scalar` visits them, or None when it holds
    a local scope, a merge buffer read or a `where` (which `scalar` follows case by case)."""
    out = []
    stack = [sc]
    while stack:
        x = stack.pop()
        match x:
            case ll.Get(tn, idcs):
                out.append((tn, idcs))
            case ll.LocalScope() | ll.GetMergeBuffer() | ll.Ternop(ops.Ternop.WHERE):
                return None
            case _:
                stack.extend(reversed(ll.scalar_children(x)))
    return out


def _apply(st: _State, events: list[tuple], nodes: dict[Tnode, Tnode], symbols: dict[Symbol, Symbol]) -> None:
    """Replay recorded `events` on the trace, on the nodes and symbols `nodes` and `symbols`
    map the recorded ones to."""
    store = st.store
    for ev in events:
        op = ev[0]
        if op == _READ:
            tn = nodes[ev[1]]
            ta = store.get(tn) or st.node(tn)
            pos = ev[2]
            accesses = ta.accesses
            if not (ta.zeroed_out or pos in ta.assignments or (ta.written_boxes and ta.is_written(pos))):
                accesses[pos] = RECURRENT
            elif not ev[3]:
                old = accesses.get(pos, 0)
                accesses[pos] = old if old is RECURRENT else old + 1
        elif op == _SET:
            _, tn, pos, llsc, first_visit, reduction, local_reduction = ev
            ta = st.node(nodes[tn])
            if not ta.assignments and not ta.accesses and _is_scalar_dims(tn):
                ta.is_scalar_constexpr = _is_constexpr(st, llsc, nodes)
            elif ta.assignments:
                ta.is_scalar_constexpr = False
            if first_visit:
                ta.is_accessing = ta.is_accessing or _is_accessing(st, llsc, nodes)
                ta.is_simple = ta.is_simple and _is_simple(st, llsc, nodes)
                ta.is_complex = ta.is_complex or reduction
                ta.is_local_reduction = ta.is_local_reduction and local_reduction
            ta.assignments.add(pos)
        elif op == _OWN:
            owner = nodes[ev[1]]
            for s in ev[2]:
                st.reverse_node_map.setdefault(symbols[s], owner)
        elif op == _BOX:
            st.node(nodes[ev[1]]).written_boxes.add(ev[2])
        elif op == _ZERO:
            ta = st.node(nodes[ev[1]])
            if not ta.assignments and not ta.accesses:
                ta.zero_initialized_by_code = True
                ta.is_accessing = False
                ta.is_complex = False
                ta.is_scalar_constexpr = _is_scalar_dims(ta.tn)
            ta.zeroed_out = True
        elif op == _GATHERED:
            st.node(nodes[ev[1]]).run_time_indexed = True
        elif op == _SET_VEC:
            _, tn, cells, arg, first_visit, reduction = ev
            ta = st.node(nodes[tn])
            ta.is_scalar_constexpr = False
            if first_visit:
                ta.is_accessing = ta.is_accessing or _is_accessing(st, arg, nodes)
                ta.is_simple = False
                ta.is_complex = ta.is_complex or reduction
            ta.assignments.update(cells)
        elif op == _MERGE:
            tn = nodes[ev[1]]
            if st.merge_node is not None and st.merge_node is not tn:
                raise ValueError(f"einjit: only one merge buffer per routine is supported, found "
                                 f"{st.merge_node.debug_name()} and {tn.debug_name()}")
            st.merge_node = tn


def _is_local_reduction(tn: Tnode, loops: tuple[tuple[Symbol, int], ...], idcs: tuple[AxisIndex, ...],
                        llsc: ll.LLScalar) -> bool:
    """See `TracedArray.is_local_reduction`; true of an assignment that is no reduction."""
    indexed = {s for idx in idcs for s in index_symbols(idx)}
    reduced = {s for s, n in loops if n > 1 and s not in indexed}
    if not reduced:
        return True
    innermost = next(s for s, n in reversed(loops) if s in reduced)
    varying: set[Tnode] = set()
    for x in ll.iter_scalars(llsc):
        match x:
            case ll.LocalScope() | ll.GetMergeBuffer():
                return False
            case ll.Get(t, ridx) if t is not tn:
                if not reduced & {s for idx in ridx for s in index_symbols(idx)}:
                    continue
                varying.add(t)
                axes = [a for a, idx in enumerate(ridx) if innermost in index_symbols(idx)]
                if (len(axes) != 1 or ridx[axes[0]] != Iterator(innermost)
                        or any(d != 1 for d in t.dims[axes[0] + 1:])):
                    return False
    return len(varying) <= 1


def _is_reduction(loops: tuple[tuple[Symbol, int], ...], idcs: tuple[AxisIndex, ...]) -> bool:
    indexed = {s for idx in idcs for s in index_symbols(idx)}
    return any(n > 1 and s not in indexed for s, n in loops)


_INDEX_BINOPS = {
    ops.Binop.ADD: lambda a, b: a + b,
    ops.Binop.SUB: lambda a, b: a - b,
    ops.Binop.MUL: lambda a, b: a * b,
    ops.Binop.CMPLT: lambda a, b: float(a < b),
    ops.Binop.CMPEQ: lambda a, b: float(a == b),
    ops.Binop.CMPNE: lambda a, b: float(a != b),
    ops.Binop.AND: lambda a, b: float(a != 0 and b != 0),
    ops.Binop.OR: lambda a, b: float(a != 0 or b != 0),
}


def _index_condition(cond: ll.LLScalar, env: Env) -> bool | None:
    """The value of a `where` condition built only from index embeddings and constants — the
    bounds guards lowering puts around padded reads — or None when it depends on data or on a
    symbol the trace has no value for. Tracing follows only the taken branch, so a guarded
    read of a padding position is not mistaken for a read before write."""
    v = _index_value(cond, env)
    return None if v is None else v != 0


def _index_value(sc: ll.LLScalar, env: Env) -> float | None:
    """`_index_condition`'s value of `sc`. Module-level: a closure calling itself is a
    reference cycle, one per guarded read traced."""
    match sc:
        case ll.Constant(v):
            return v
        case ll.EmbedIndex(idx):
            if gather_indices((idx,)) or any(s.id not in env for s in index_symbols(idx)):
                return None
            return float(_evaluate(env, _compile((idx,)))[0])
        case ll.Binop(op, a, b) if op in _INDEX_BINOPS:
            x, y = _index_value(a, env), _index_value(b, env)
            return None if x is None or y is None else _INDEX_BINOPS[op](x, y)
        case ll.Unop(ops.Unop.NOT, a):
            x = _index_value(a, env)
            return None if x is None else float(x == 0)
    return None


def _node_flag(st: _State, tn: Tnode, flag: str, default: bool, nodes: dict[Tnode, Tnode]) -> bool:
    ta = st.store.get(nodes[tn])
    return default if ta is None else getattr(ta, flag)


def _is_constexpr(st: _State, sc: ll.LLScalar, nodes: dict[Tnode, Tnode]) -> bool:
    match sc:
        case ll.Constant() | ll.ConstantBits():
            return True
        case ll.Get(tn, _) | ll.GetMergeBuffer(tn, _):
            return _node_flag(st, tn, "is_scalar_constexpr", False, nodes)
        case ll.GetLocal(sid) | ll.LocalScope(id=sid):
            return _node_flag(st, sid.tn, "is_scalar_constexpr", False, nodes)
        case ll.EmbedIndex():
            return False
    return all(_is_constexpr(st, c, nodes) for c in ll.scalar_children(sc))


def _is_accessing(st: _State, sc: ll.LLScalar, nodes: dict[Tnode, Tnode]) -> bool:
    match sc:
        case ll.Constant() | ll.ConstantBits() | ll.EmbedIndex():
            return False
        case ll.Get(tn, _):
            return not _node_flag(st, tn, "is_scalar_constexpr", False, nodes)
        case ll.GetMergeBuffer():
            return True
        case ll.GetLocal(sid) | ll.LocalScope(id=sid):
            return _node_flag(st, sid.tn, "is_accessing", True, nodes)
    return any(_is_accessing(st, c, nodes) for c in ll.scalar_children(sc))


def _is_simple(st: _State, sc: ll.LLScalar, nodes: dict[Tnode, Tnode]) -> bool:
    """A single read, or an expression over constants and index embeddings only."""
    match sc:
        case ll.Get() | ll.GetMergeBuffer() | ll.Constant() | ll.ConstantBits() | ll.EmbedIndex():
            return True
        case ll.GetLocal(sid) | ll.LocalScope(id=sid):
            return _node_flag(st, sid.tn, "is_simple", False, nodes)
        case ll.Unop(ops.Unop.IDENTITY, a):
            return _is_simple(st, a, nodes)
    return not any(_is_accessing(st, c, nodes) for c in ll.scalar_children(sc))
