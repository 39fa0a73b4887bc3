"""Cleanup after inlining (seed 000, `cleanup_virtual_llc`): remove the virtual nodes'
computations, check that every index symbol is in scope, and finalize memory modes.

A stored computation may still be read by a plain `Get` somewhere — a read that stayed
because the node's own computation enclosed it, or the computation of a node that was
refused later. Such a node must be stored after all, so the pass repeats until no virtual
node is read: each round turns the offenders `Never_virtual` (provenance 17), which keeps
their writes and turns their inlined local scopes back into reads (the scopes' `orig_indices`
are the read's indices).

Inlining leaves the bodies of the scopes it creates pending (`virtualize.Deferred`); this
pass copies them, one level at a time as it descends, in the code it keeps only — the
computations of virtual nodes are dropped uncopied, which keeps long chains linear.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from einjit.ir import low_level as ll
from einjit.ir.indexing import AxisIndex, Symbol, index_symbols
from einjit.ir.mode_provenance import record_virtual
from einjit.ir.passes.tracing import VirtualizeSettings
from einjit.ir.passes.virtualize import (
    NonVirtual,
    VirtualState,
    expand_pending,
    log_decision,
    narrow_mode,
    refuse,
    written_nodes,
)
from einjit.ir.provenance import HOSTED_FOR_HOST_ACCESS, INLINED, KEPT
from einjit.ir.tnode import NEVER_VIRTUAL, VIRTUAL, Tnode, hosted


class ScopeError(AssertionError):
    """An index symbol that no enclosing loop binds and that is not a static index."""


@dataclass(slots=True)
class _Cleanup:
    virtual: frozenset[Tnode]
    state: VirtualState
    still_read: set[Tnode] = field(default_factory=set)


def cleanup_virtual_llc(llc: ll.LLStmt, state: VirtualState, settings: VirtualizeSettings) -> ll.LLStmt:
    """Remove the computations of the nodes that end up virtual and set every touched node's
    memory mode: `Virtual` (provenance 15) or `Never_virtual` (17, or the code that decided it
    earlier); with `enable_device_only` off, stored nodes are also made hosted (38)."""
    virtual = frozenset(tn for tn in state.computations if not tn.is_materialized_known())
    while True:
        cx = _Cleanup(virtual, state)
        result = _stmt(cx, llc, frozenset(state.static_indices))
        if not cx.still_read:
            break
        for tn in sorted(cx.still_read, key=lambda t: t.id):
            refuse(tn, NonVirtual(KEPT), state.name)
        virtual -= cx.still_read
    _finalize_modes(result, virtual, state, settings)
    return result


def _finalize_modes(code: ll.LLStmt, virtual: frozenset[Tnode], state: VirtualState,
                    settings: VirtualizeSettings) -> None:
    for tn in sorted(virtual, key=lambda t: t.id):
        tn.update_memory_mode(VIRTUAL, INLINED)
        record_virtual(tn, state.name)
        n = state.inline_counts.get(tn, 0)
        what = f"computation inlined at {n} read{'s' if n > 1 else ''}" if n else "never read, computation dropped"
        log_decision(state.name, tn, f"is virtual: {what} (provenance 15)")
    stored = (set(state.trace.traced_store) | touched_nodes(code)) - virtual
    for tn in sorted(stored, key=lambda t: t.id):
        if not tn.is_materialized_known():
            tn.update_memory_mode(NEVER_VIRTUAL, KEPT)
            log_decision(state.name, tn, "is not virtual: stored (provenance 17)")
        if not settings.enable_device_only:
            narrow_mode(tn, hosted(), HOSTED_FOR_HOST_ACCESS)


def touched_nodes(stmt: ll.LLStmt) -> set[Tnode]:
    """Every node the code writes or reads (not counting the nodes of local scopes)."""
    out = written_nodes(stmt)
    for x in ll.deep_parts(stmt):
        match x:
            case ll.Get(tn, _) | ll.GetMergeBuffer(tn, _):
                out.add(tn)
    return out


def _check_scope(idcs: tuple[AxisIndex, ...], scope: frozenset[Symbol], what: str) -> None:
    for idx in idcs:
        for s in index_symbols(idx):
            if s not in scope:
                raise ScopeError(f"einjit optimizer: symbol {s!r} of index {idx!r} in {what} is not bound by an "
                                 f"enclosing loop nor a static index")


def _stmt(cx: _Cleanup, stmt: ll.LLStmt, scope: frozenset[Symbol]) -> ll.LLStmt:
    out: list[ll.LLStmt] = []
    for s in ll.flatten(stmt):
        match s:
            case ll.ForLoop(index, _, _, body, _):
                inner = _stmt(cx, body, scope | {index})
                if not isinstance(inner, ll.Noop):
                    out.append(replace(s, body=inner))
            case ll.ZeroOut(tn):
                if tn not in cx.virtual:
                    out.append(s)
            case ll.Set(tn, idcs, llsc, _):
                if tn not in cx.virtual:
                    _check_scope(idcs, scope, f"a write of {tn.debug_name()}")
                    out.append(replace(s, llsc=_scalar(cx, llsc, scope)))
            case ll.SetFromVec(tn, idcs, _, _, arg, _):
                if tn not in cx.virtual:
                    _check_scope(idcs, scope, f"a vector write of {tn.debug_name()}")
                    out.append(replace(s, arg=_scalar(cx, arg, scope)))
            case ll.SetLocal(sid, value):
                out.append(ll.SetLocal(sid, _scalar(cx, value, scope)))
            case _:
                out.append(s)
    return ll.seq(*out)


def _scalar(cx: _Cleanup, sc: ll.LLScalar, scope: frozenset[Symbol]) -> ll.LLScalar:
    match sc:
        case ll.Get(tn, idcs):
            _check_scope(idcs, scope, f"a read of {tn.debug_name()}")
            if tn in cx.virtual:
                cx.still_read.add(tn)
            return sc
        case ll.GetMergeBuffer(tn, idcs):
            _check_scope(idcs, scope, f"a merge-buffer read of {tn.debug_name()}")
            return sc
        case ll.LocalScope(sid, body, orig):
            _check_scope(orig, scope, f"the local scope of {sid.tn.debug_name()}")
            if sid in cx.state.inlined_scopes and sid.tn not in cx.virtual:
                return ll.Get(sid.tn, orig)
            if sid in cx.state.deferred:
                body = expand_pending(cx.state, sc)
            return ll.LocalScope(sid, _stmt(cx, body, scope), orig)
        case ll.EmbedIndex(idx):
            _check_scope((idx,), scope, "an embedded index")
            return sc
        case ll.Unop(op, a):
            return ll.Unop(op, _scalar(cx, a, scope))
        case ll.Binop(op, a, b):
            return ll.Binop(op, _scalar(cx, a, scope), _scalar(cx, b, scope))
        case ll.Ternop(op, a, b, c):
            return ll.Ternop(op, _scalar(cx, a, scope), _scalar(cx, b, scope), _scalar(cx, c, scope))
    return sc

