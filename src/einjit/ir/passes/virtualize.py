"""Virtualization: which tensor nodes need no storage, and where their computations are
identified and checked (seed 000: `virtual_llc`, `check_and_store_virtual`).

A node is *virtual* when every read of it can be replaced by its computation, specialised to
the read's indices (`inline_computation`); its writes then disappear from the code
(`cleanup.cleanup_virtual_llc`). The decision is made in three steps:

1. `decide_from_trace` applies the cheap rules to the traced facts, for nodes whose memory
   mode still allows both outcomes (a mode the user set is only ever narrowed, never
   replaced): nodes only read here, or read before written, stay materialized; a reduction
   stays materialized unless `inline_complex_computations`, or unless no cell of it is read
   twice and it is a local reduction (`inline_single_use_reductions`); a node read more than
   `max_visits` times at one position stays materialized unless recomputing it is free (a
   scalar constant expression, or a simple computation).
2. `virtual_llc` walks the code in order. Each code block that computes a node — the loop nest
   owning the loop symbol its writes are indexed by, or a lone write — is checked by
   `check_and_store_virtual` and stored; each read of a candidate node is inlined from the
   computations stored so far, so the inlined code sees exactly the writes that precede the
   read. Any check that fails raises `NonVirtual(code)` with the seed's diagnostic code and
   the node becomes `Never_virtual` with that code as provenance.
3. `cleanup.cleanup_virtual_llc` removes the virtual nodes' writes and finalizes the modes.

Inlining is lazy: a read becomes a local scope whose body is `PENDING`, recorded with the
computations it copies (`Deferred`); cleanup copies the bodies, one level at a time, in the
code it keeps. The checks need no copies — what a pending scope reads is the union of what
the copied computations read — so a chain of n virtual nodes costs O(n), not O(n^2).

Two conditions go beyond the seed. Code 131: inlining recomputes a node when it is read, so
it is refused when a node the computation reads was written between the computation and the
read, or is written by the loop nest containing the read — the recomputation would see the
new values. The one exception is the update pattern `p[i] := p[i] - delta[i]`: when the
statement is the only writer of `p` in its nest, writes each cell once, and the inlined
`delta` reads `p` only at the cell being written, it reads the value before the write.
Code 132: a computation block inside a loop owned by another node runs once per iteration
of that loop, but would run once when inlined. Code 133: a chain of pointwise nodes inlined
into one another is one expression as deep as the chain, and every later pass, printer and
the renderer walk it recursively; a node whose computation already nests `MAX_INLINE_DEPTH`
inlined computations is kept in memory where it is read, so a chain of 10,000 operations
becomes a sequence of expressions at most that deep.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from einjit import config
from einjit.ir import low_level as ll
from einjit.ir.indexing import AxisIndex, FixedIdx, Iterator, Symbol, get_symbol, index_symbols, subst_index
from einjit.ir.mode_provenance import virtual_by
from einjit.ir.passes.tracing import RECURRENT, Trace, TracedArray, VirtualizeSettings
from einjit.ir.provenance import (
    COMPLEX_COMPUTATION,
    NON_VIRTUAL_REASONS,
    READ_ONLY,
    RECURRENT_NODE,
    RUN_TIME_INDEX,
    TENSOR_CALLS,
    TOO_MANY_VISITS,
)
from einjit.ir.tnode import MATERIALIZED, NEVER_VIRTUAL, MemoryModeError, Mode, Tnode

MAX_INLINE_DEPTH = 256
"""How many inlined computations may nest in one expression (code 133): deep enough that no
ordinary model reaches it, shallow enough that the recursive passes stay far from Python's
recursion limit (each level costs a handful of frames in each pass)."""


class NonVirtual(Exception):
    """A node cannot be virtual; `code` is the seed's diagnostic code."""

    def __init__(self, code: int, detail: str = ""):
        super().__init__(code, detail)
        self.code = code
        self.detail = detail

    def __str__(self) -> str:
        extra = f" ({self.detail})" if self.detail else ""
        return f"NonVirtual({self.code}): {NON_VIRTUAL_REASONS.get(self.code, 'unknown reason')}{extra}"


def is_undecided(tn: Tnode) -> bool:
    """The memory mode still allows the node to be virtual and also to be stored."""
    return not tn.is_virtual() and not tn.is_materialized_known()


