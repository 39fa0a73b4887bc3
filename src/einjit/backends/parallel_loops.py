"""Which loops of low-level code can run their iterations in parallel.

A loop is parallel when its iterations are independent: every shared node its body writes
is sliced by the loop's index at one axis in all its accesses, and the private nodes (given
by the caller: per-thread or per-iteration scratch) are written before they are read. The
CUDA backend spreads such loops over a grid; a CPU backend could spread them over threads.
"""

from __future__ import annotations

from collections.abc import Iterator as PyIterator
from dataclasses import dataclass

from einjit.ir import low_level as ll
from einjit.ir.indexing import AxisIndex, Iterator
from einjit.ir.tnode import Tnode

__all__ = ["Access", "accesses", "is_parallel", "opaque", "parallel_chain", "reads"]


@dataclass(frozen=True, slots=True)
class Access:
    tn: Tnode
    idcs: tuple[AxisIndex, ...] | None
    write: bool
    vector: bool = False


def accesses(stmt: ll.LLStmt) -> PyIterator[Access]:
    """Array accesses in execution order (a statement's reads before its write). Merge
    buffers are read-only during a routine and are left out."""
    for s in ll.flatten(stmt):
        match s:
            case ll.ForLoop(body=body):
                yield from accesses(body)
            case ll.Set(tn, idcs, sc, _):
                yield from reads(sc)
                yield Access(tn, idcs, True)
            case ll.SetFromVec(tn, idcs, _, _, arg, _):
                yield from reads(arg)
                yield Access(tn, idcs, True, vector=True)
            case ll.SetLocal(_, sc):
                yield from reads(sc)
            case ll.ZeroOut(tn):
                yield Access(tn, None, True)


def reads(sc: ll.LLScalar) -> PyIterator[Access]:
    for x in ll.iter_scalars(sc):
        match x:
            case ll.Get(tn, idcs):
                yield Access(tn, idcs, False)
            case ll.LocalScope(body=body):
                yield from accesses(body)


def is_parallel(loop: ll.ForLoop, private: set[Tnode]) -> bool:
    """Iterations of `loop` are independent: each shared node the body writes is sliced by
    the loop's index at one axis in all its accesses; private nodes are written before read."""
    if loop.to_ < loop.from_ or opaque(loop.body):
        return False
    found = list(accesses(loop.body))
    here = Iterator(loop.index)
    axes: dict[Tnode, set[int]] = {}
    written = {a.tn for a in found if a.write and a.tn not in private}
    first_private: dict[Tnode, Access] = {}
    for a in found:
        if a.tn in private:
            first_private.setdefault(a.tn, a)
            continue
        if a.tn not in written:
            continue
        if a.idcs is None:
            return False
        last = len(a.idcs) - 1
        cand = {p for p, idx in enumerate(a.idcs) if idx == here and not (a.vector and p == last)}
        axes[a.tn] = axes[a.tn] & cand if a.tn in axes else cand
        if not axes[a.tn]:
            return False
    return all(a.write for a in first_private.values())


def opaque(stmt: ll.LLStmt) -> bool:
    """Backend-staged code: what it touches is unknown."""
    return any(isinstance(s, ll.StagedCompilation) for s in ll.iter_stmts(stmt))


def parallel_chain(stmt: ll.LLStmt, private: set[Tnode]) -> tuple[ll.ForLoop, ...]:
    chain: list[ll.ForLoop] = []
    cur = stmt
    while isinstance(cur, ll.ForLoop) and is_parallel(cur, private):
        chain.append(cur)
        inner = list(ll.flatten(cur.body))
        if len(inner) != 1:
            break
        cur = inner[0]
    return tuple(chain)
