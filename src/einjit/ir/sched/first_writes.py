"""First writes: a zero fill whose next user adds into every cell once becomes that user's
stores (`optimize_proc`'s "first_writes" stage, CPU, after the causal clipping and before
fusion).

Backprop accumulates every gradient — `grad =+ term` — into a node zeroed first, since any
number of terms may add into it. When the first nest to touch the node after its `ZeroOut`
adds exactly one term into each of its cells,

    zero_out(g)                              for b, t, j:  g[b, t, j] := e[b, t, j]
    for b, t, j:  g[b, t, j] := g[b, t, j] + e[b, t, j]

the fill wrote the whole array only for the nest to read it back: on the GPT step's 2 MiB
MLP activations the fill and the reread were as much memory traffic as the nest's own reads
(`+.grad, mlp.fc.b.grad` at 5 GB/s). Here the fill is dropped and the nest stores its term
(`fma(a, b, g)` becomes `a * b`), as OCANNL's "initialize on first write" does for zero
neutral elements. `0 + e` is `e` and `fma(a, b, 0)` is `a * b` rounded once, so every value
is the same — but for the sign of a zero: `0 + (-0)` was `+0`, the store keeps `-0`, which
compares equal.

The nest must be the first statement touching the node after the fill (at the same level of
a sequence; loop bodies are searched too), a perfect nest of unclipped loops over the whole
of each axis, each loop indexing one axis of the node, around a body whose only access to
the node is that one update: every cell is then written exactly once and read only by its
own update.

Scheduled contractions get the same treatment in two steps. The scheduler starts the
register blocks of a contraction into a freshly zeroed node at zero instead of loading them
(`zeroed_before`, `zero_start`; a single k chunk only: later chunks load what the earlier
ones stored), which leaves the fill in place; this stage then drops a fill whose next nest
never reads the node and stores into each of its cells exactly once (`overwrites`: every
store's index an injective affine map of its loops, the stores' index ranges disjoint, their
cells summing to the node's size). The fill survives until here because `causal` reads it:
a row block it clips stores nothing, its cells keep their zeros, and a nest with a clipped
loop around its stores is not an overwrite. A clipped loop inside a register block is (the
causal `P v`, `dS k`, `dSᵀ q`, `Pᵀ dY`: each block sums only the terms below the diagonal,
then stores every cell): the clip never reaches the stores.
"""

from __future__ import annotations

import dataclasses
import math

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import Affine, FixedIdx, Iterator
from einjit.ir.tnode import Tnode

__all__ = ["first_writes", "overwrites", "update_term", "zero_start", "zeroed_before"]


def zeroed_before(items: list[ll.LLStmt]) -> list[frozenset[Tnode]]:
    """For each statement of a sequence, the nodes it touches that a `ZeroOut` earlier in the
    sequence filled, untouched since."""
    out: list[frozenset[Tnode]] = []
    zeroed: set[Tnode] = set()
    for s in items:
        touched: frozenset[Tnode] = frozenset()
        if isinstance(s, ll.ZeroOut):
            zeroed.add(s.tn)
        elif isinstance(s, ll.StagedCompilation):
            zeroed.clear()
        elif zeroed:
            touched = frozenset(tn for tn in ll.nodes_of(s) if tn in zeroed)
            zeroed -= touched
        out.append(touched)
    return out


def zero_start(zeroed: bool, n_chunks: int, tail_chunk: int) -> bool:
    """Whether a contraction's register blocks start at zero rather than loading their cells:
    its target is freshly zeroed and the summed loop comes in one chunk (a later chunk must
    load what the earlier ones stored)."""
    return zeroed and n_chunks + (1 if tail_chunk else 0) == 1


def first_writes(llc: ll.LLStmt) -> ll.LLStmt:
    """`llc` with each zero fill whose next user is a covering single update dropped, and
    that update turned into a store (see the module docstring)."""
    items = [_inside(s) for s in ll.flatten(llc)]
    zeroed: dict[Tnode, int] = {}  # a node zeroed at this position, untouched since
    dropped: set[int] = set()
    for n, s in enumerate(items):
        if isinstance(s, ll.ZeroOut):
            zeroed[s.tn] = n
            continue
        if isinstance(s, ll.StagedCompilation):
            zeroed.clear()
            continue
        if not zeroed:
            continue
        for tn in [tn for tn in ll.nodes_of(s) if tn in zeroed]:
            fill = zeroed.pop(tn)
            stored = _stored(s, tn)
            if stored is not None:
                items[n] = s = stored
                dropped.add(fill)
            elif overwrites(items[n:], tn):
                dropped.add(fill)
    return ll.seq(*(s for n, s in enumerate(items) if n not in dropped))


def _inside(s: ll.LLStmt) -> ll.LLStmt:
    """A loop with its body's sequences rewritten the same way (fills inside loops)."""
    if isinstance(s, ll.ForLoop) and any(isinstance(x, ll.ZeroOut) for x in ll.iter_stmts(s.body)):
        return dataclasses.replace(s, body=first_writes(s.body))
    return s