def narrow_mode(tn: Tnode, mode: Mode, provenance: int) -> bool:
    """Narrow the node's mode to `mode` where that is compatible with what is set already."""
    if tn.memory_mode is not None and not (tn.memory_mode.leaves & mode.leaves):
        return False
    tn.update_memory_mode(mode, provenance)
    return True


def log_decision(name: str, tn: Tnode, message: str) -> None:
    config.debug(4, f"optimize {name or '<routine>'}: {tn.debug_name()} {message}")


def refuse(tn: Tnode, err: NonVirtual, name: str = "") -> None:
    """Record that `tn` cannot be virtual; a user-set `Virtual` mode makes this an error."""
    log_decision(name, tn, f"is not virtual: {err}")
    try:
        tn.update_memory_mode(NEVER_VIRTUAL, err.code)
    except MemoryModeError as e:
        raise MemoryModeError(f"{e}; it cannot be virtual: {err}{_virtual_origin(tn, name)}") from None


def _virtual_origin(tn: Tnode, name: str) -> str:
    """Who made `tn` virtual, and what the user can call instead."""
    routine, call = virtual_by(tn), TENSOR_CALLS.get(tn.provenance)
    here = f"routine {name!r}" if name else "this routine"
    fix = (f"; call materialize() (or hosted()) on tensor {tn.debug_name()} before compiling the first "
           f"routine that uses it, so that it is stored")
    if routine is not None:
        return (f". Tensor {tn.debug_name()} was made virtual by routine {routine!r} (provenance "
                f"{tn.provenance}: its computation was inlined there, so no array holds it), and {here} "
                f"reads it{fix}")
    if call is not None:
        return (f". Tensor {tn.debug_name()} was made virtual by the call {call} (provenance "
                f"{tn.provenance}), and {here} needs it stored; drop that call or call materialize()")
    return ""


def decide_from_trace(trace: Trace, settings: VirtualizeSettings, name: str = "",
                      recomputable: frozenset[Tnode] = frozenset()) -> None:
    """Step 1 of the decision (see the module docstring). `recomputable`: nodes as cheap to
    recompute at every read as to read (`recompute.recomputable`), inlined however often read
    when `settings.inline_broadcast_arithmetic`."""
    for ta in trace.traced_store.values():
        tn = ta.tn
        if ta.run_time_indexed and not tn.is_materialized_known():
            refuse(tn, NonVirtual(RUN_TIME_INDEX), name)
        if ta.read_only:
            if not tn.is_virtual() and narrow_mode(tn, MATERIALIZED, READ_ONLY):
                log_decision(name, tn, "is materialized: only read here (provenance 37)")
            continue
        if ta.read_before_write and not tn.is_virtual() and narrow_mode(tn, MATERIALIZED, RECURRENT_NODE):
            log_decision(name, tn, "is materialized: read before written, its values are inputs (provenance 36)")
        if not is_undecided(tn):
            continue
        free_to_recompute = ((settings.inline_scalar_constexprs and ta.is_scalar_constexpr)
                             or (settings.inline_simple_computations and ta.is_simple)
                             or (settings.inline_broadcast_arithmetic and tn in recomputable))
        used_once = settings.inline_single_use_reductions and ta.is_local_reduction and ta.max_visits() == 1
        if ta.is_complex and not settings.inline_complex_computations and not free_to_recompute and not used_once:
            tn.update_memory_mode(NEVER_VIRTUAL, COMPLEX_COMPUTATION)
            log_decision(name, tn, "is not virtual: its computation loops over a reduction and "
                                   "inline_complex_computations is off (provenance 2)")
        elif not free_to_recompute and _too_many(ta, settings.max_visits):
            tn.update_memory_mode(NEVER_VIRTUAL, TOO_MANY_VISITS)
            log_decision(name, tn, f"is not virtual: a cell is read {ta.max_visits()} times, "
                                   f"max_visits={settings.max_visits} (provenance 1)")


def _too_many(ta: TracedArray, max_visits: int) -> bool:
    most = ta.max_visits()
    return most is RECURRENT or most > max_visits


# ---------------------------------------------------------------- checking a computation


