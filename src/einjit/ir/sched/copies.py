"""Copy propagation: a nest that only copies one array into another is dropped, and either the
copy's readers read the source, or the source's writers write the copy (`optimize_proc`'s
"copies" stage, CPU, before fusion).

Backprop through an addition hands the sum's gradient to each addend unchanged, and lowering
writes each addend's gradient as its own node: `grad_61[b, t, j] := grad_62[b, t, j]`. The GPT
step had fourteen such copies, of 0.5 to 2 MiB each — the MLP bias's (`+.grad`), the residual
stream's into both branches, the LayerNorm's `beta` gradient into its `gamma` branch. Each one
is a store stream and a second array that its readers stream back in, from the last-level
cache or memory: in the fused `+.grad, mlp.fc.b.grad` nest the copy was a third of the traffic.

A copy `dst[i, j, ..] := src[i, j, ..]` (`nests.identity_copy`: all of `src`, cell by cell, in
a node of the same shape and precision) is dropped and every later read of `dst` reads `src`
at the same index, when:

- `dst` is written by nothing else in the routine, and read only after the copy — at least
  once: a node the routine never reads again is a result, kept for whoever reads it next;
- `dst` is, or may become, storage of this routine alone (`local_storage`: not hosted, not
  kept in a context by a routine compiled earlier, a memory mode that allows `Local`), so
  nobody outside the routine looks for its cells;
- `src` is written by no statement after the copy: every read of `dst[c]` then finds
  `src[c]` as the copy left it.

The residual stream's gradient is copied into the block's input gradient, which the block's
first LayerNorm then adds to: `dst` is written again, and its readers cannot read `src`. The
copy is coalesced the other way — every statement that wrote or read `src` writes or reads
`dst`, and the copy goes — when:

- `src` may be storage of this routine alone, and the first statement touching it writes it
  without reading it: nothing looks for its cells outside, nor for what they held before;
- `dst` is not touched from that first statement up to the copy: what it held before is
  read (if at all) before `src` is first written, and overwritten by the copy anyway;
- `src` is written by no statement after the copy, and every later read of `src` comes before
  the first statement after the copy that writes `dst`: each finds what the copy left.

Readers are pointed at sources first, then copies coalesced, until neither drops a copy. No
value changes; results are bit-identical. Chains (`a := b`, later `c := a`) collapse, since
the nests are taken in program order on the code already rewritten; the comments of the
statements rewritten name the node they now read. Code with staged (backend-rendered)
statements is left as it is (their text may name `dst`), and so is a copy of or into a node
read through a merge buffer.
"""

from __future__ import annotations

from einjit.ir import low_level as ll
from einjit.ir.sched import nests
from einjit.ir.sched.causal import may_be_local
from einjit.ir.tnode import Tnode

__all__ = ["accesses", "propagate_copies"]


def propagate_copies(llc: ll.LLStmt, *, local_storage: bool = True) -> ll.LLStmt:
    """`llc` without the copy nests that can go (see the module)."""
    items = list(ll.flatten(llc))
    if not local_storage or not any(_copy(s) for s in items):
        return llc
    reads: list[set[Tnode]] = []
    writes: list[set[Tnode]] = []
    merged: set[Tnode] = set()
    for s in items:
        r, w = accesses(s, merged)
        if r is None:
            return llc
        reads.append(r)
        writes.append(w)
    while _drop(items, reads, writes, merged, coalesce=False) | _drop(items, reads, writes, merged, coalesce=True):
        pass
    return ll.seq(*items)


def _drop(items: list[ll.LLStmt], reads: list[set[Tnode]], writes: list[set[Tnode]], merged: set[Tnode], *,
          coalesce: bool) -> bool:
    """Drops, in program order, the copies whose readers can read the source, or (`coalesce`)
    whose source's writers can write the copy; whether any went. Readers go first: coalescing
    `grad_52 := grad_65` (the residual's branch) would write `grad_65`'s cells again after the
    MLP branch's copy `grad_64 := grad_65`, whose readers could otherwise read `grad_65`."""
    dropped = False
    k = 0
    while k < len(items):
        copy = _copy(items[k])
        if copy is None or copy[0] in merged:
            k += 1
            continue
        dst, src = copy
        if not coalesce and _removable(dst, src, k, reads, writes):
            for j in range(k + 1, len(items)):
                if dst in reads[j]:
                    items[j] = nests.read_from(items[j], {dst: src}, notes=True)
                    reads[j] = (reads[j] - {dst}) | {src}
        elif coalesce and src not in merged and _coalescible(dst, src, k, reads, writes):
            for j in range(len(items)):
                if src in reads[j] or src in writes[j]:
                    items[j] = nests.retarget(items[j], {src: dst}, writes=True, notes=True)
                    reads[j], writes[j] = _renamed(reads[j], src, dst), _renamed(writes[j], src, dst)
        else:
            k += 1
            continue
        del items[k], reads[k], writes[k]
        dropped = True
    return dropped


def _removable(dst: Tnode, src: Tnode, k: int, reads: list[set[Tnode]], writes: list[set[Tnode]]) -> bool:
    if not may_be_local(dst):
        return False
    before, after = range(k), range(k + 1, len(reads))
    return (not any(dst in writes[j] or dst in reads[j] for j in before)
            and not any(dst in writes[j] or src in writes[j] for j in after)
            and any(dst in reads[j] for j in after))


def _coalescible(dst: Tnode, src: Tnode, k: int, reads: list[set[Tnode]], writes: list[set[Tnode]]) -> bool:
    """Whether `src`'s writers may write `dst` instead, and the copy at `k` go (see the module)."""
    if not may_be_local(src):
        return False
    first = next(j for j in range(len(reads)) if src in reads[j] or src in writes[j])
    if first == k or src in reads[first] or any(dst in reads[j] or dst in writes[j] for j in range(first, k)):
        return False
    after = range(k + 1, len(reads))
    rewritten = next((j for j in after if dst in writes[j]), len(reads))
    return not any(src in writes[j] or (src in reads[j] and j >= rewritten) for j in after)


def _renamed(nodes: set[Tnode], src: Tnode, dst: Tnode) -> set[Tnode]:
    return (nodes - {src}) | {dst} if src in nodes else nodes


def _copy(stmt: ll.LLStmt) -> tuple[Tnode, Tnode] | None:
    """`(dst, src)` when `stmt` is a whole-array copy nest in one precision (see the module)."""
    match nests.identity_copy(stmt):
        case (dst, src) if dst.prec == src.prec:
            return dst, src
    return None


def accesses(stmt: ll.LLStmt, merged: set[Tnode]) -> tuple[set[Tnode] | None, set[Tnode]]:
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