def _stored(s: ll.LLStmt, tn: Tnode) -> ll.LLStmt | None:
    """`s` with its update of `tn` turned into a store, when `s` is a perfect nest adding one
    term into every cell of `tn` once and touching `tn` nowhere else; None otherwise."""
    if not isinstance(s, ll.ForLoop):
        return None
    loops: list[ll.ForLoop] = []
    body: ll.LLStmt = s
    while isinstance(body, ll.ForLoop):
        loops.append(body)
        body = body.body
    parts = list(ll.flatten(body))
    touching = [k for k, p in enumerate(parts) if tn in ll.nodes_of(p)]
    if len(touching) != 1:
        return None
    k = touching[0]
    update = parts[k]
    if not isinstance(update, ll.Set) or update.tn is not tn:
        return None
    term = update_term(update)
    if term is None or not _covers(loops, update):
        return None
    parts[k] = ll.Set(tn, update.idcs, term, update.debug.replace(" =+ ", " =: ", 1))
    new: ll.LLStmt = ll.seq(*parts)
    for lp in reversed(loops):
        new = dataclasses.replace(lp, body=new)
    return new


def update_term(st: ll.Set) -> ll.LLScalar | None:
    """What `st` adds to its own cell (`fma(a, b, self)` adds `a * b`), when it reads the
    node nowhere else; None when it is not such an update."""
    own = ll.Get(st.tn, st.idcs)
    term: ll.LLScalar
    match st.llsc:
        case ll.Binop(ops.Binop.ADD, acc, e) if acc == own:
            term = e
        case ll.Binop(ops.Binop.ADD, e, acc) if acc == own:
            term = e
        case ll.Ternop(ops.Ternop.FMA, a, b, acc) if acc == own:
            term = ll.Binop(ops.Binop.MUL, a, b)
        case _:
            return None
    return None if _reads(term, st.tn) else term


def _covers(loops: list[ll.ForLoop], st: ll.Set) -> bool:
    """Whether the loops visit every cell of `st`'s node once: each unclipped, over a whole
    axis, indexing that axis alone (an axis of one cell may be indexed by 0 instead)."""
    dims = st.tn.dims
    if len(st.idcs) != len(dims):
        return False
    extent = {lp.index: lp for lp in loops}
    seen = set()
    for idx, dim in zip(st.idcs, dims, strict=True):
        if idx == FixedIdx(0) and dim == 1:
            continue
        if not isinstance(idx, Iterator) or idx.symbol not in extent or idx.symbol in seen:
            return False
        lp = extent[idx.symbol]
        if lp.from_ != 0 or lp.to_ != dim - 1 or lp.start is not None or lp.stop is not None:
            return False
        seen.add(idx.symbol)
    return len(seen) == len(loops)


def overwrites(stmts: list[ll.LLStmt], tn: Tnode) -> bool:
    """Whether `stmts` (a scheduled contraction comes as several: its full panels, its tail
    panel), up to the one completing it, store into each cell of `tn` exactly once before any
    of them reads `tn` or clips a loop around its stores. A clipped loop that does not touch
    `tn` is no obstacle: the causal `P v` sums fewer terms into a register block, which the
    unclipped loops around it still store into every cell."""
    sites: list[list[tuple[int, int]]] = []  # per store, per axis: its first cell and reach
    total = 0
    for top in stmts:
        stack: list[tuple[ll.LLStmt, dict]] = [(top, {})]
        while stack:
            stmt, loops = stack.pop()
            for x in ll.flatten(stmt):
                match x:
                    case ll.ForLoop(index=index, from_=lo, to_=hi, body=body, start=None, stop=None):
                        stack.append((body, {**loops, index: (lo, hi)}))
                    case ll.ForLoop() if tn not in ll.nodes_of(x):
                        pass  # a clipped loop of register-block updates (`causal`) stores no cell
                    case ll.Set(tn=target, idcs=idcs, llsc=sc) if not _reads(sc, tn):
                        if target is tn:
                            axes = _injective(idcs, tn.dims, loops)
                            if axes is None:
                                return False
                            sites.append(axes)
                            total += math.prod(hi - lo + 1 for lo, hi in loops.values())
                    case ll.Comment():
                        pass
                    case _:
                        if isinstance(x, ll.ForLoop) or tn in ll.nodes_of(x):
                            return False
        if total >= tn.size:
            break
    if total != tn.size:
        return False
    return all(any(a[0] + a[1] < b[0] or b[0] + b[1] < a[0] for a, b in zip(p, q, strict=True))
               for n, p in enumerate(sites) for q in sites[n + 1:])


def _injective(idcs: tuple, dims: tuple[int, ...], loops: dict) -> list[tuple[int, int]] | None:
    """Per axis, the first cell an affine store index names and how far its cells reach,
    when the index names a different in-bounds cell at every iteration of `loops`; None
    otherwise (a loop indexing no axis, or two, stores a cell twice)."""
    used: set = set()
    axes = []
    for idx, dim in zip(idcs, dims, strict=True):
        match idx:
            case FixedIdx(index=k):
                terms, offset = [], k
            case Iterator(symbol=sym):
                terms, offset = [(1, sym)], 0
            case Affine(symbols=syms, offset=offset):
                terms = list(syms)
            case _:
                return None
        span = 0
        for coeff, sym in sorted(terms, key=lambda t: t[0]):
            if sym not in loops or sym in used or coeff <= span:
                return None
            used.add(sym)
            lo, hi = loops[sym]
            offset += coeff * lo
            span += coeff * (hi - lo)
        if offset < 0 or offset + span > dim - 1:
            return None
        axes.append((offset, span))
    if any(hi > lo for sym, (lo, hi) in loops.items() if sym not in used):
        return None
    return axes


def _reads(sc: ll.LLScalar, tn: Tnode) -> bool:
    """Whether `sc` reads `tn`, local scopes included."""
    return any(isinstance(x, (ll.Get, ll.GetMergeBuffer)) and x.tn is tn for x in ll.deep_parts(sc))