def check_computation(tn: Tnode, static_indices: frozenset[Symbol], top_llc: ll.LLStmt,
                      expand: Callable[[ll.LocalScope], ll.LLStmt] | None = None) -> tuple[AxisIndex, ...] | None:
    """Validate that `top_llc`, a code block computing `tn`, can be inlined; return the index
    pattern it writes `tn` with (None for a `ZeroOut` only). Raises `NonVirtual`.

    `expand` gives the body of a pending scope (see `Deferred`), to check the reads of `tn`
    inside it. Only those need checking there: its other indices were checked when the
    computation it copies was stored, and depend only on the scope's own indices, checked here."""
    if tn.is_materialized_known():
        raise NonVirtual(11, f"memory mode {tn.memory_mode}, provenance {tn.provenance}")
    check = _Check(tn, static_indices, expand)
    check.stmt(top_llc, frozenset(static_indices))
    if not check.has_setter:
        raise NonVirtual(12)
    return check.at_idcs[0] if check.at_idcs else None


@dataclass(slots=True)
class _Check:
    """One `check_computation` walk. A class, not closures calling each other: those are
    reference cycles, which a compile left by the hundred to the cyclic collector."""

    tn: Tnode
    static_indices: frozenset[Symbol]
    expand: Callable[[ll.LocalScope], ll.LLStmt] | None
    at_idcs: list[tuple[AxisIndex, ...]] = field(default_factory=list)
    has_setter: bool = False

    def check_idcs(self, idcs: tuple[AxisIndex, ...]) -> None:
        if not self.at_idcs:
            self.at_idcs.append(idcs)
        elif self.at_idcs[0] != idcs:
            raise NonVirtual(4, f"{_show(self.at_idcs[0])} vs {_show(idcs)}")
        syms: list[Symbol] = []
        for idx in idcs:
            dynamic = [s for s in index_symbols(idx) if s not in self.static_indices]
            if len(dynamic) > 1:
                raise NonVirtual(51, repr(idx))
            syms.extend(dynamic)
        if len(syms) != len(set(syms)):
            raise NonVirtual(5, _show(idcs))

    @staticmethod
    def escaping(idcs: tuple[AxisIndex, ...], bound: frozenset[Symbol], code: int) -> None:
        for idx in idcs:
            for s in index_symbols(idx):
                if s not in bound:
                    raise NonVirtual(code, f"{s!r} in {_show(idcs)}")

    def stmt(self, s: ll.LLStmt, bound: frozenset[Symbol]) -> None:
        tn = self.tn
        for x in ll.flatten(s):
            match x:
                case ll.ForLoop(trace_it=False):
                    raise NonVirtual(6, f"loop over {x.index!r}")
                case ll.ForLoop(index, _, _, body, _):
                    self.stmt(body, bound | {index})
                case ll.ZeroOut(t):
                    self.has_setter = self.has_setter or t is tn
                case ll.SetFromVec(t) if t is tn:
                    raise NonVirtual(140)
                case ll.Set(t, idcs, llsc, _) | ll.SetFromVec(t, idcs, _, _, llsc, _):
                    if t is tn:
                        self.check_idcs(idcs)
                        self.has_setter = True
                    else:
                        self.escaping(idcs, bound, 7)
                    self.scalar(llsc, bound)
                case ll.SetLocal(_, value):
                    self.scalar(value, bound)
                case ll.StagedCompilation():
                    raise NonVirtual(8)

    def scalar(self, sc: ll.LLScalar, bound: frozenset[Symbol]) -> None:
        for x in ll.iter_scalars(sc):
            match x:
                case ll.Get(t, idcs) if t is self.tn:
                    self.check_idcs(idcs)
                case ll.Get(_, idcs) | ll.GetMergeBuffer(_, idcs):
                    self.escaping(idcs, bound, 9)
                case ll.EmbedIndex(idx):
                    self.escaping((idx,), bound, 10)
                case ll.LocalScope(_, body, orig):
                    self.escaping(orig, bound, 9)
                    self.stmt(self.expand(x) if self.expand is not None and body is PENDING else body, bound)


def _show(idcs: tuple[AxisIndex, ...]) -> str:
    return "[" + ", ".join(repr(i) for i in idcs) + "]"


def written_nodes(stmt: ll.LLStmt) -> set[Tnode]:
    out: set[Tnode] = set()
    for s in ll.block_statements(stmt):
        match s:
            case ll.Set(tn=tn) | ll.SetFromVec(tn=tn) | ll.ZeroOut(tn):
                out.add(tn)
    return out


