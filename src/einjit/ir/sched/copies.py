"""Copy propagation: a nest that only copies one array into another is dropped, and the copy's
readers read the source (`optimize_proc`'s "copies" stage, CPU, before fusion).

Backprop through an addition hands the sum's gradient to each addend unchanged, and lowering
writes each addend's gradient as its own node: `grad_61[b, t, j] := grad_62[b, t, j]`. The GPT
step had fourteen such copies, of 0.5 to 2 MiB each — the MLP bias's (`+.grad`), the residual
stream's into both branches, the LayerNorm's `beta` gradient into its `gamma` branch. Each one
is a store stream and a second array that its readers stream back in, from the last-level
cache or memory: in the fused `+.grad, mlp.fc.b.grad` nest the copy was a third of the traffic.

A copy `dst[i, j, ..] := src[i, j, ..]` (a perfect nest of unclipped loops, one per axis over
the whole of it, arrays of the same shape and precision) is dropped and every later read of
`dst` reads `src` at the same index, when:

- `dst` is written by nothing else in the routine, and read only after the copy — at least
  once: a node the routine never reads again is a result, kept for whoever reads it next;
- `dst` is, or may become, storage of this routine alone (`local_storage`: not hosted, not
  kept in a context by a routine compiled earlier, a memory mode that allows `Local`), so
  nobody outside the routine looks for its cells;
- `src` is written by no statement after the copy: every read of `dst[c]` then finds
  `src[c]` as the copy left it.

No value changes; results are bit-identical. Chains (`a := b`, later `c := a`) collapse, since
the nests are taken in program order on the code already rewritten. Code with staged
(backend-rendered) statements is left as it is (their text may name `dst`), and so is a copy
into a node read through a merge buffer.
"""

from __future__ import annotations

from einjit.ir import low_level as ll
from einjit.ir.indexing import AxisIndex, Iterator
from einjit.ir.sched import nests
from einjit.ir.sched.causal import may_be_local
from einjit.ir.tnode import Tnode

__all__ = ["propagate_copies"]


def propagate_copies(llc: ll.LLStmt, *, local_storage: bool = True) -> ll.LLStmt:
    """`llc` without the copy nests that can go (see the module)."""
    items = list(ll.flatten(llc))
    if not local_storage or not any(_copy(s) for s in items):
        return llc
    reads: list[set[Tnode]] = []
    writes: list[set[Tnode]] = []
    merged: set[Tnode] = set()
    for s in items:
        r, w = _accesses(s, merged)
        if r is None:
            return llc
        reads.append(r)
        writes.append(w)
    k = 0
    while k < len(items):
        copy = _copy(items[k])
        if copy is None or copy[0] in merged or not _removable(*copy, k, reads, writes):
            k += 1
            continue
        dst, src = copy
        for j in range(k + 1, len(items)):
            if dst in reads[j]:
                items[j] = nests.read_from(items[j], {dst: src})
                reads[j] = (reads[j] - {dst}) | {src}
        del items[k], reads[k], writes[k]
    return ll.seq(*items)


def _removable(dst: Tnode, src: Tnode, k: int, reads: list[set[Tnode]], writes: list[set[Tnode]]) -> bool:
    if not may_be_local(dst):
        return False
    before, after = range(k), range(k + 1, len(reads))
    return (not any(dst in writes[j] or dst in reads[j] for j in before)
            and not any(dst in writes[j] or src in writes[j] for j in after)
            and any(dst in reads[j] for j in after))


def _copy(stmt: ll.LLStmt) -> tuple[Tnode, Tnode] | None:
    """`(dst, src)` when `stmt` is a whole-array copy nest (see the module)."""
    loops: list[ll.ForLoop] = []
    while isinstance(stmt, ll.ForLoop):
        if (stmt.start is not None or stmt.stop is not None or stmt.parallel or stmt.from_ != 0
                or not stmt.trace_it):
            return None
        loops.append(stmt)
        stmt = stmt.body
    match stmt:
        case ll.Set(dst, idcs, ll.Get(src, src_idcs)) if src_idcs == idcs and src is not dst:
            pass
        case _:
            return None
    if (not loops or dst.dims != src.dims or dst.prec != src.prec or len(idcs) != len(loops)
            or not _whole(idcs, loops, dst.dims)):
        return None
    return dst, src


def _whole(idcs: tuple[AxisIndex, ...], loops: list[ll.ForLoop], dims: tuple[int, ...]) -> bool:
    """Whether axis `a` is indexed by a loop of its own over `0 .. dims[a] - 1`, for every `a`."""
    extent = {loop.index: loop.to_ + 1 for loop in loops}
    symbols = [idx.symbol for idx in idcs if isinstance(idx, Iterator)]
    return (len(symbols) == len(idcs) and len(set(symbols)) == len(symbols)
            and all(extent.get(s) == d for s, d in zip(symbols, dims, strict=True)))


def _accesses(stmt: ll.LLStmt, merged: set[Tnode]) -> tuple[set[Tnode] | None, set[Tnode]]:
    """The nodes `stmt` reads and writes (None read: it holds staged code), adding those it
    reads through a merge buffer to `merged`."""
    reads: set[Tnode] = set()
    writes: set[Tnode] = set()
    for x in ll.deep_parts(stmt):
        match x:
            case ll.Get(tn, _):
                reads.add(tn)
            case ll.Set(tn=tn) | ll.SetFromVec(tn=tn) | ll.ZeroOut(tn):
                writes.add(tn)
            case ll.GetMergeBuffer(tn, _):
                merged.add(tn)
            case ll.StagedCompilation():
                return None, writes
    return reads, writes
