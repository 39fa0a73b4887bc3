"""Routine-local storage: which stored nodes live only during one call of one routine.

The optimizer decides whether a node is stored at all; this pass decides where a stored node
lives. A context keeps an array per node between calls, which is what a parameter, optimizer
state or a hosted result needs. An activation or a gradient that a training step computes
and consumes within the same call needs none of that: declared inside the generated function
(seed 001's `Local` mode, memory class `Local_only`), it costs no memory between calls and
stays in cache.

The rule, applied to each batch of routines compiled together (`localize`):

- a node becomes `Local` (provenance `ROUTINE_LOCAL`) when its memory mode still allows it
  (not hosted, not `On_device`, not `Materialized`), every routine of the batch that touches
  it writes it before reading it (the optimizer already made nodes read first `Materialized`:
  their values are inputs), the routine consumes it — a later top-level statement reads what
  it last wrote: a node whose last writes nothing reads is a result, kept for whoever reads
  it next —, it is not a merge node, and no routine compiled earlier keeps it in its context
  (that routine's code holds the context array, and values written there must stay
  readable). A node a CPU stage removed from the code (a row buffer, a propagated copy) is
  judged on the portable code, which still consumes it: kept in a context instead, no array
  would hold its values, and a later routine of the same graph could no longer remove it;
- every other stored node a routine touches is remembered as kept in a context, so a later
  routine never makes it local either;
- a later routine that reads a node made local before writing it would read values that no
  longer exist. It is refused (`LocalNodeError`) naming the node, the routine that made it
  local and what to do: mark the tensor `.materialize()` or `.hosted()` before compiling the
  first routine, or compute the node again in the new routine (as `fit.forward_step` does).
  A PyTorch user expects a tensor from the last step to still have values; einjit cannot
  keep them for free, so it says so instead of returning zeros.

`VirtualizeSettings(local_storage=False)` turns the pass off for the routines optimized with
those settings; their nodes then stay in the context, as before.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

from einjit.ir import low_level as ll
from einjit.ir.provenance import ROUTINE_LOCAL, describe
from einjit.ir.tnode import LOCAL, MemoryModeError, Tnode

__all__ = ["LocalNodeError", "is_routine_local", "kept_in_context", "local_to", "localize", "mark_kept", "mark_local"]


class LocalNodeError(MemoryModeError):
    """A routine reads a node whose values another routine does not keep between calls."""


_kept_in_context: "weakref.WeakSet[Tnode]" = weakref.WeakSet()
_local_to: "weakref.WeakKeyDictionary[Tnode, str]" = weakref.WeakKeyDictionary()


def is_routine_local(tn: Tnode) -> bool:
    """Whether `localize` made `tn` local (the scheduler's own locals are not counted)."""
    return tn.is_local() and tn.provenance == ROUTINE_LOCAL


def local_to(tn: Tnode) -> str | None:
    """The routine that made `tn` routine-local, if one did."""
    return _local_to.get(tn) if is_routine_local(tn) else None


def kept_in_context(tn: Tnode) -> bool:
    """Whether a routine compiled so far keeps `tn` in its context between calls."""
    return tn in _kept_in_context


def localize(routines: Sequence[tuple[str, Any, frozenset[Tnode]]]) -> None:
    """Decide local storage for a batch of routines compiled together: `(name, lowered,
    read_first)` where `lowered` is the optimizer's result (or bare low-level code) and
    `read_first` the nodes the routine reads before writing them."""
    for name, _, read_first in routines:
        for tn in sorted(read_first, key=lambda t: t.id):
            if is_routine_local(tn):
                raise _read_error(name, tn)
    enabled = [(name, lowered) for name, lowered, _ in routines if _local_storage_on(lowered)]
    blocked: set[Tnode] = set()
    for _, lowered, _ in routines:
        if not _local_storage_on(lowered):
            blocked |= _touched(lowered)
        merge = getattr(lowered, "merge_node", None)
        if merge is not None:
            blocked.add(merge)
    for name, lowered in enabled:
        store = lowered.traced_store
        consumed = _consumed(lowered.llc) | _removed_and_consumed(lowered)
        for tn in sorted(_touched(lowered), key=lambda t: t.id):
            ta = store.get(tn)
            if (ta is None or tn in blocked or tn in _kept_in_context or tn.memory_mode is None or tn not in consumed
                    or ta.read_only or ta.read_before_write or not (ta.assignments or ta.zeroed_out)
                    or not (tn.memory_mode.leaves & LOCAL.leaves)):
                continue
            if not tn.is_local():
                tn.update_memory_mode(LOCAL, ROUTINE_LOCAL)
                _local_to[tn] = name
    for _, lowered, _ in routines:
        for tn in _touched(lowered):
            if not tn.is_local() and not tn.is_virtual():
                _kept_in_context.add(tn)


def mark_local(tn: Tnode, routine: str) -> None:
    """Record that `routine` made `tn` routine-local (its memory mode already says Local):
    what `localize` decided, restored by the program cache without running it."""
    _local_to[tn] = routine


def mark_kept(tn: Tnode) -> None:
    """Record that a compiled routine keeps `tn` in its context (as `localize` does)."""
    _kept_in_context.add(tn)


def _local_storage_on(lowered: Any) -> bool:
    settings = getattr(lowered, "settings", None)
    return getattr(lowered, "traced_store", None) is not None and settings is not None and settings.local_storage


def _consumed(llc: ll.LLStmt) -> set[Tnode]:
    """Nodes read by a statement after the last statement writing them, in program order: a
    statement's reads (its local scopes' included) come before its write, and a loop body is
    taken once, so a read that only a later iteration would see does not count. (Fused nests
    write and read a node inside one top-level statement.)"""
    last_write: dict[Tnode, float] = {}
    last_read: dict[Tnode, float] = {}
    pos = 0

    def reads(sc: ll.LLScalar) -> None:
        for x in ll.deep_parts(sc):
            match x:
                case ll.Get(tn, _):
                    last_read[tn] = pos
                case ll.Set(tn=tn) | ll.SetFromVec(tn=tn) | ll.ZeroOut(tn):
                    last_write[tn] = pos + 0.5

    def walk(stmt: ll.LLStmt) -> None:
        nonlocal pos
        for s in ll.flatten(stmt):
            match s:
                case ll.ForLoop(body=body):
                    walk(body)
                case ll.Set(tn=tn, llsc=sc) | ll.SetFromVec(tn=tn, arg=sc):
                    pos += 1
                    reads(sc)
                    last_write[tn] = pos + 0.5
                case ll.SetLocal(value=sc):
                    pos += 1
                    reads(sc)
                case ll.ZeroOut(tn):
                    pos += 1
                    last_write[tn] = pos + 0.5

    walk(llc)
    return {tn for tn, k in last_write.items() if last_read.get(tn, -1) > k}


def _removed_and_consumed(lowered: Any) -> set[Tnode]:
    """The nodes a CPU stage removed from the code (the portable code touches them, the final
    code does not: a row buffer, a propagated copy) that the portable code consumes. A stage
    removes only a node that may be routine-local, so such a node is local like the ones the
    final code consumes: kept in the context instead, it was never written there, a later
    routine of the same graph could no longer shrink it, and a later reader would read zeros."""
    portable = getattr(lowered, "portable_llc", None)
    if portable is None or portable is lowered.llc:
        return set()
    removed = set(ll.nodes_of(portable)) - set(ll.nodes_of(lowered.llc))
    if not removed:
        return set()
    touching = [s for s in ll.flatten(portable) if not removed.isdisjoint(ll.nodes_of(s))]
    return _consumed(ll.seq(*touching)) & removed


def _touched(lowered: Any) -> set[Tnode]:
    codes = [getattr(lowered, "llc", lowered), getattr(lowered, "portable_llc", None)]
    return {tn for code in codes if code is not None for tn in ll.nodes_of(code)}


def _read_error(routine: str, tn: Tnode) -> LocalNodeError:
    first = local_to(tn) or "<routine>"
    return LocalNodeError(
        f"einjit: routine {routine!r} reads {tn.debug_name()} before writing it, but routine {first!r} made it "
        f"routine-local ({describe(tn.provenance)}): its values do not outlive a call of {first!r}. Call "
        f".materialize() (or .hosted(), to read it from the host too) on the tensor before compiling {first!r}, "
        f"compute it again in {routine!r} (fit.forward_step does), or compile with "
        f"VirtualizeSettings(local_storage=False)")


def local_mode_conflict(tn: Tnode) -> str | None:
    """The advice for a memory-mode change refused because `localize` made `tn` local."""
    first = local_to(tn)
    if first is None:
        return None
    return (f"routine {first!r} made it routine-local; call .materialize() or .hosted() on the tensor before "
            f"compiling {first!r}, or compile with VirtualizeSettings(local_storage=False)")