def _block_reads(state: VirtualState, stmt: ll.LLStmt) -> set[Tnode]:
    """`read_nodes` of `stmt` with its pending scopes copied, without copying them."""
    out = read_nodes(stmt)
    for x in ll.deep_parts(stmt):
        if isinstance(x, ll.LocalScope) and x.id in state.deferred:
            out |= state.deferred[x.id].reads
    return out


def _inlined_depth(state: VirtualState, stmt: ll.LLStmt) -> int:
    """The deepest nest of inlined computations among the pending scopes of `stmt`."""
    return max((state.depth.get(state.deferred[x.id].tn, 0) for x in ll.deep_parts(stmt)
                if isinstance(x, ll.LocalScope) and x.id in state.deferred), default=0)


def read_nodes(stmt: ll.LLStmt) -> set[Tnode]:
    """Nodes read anywhere in `stmt`, including inside local scopes (whose node counts too:
    should it end up stored, the scope turns back into a read of it)."""
    out: set[Tnode] = set()
    for x in ll.deep_parts(stmt):
        match x:
            case ll.Get(tn, _) | ll.GetMergeBuffer(tn, _) | ll.LocalScope(id=ll.ScopeId(tn=tn)):
                out.add(tn)
    return out


# ---------------------------------------------------------------- walking the code


@dataclass(frozen=True, slots=True, eq=False)
class Computation:
    """A checked code block computing a node: `at_idcs` is the index pattern it writes the node
    with (None when it only zeroes it), `loops` the ranges of the loops inside it, `reads`
    every node it reads, also through the computations inlined into it."""

    at_idcs: tuple[AxisIndex, ...] | None
    llc: ll.LLStmt
    loops: dict[Symbol, tuple[int, int]]
    reads: frozenset[Tnode] = frozenset()


@dataclass(frozen=True, slots=True, eq=False)
class Deferred:
    """An inlined read whose copy is postponed: the local scope it names computes `tn` from
    `parts`, the stored computations that can affect the cell read. `outer`: the nodes inlined
    around the scope with their locals, innermost last — reads of them inside become reads of
    those locals.

    Inlining copies a computation into its reader. Copying eagerly would copy again, at every
    level, what was already inlined into the computation: a chain of n virtual nodes would
    cost n^2. The walk leaves the body of each scope it creates as `PENDING` and records the
    scope here; `cleanup` copies the bodies, one level at a time, only in the code it keeps."""

    tn: Tnode
    parts: tuple[Computation, ...]
    reads: frozenset[Tnode]
    outer: tuple[tuple[Tnode, ll.ScopeId], ...] = ()

    @staticmethod
    def of(tn: Tnode, parts: tuple[Computation, ...]) -> Deferred:
        """`reads`: the nodes the inlined code reads (its own node counts, as in `read_nodes`)."""
        return Deferred(tn, parts, frozenset({tn}.union(*(comp.reads for comp in parts))))


PENDING = ll.Comment("inlined: copied by cleanup")
"""The body of a local scope recorded in `VirtualState.deferred`, until cleanup copies it."""


@dataclass(slots=True)
class VirtualState:
    """What `virtual_llc` accumulates: the stored computations per node (in code order), the
    local scopes it created by inlining, and the bookkeeping behind code 131. `writes_ahead`:
    per node, the statements writing it that the walk has not reached; `written_later`: the
    nodes with some left. A computation becomes a reader of a node (made stale when the node
    is overwritten) only if the node is written later, so the computations of a chain, whose
    nodes are each written once before they are read, become readers of nothing."""

    trace: Trace
    static_indices: frozenset[Symbol]
    name: str = ""
    computations: dict[Tnode, list[Computation]] = field(default_factory=dict)
    inlined_scopes: set[ll.ScopeId] = field(default_factory=set)
    inline_counts: dict[Tnode, int] = field(default_factory=dict)
    reads: dict[Tnode, set[Tnode]] = field(default_factory=dict)
    readers: dict[Tnode, set[Tnode]] = field(default_factory=dict)
    stale: set[Tnode] = field(default_factory=set)
    deferred: dict[ll.ScopeId, Deferred] = field(default_factory=dict)
    writes_ahead: dict[Tnode, int] | None = None
    written_later: set[Tnode] = field(default_factory=set)
    depth: dict[Tnode, int] = field(default_factory=dict)
    """Per stored node: how many inlined computations nest in its computation, itself included."""


def check_and_store_virtual(state: VirtualState, tn: Tnode, top_llc: ll.LLStmt) -> bool:
    """Check the code block `top_llc` computing `tn`; store it for inlining, or make the node
    `Never_virtual` with the failing check's code. Returns whether it was stored."""
    try:
        block_reads = _block_reads(state, top_llc)
        expand = None if tn not in block_reads else (lambda sc: _expanded_body(state, sc, tn))
        at_idcs = check_computation(tn, state.static_indices, top_llc, expand)
        reads = block_reads - {tn}
        overwritten = reads & (written_nodes(top_llc) - {tn})
        if overwritten:
            raise NonVirtual(131, ", ".join(sorted(t.debug_name() for t in overwritten)))
    except NonVirtual as err:
        refuse(tn, err, state.name)
        return False
    loops = {s.index: (s.from_, s.to_) for s in ll.block_statements(top_llc) if isinstance(s, ll.ForLoop)}
    state.depth[tn] = max(state.depth.get(tn, 0), 1 + _inlined_depth(state, top_llc))
    state.computations.setdefault(tn, []).append(Computation(at_idcs, top_llc, loops, frozenset(block_reads)))
    state.reads.setdefault(tn, set()).update(reads)
    for r in reads if state.writes_ahead is None else reads & state.written_later:
        state.readers.setdefault(r, set()).add(tn)
    return True


def virtual_llc(llc: ll.LLStmt, state: VirtualState) -> ll.LLStmt:
    """Identify computations, store the inlinable ones and inline reads of candidate nodes."""
    state.writes_ahead = {}
    for s in ll.block_statements(llc):
        if isinstance(s, (ll.Set, ll.SetFromVec, ll.ZeroOut)):
            state.writes_ahead[s.tn] = state.writes_ahead.get(s.tn, 0) + 1
    state.written_later = set(state.writes_ahead)
    return _walk(state, llc, frozenset(), frozenset(), ())


def _store(state: VirtualState, tn: Tnode, block: ll.LLStmt, repeated: bool) -> None:
    if repeated:
        refuse(tn, NonVirtual(132), state.name)
    else:
        check_and_store_virtual(state, tn, block)


def _overwrite(state: VirtualState, tn: Tnode) -> None:
    if state.writes_ahead is not None:
        state.writes_ahead[tn] -= 1
        if not state.writes_ahead[tn]:
            state.written_later.discard(tn)
    for reader in state.readers.get(tn, ()):
        if reader is not tn:
            state.stale.add(reader)


def _sole_cellwise_writer(s: ll.Set, loops: tuple[ll.ForLoop, ...]) -> bool:
    """`s` is the only write of its node in the enclosing loop nest, and writes each cell once:
    reads of the node at the cell `s` writes still see the value from before the nest."""
    nest = loops[0] if loops else s
    writers = [x for x in ll.block_statements(nest)
               if isinstance(x, (ll.Set, ll.SetFromVec, ll.ZeroOut)) and x.tn is s.tn]
    if len(writers) != 1 or writers[0] is not s or not all(isinstance(i, (Iterator, FixedIdx)) for i in s.idcs):
        return False
    syms = [i.symbol for i in s.idcs if isinstance(i, Iterator)]
    return len(syms) == len(set(syms)) and {lp.index for lp in loops if lp.to_ > lp.from_} <= set(syms)


def _reads_only_at(body: ll.LLStmt, tn: Tnode, idcs: tuple[AxisIndex, ...]) -> bool:
    for x in ll.deep_parts(body):
        match x:
            case ll.Get(t, i) | ll.LocalScope(id=ll.ScopeId(tn=t), orig_indices=i) if t is tn and i != idcs:
                return False
    return True


def _walk(state: VirtualState, stmt: ll.LLStmt, process_for: frozenset[Tnode], writing: frozenset[Tnode],
          loops: tuple[ll.ForLoop, ...]) -> ll.LLStmt:
    """`process_for`: nodes whose computation encloses this point — their reads stay (they
    become the local of their own inlined computation). `writing`: nodes written by the loop
    nest around this point. `loops`: the enclosing loops. Its parts are module functions, not
    closures calling themselves: those are reference cycles, left by the thousand to the cyclic
    collector."""
    return ll.seq(*(_walk_one(state, s, process_for, writing, loops) for s in ll.flatten(stmt)))


def _walk_one(state: VirtualState, s: ll.LLStmt, process_for: frozenset[Tnode], writing: frozenset[Tnode],
              loops: tuple[ll.ForLoop, ...]) -> ll.LLStmt:
    """`_walk` of one statement."""
    repeated = any(lp.to_ > lp.from_ for lp in loops)
    match s:
        case ll.ForLoop(index, _, _, body, _):
            inner_writing = writing | written_nodes(body)
            owner = state.trace.reverse_node_map.get(index)
            if owner is None or owner in process_for:
                return replace(s, body=_walk(state, body, process_for, inner_writing, loops + (s,)))
            result = replace(s, body=_walk(state, body, process_for | {owner}, inner_writing, loops + (s,)))
            if not owner.is_materialized_known():
                _store(state, owner, result, repeated)
            return result
        case ll.ZeroOut(tn):
            if tn not in process_for and not tn.is_materialized_known():
                _store(state, tn, s, repeated)
            _overwrite(state, tn)
            return s
        case ll.Set(tn, idcs, llsc, _) | ll.SetFromVec(tn, idcs, _, _, llsc, _):
            inner = process_for if tn.is_materialized_known() else process_for | {tn}
            written_cell = (tn, idcs) if isinstance(s, ll.Set) and _sole_cellwise_writer(s, loops) else None
            value = _walk_scalar(state, llsc, inner, writing | {tn}, written_cell)
            written = replace(s, llsc=value) if isinstance(s, ll.Set) else replace(s, arg=value)
            if tn not in process_for and not tn.is_materialized_known():
                _store(state, tn, written, repeated)
            _overwrite(state, tn)
            return written
        case ll.SetLocal(sid, value):
            return ll.SetLocal(sid, _walk_scalar(state, value, process_for, writing, None))
    return s


def _walk_scalar(state: VirtualState, sc: ll.LLScalar, process_for: frozenset[Tnode], writing: frozenset[Tnode],
                 written_cell: tuple[Tnode, tuple[AxisIndex, ...]] | None) -> ll.LLScalar:
    """`written_cell`: the node and indices the enclosing statement writes, when it is the
    sole cell-wise writer of that node in its nest."""
    match sc:
        case ll.Get(tn, idcs):
            if tn in process_for or tn.is_materialized_known():
                return sc
            try:
                if tn in state.stale:
                    raise NonVirtual(131, f"read at {_show(idcs)}")
                if state.depth.get(tn, 0) >= MAX_INLINE_DEPTH:
                    raise NonVirtual(133, f"{state.depth[tn]} levels")
                sid = ll.fresh_scope_id(tn)
                deferred = Deferred.of(tn, applicable_computations(state, tn, idcs))
                conflict = state.reads.get(tn, set()) & writing
                if conflict and not (written_cell is not None and conflict == {written_cell[0]}
                                     and _reads_only_at(_copy(state, sid, deferred, idcs, True, written_cell[0]),
                                                                 *written_cell)):
                    raise NonVirtual(131, f"read at {_show(idcs)}")
            except NonVirtual as err:
                refuse(tn, err, state.name)
                return sc
            state.deferred[sid] = deferred
            state.inlined_scopes.add(sid)
            state.inline_counts[tn] = state.inline_counts.get(tn, 0) + 1
            return ll.LocalScope(sid, PENDING, idcs)
        case ll.LocalScope(sid, body, orig):
            return ll.LocalScope(sid, _walk(state, body, process_for | {sid.tn}, writing, ()), orig)
        case ll.Unop() | ll.Binop() | ll.Ternop():
            return ll.map_operands(sc, lambda x: _walk_scalar(state, x, process_for, writing, written_cell))
    return sc


# ---------------------------------------------------------------- inlining


def inline_computation(sid: ll.ScopeId, state: VirtualState, tn: Tnode,
                       call_args: tuple[AxisIndex, ...]) -> ll.LLStmt:
    """The stored computations of `tn`, in code order, specialised to the read `tn[call_args]`:
    the body of a `LocalScope(sid, ...)`. Writes of `tn` become `SetLocal(sid, ...)` and its
    reads `GetLocal(sid)`; loops over the symbols of its indices disappear (the symbols are
    replaced by the call's indices), the other loops — reductions — stay with fresh symbols,
    and local scopes inside get fresh ids, so every copy is independent. Computations inlined
    into the stored ones are copied too. Raises `NonVirtual`."""
    return _copy(state, sid, Deferred.of(tn, applicable_computations(state, tn, call_args)), call_args, True)


def applicable_computations(state: VirtualState, tn: Tnode,
                            call_args: tuple[AxisIndex, ...]) -> tuple[Computation, ...]:
    """The stored computations of `tn` that can affect the cell `tn[call_args]`, each checked
    for inlining there. Raises `NonVirtual`."""
    parts = tuple(comp for comp in state.computations.get(tn, ())
                  if _make_subst(tn, comp, call_args, state.static_indices) is not None)
    if not parts:
        raise NonVirtual(14)
    return parts


def expand_pending(state: VirtualState, scope: ll.LocalScope) -> ll.LLStmt:
    """The body of a pending scope, one level deep: the scopes inlined into the computations it
    copies stay pending, recorded under fresh ids."""
    return _copy(state, scope.id, state.deferred[scope.id], scope.orig_indices, False)


def _expanded_body(state: VirtualState, scope: ll.LocalScope, reading: Tnode) -> ll.LLStmt:
    """The body of a pending scope, copied as deep as it reads `reading`: what does not read it
    stays pending (checking `reading`'s accesses needs nothing else, and a chain of n nodes
    whose every gradient reads itself would cost n^2 fully expanded)."""
    deferred = state.deferred.get(scope.id)
    if deferred is None or reading not in deferred.reads:
        return scope.body
    return _copy(state, scope.id, deferred, scope.orig_indices, True, reading)


def _copy(state: VirtualState, sid: ll.ScopeId, deferred: Deferred, call_args: tuple[AxisIndex, ...],
          deep: bool, reading: Tnode | None = None) -> ll.LLStmt:
    """The body of scope `sid` inlining `deferred` at `call_args`; `deep`: copy the scopes
    inlined into it too, rather than leaving them pending — with `reading`, only those that
    read that node (the others stay `PENDING`, unrecorded: the copy is for checking reads)."""
    outer = (*deferred.outer, (deferred.tn, sid))
    cx = _Inline(deferred.tn, sid, state, dict(outer), outer, deep, reading)
    bodies = []
    for comp in deferred.parts:
        body = _inline_stmt(cx, comp.llc, _bind(comp, call_args, state.static_indices), {})
        if body is not None:
            bodies.append(body)
    return ll.seq(*bodies)


def _bind(comp: Computation, call_args: tuple[AxisIndex, ...],
          static_indices: frozenset[Symbol]) -> dict[Symbol, AxisIndex]:
    """The substitution `_make_subst` checked, for call indices that may since have been
    substituted themselves (a scope copied into another copy)."""
    if comp.at_idcs is None:
        return {}
    return {lhs.symbol: rhs for lhs, rhs in zip(comp.at_idcs, call_args, strict=True)
            if isinstance(lhs, Iterator) and lhs.symbol not in static_indices}


def _make_subst(tn: Tnode, comp: Computation, call_args: tuple[AxisIndex, ...],
                static_indices: frozenset[Symbol]) -> dict[Symbol, AxisIndex] | None:
    """Bind the computation's index symbols to the call's indices; None when the computation
    writes a fixed index and the read another one, so it cannot affect the cell read.

    A symbol is bound only if the computation's own loop over it sweeps the whole axis: then
    every cell the read may ask for is computed by the block. A fixed or static index must be
    read exactly as written (any index will do on an axis of dimension 1)."""
    def_args, loops = comp.at_idcs, comp.loops
    if def_args is None:
        return {}
    if len(call_args) != len(def_args):
        raise NonVirtual(13, f"written with {len(def_args)} indices, read with {len(call_args)}")
    if any(isinstance(lhs, FixedIdx) and isinstance(rhs, FixedIdx) and lhs != rhs
           for lhs, rhs in zip(def_args, call_args, strict=True)):
        return None
    env: dict[Symbol, AxisIndex] = {}
    dims = tn.dims
    for axis, (lhs, rhs) in enumerate(zip(def_args, call_args, strict=True)):
        match lhs:
            case Iterator(s) if s not in static_indices:
                if loops.get(s) != (0, dims[axis] - 1):
                    raise NonVirtual(13, f"the loop over {s!r} does not sweep axis {axis} of dims {dims}")
                env[s] = rhs
            case FixedIdx(0) if dims[axis] == 1:
                pass
            case _ if lhs == rhs and not set(index_symbols(lhs)) & loops.keys():
                pass
            case _:
                raise NonVirtual(13, f"axis {axis} is written at {lhs!r} and read at {rhs!r}")
    return env


@dataclass(frozen=True, slots=True)
class _Inline:
    """One copy: `tn` is inlined into local `sid`; `locals` maps it and the nodes inlined
    around it to their locals (`outer`, innermost last)."""

    tn: Tnode
    sid: ll.ScopeId
    state: VirtualState
    locals: dict[Tnode, ll.ScopeId]
    outer: tuple[tuple[Tnode, ll.ScopeId], ...]
    deep: bool
    reading: Tnode | None = None


def _subst(env: dict[Symbol, AxisIndex], idcs: tuple[AxisIndex, ...]) -> tuple[AxisIndex, ...]:
    return tuple(subst_index(env, i) for i in idcs)


def _inline_stmt(cx: _Inline, stmt: ll.LLStmt, env: dict[Symbol, AxisIndex],
                 renames: dict[ll.ScopeId, ll.ScopeId]) -> ll.LLStmt | None:
    out: list[ll.LLStmt] = []
    for s in ll.flatten(stmt):
        match s:
            case ll.ForLoop(index, from_, to_, body, trace_it):
                if index in env:
                    r = _inline_stmt(cx, body, env, renames)
                else:
                    fresh = get_symbol(index.name)
                    inner = _inline_stmt(cx, body, {**env, index: Iterator(fresh)}, renames)
                    r = None if inner is None else ll.ForLoop(fresh, from_, to_, inner, trace_it)
            case ll.ZeroOut(t):
                r = ll.SetLocal(cx.sid, ll.Constant(0.0)) if t is cx.tn else None
            case ll.Set(t, _, llsc, _):
                r = ll.SetLocal(cx.sid, _inline_scalar(cx, llsc, env, renames)) if t is cx.tn else None
            case ll.SetFromVec():
                r = None
            case ll.SetLocal(sid, value):
                r = ll.SetLocal(renames.get(sid, sid), _inline_scalar(cx, value, env, renames))
            case _:
                r = s
        if r is not None:
            out.append(r)
    return ll.seq(*out) if out else None


def _inline_scalar(cx: _Inline, sc: ll.LLScalar, env: dict[Symbol, AxisIndex],
                   renames: dict[ll.ScopeId, ll.ScopeId]) -> ll.LLScalar:
    match sc:
        case ll.Get(t, _) if t in cx.locals:
            return ll.GetLocal(cx.locals[t])
        case ll.Get(t, idcs):
            return ll.Get(t, _subst(env, idcs))
        case ll.GetMergeBuffer(t, idcs):
            return ll.GetMergeBuffer(t, _subst(env, idcs))
        case ll.GetLocal(sid):
            return ll.GetLocal(renames.get(sid, sid))
        case ll.LocalScope(sid, body, orig):
            new = ll.fresh_scope_id(sid.tn)
            if sid in cx.state.inlined_scopes:
                cx.state.inlined_scopes.add(new)
            pending = cx.state.deferred.get(sid)
            if pending is not None:
                # only the enclosing nodes it reads: a chain nests n deep, and each level
                # carrying all its enclosing nodes would cost n^2
                outer = tuple((t, local) for t, local in cx.outer if t in pending.reads)
                nested = Deferred(pending.tn, pending.parts, pending.reads, outer)
                args = _subst(env, orig)
                if cx.deep and cx.reading is not None and cx.reading not in pending.reads:
                    return ll.LocalScope(new, PENDING, args)
                if cx.deep:
                    return ll.LocalScope(new, _copy(cx.state, new, nested, args, True, cx.reading), args)
                cx.state.deferred[new] = nested
                return ll.LocalScope(new, PENDING, args)
            inner = _inline_stmt(cx, body, env, {**renames, sid: new})
            return ll.LocalScope(new, ll.Noop() if inner is None else inner, _subst(env, orig))
        case ll.EmbedIndex(idx):
            return ll.EmbedIndex(subst_index(env, idx))
        case ll.Unop() | ll.Binop() | ll.Ternop():
            return ll.map_operands(sc, lambda x: _inline_scalar(cx, x, env, renames))
    return sc
