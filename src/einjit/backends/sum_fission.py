"""Column sums taken out of a row nest, so that the rows can go on threads.

A LayerNorm's backward fused with its parameter gradients runs, per row `(b, t)`, row
arithmetic (the row's own cells, row sums into `rsqrt.grad[b, t]`) and column sums over all
rows (`beta.grad[j] += g[b, t, j]`, `gamma.grad[j] += x̂[b, t, j] * g[b, t, j]`). The column
sums make every row loop summed, so no loop of the nest is parallel and the nest ran on one
thread (a twentieth of the 2-block GPT step at 1 thread, its largest serial part at 2).

`split` moves each such sum into a copy of its enclosing loops run after the rest of the
nest: the rest is parallel over the rows, the sums over the columns
(`parallel_loops._split_columns`). Each cell of a sum is still updated in the order of the
rows, and reads the values the nest left in its operands, so results are bit-identical: a
sum moves only where nothing else in the nest touches its target, and each node it reads is
either not written in the nest or written only before it in each iteration of the loops
around both, in cells of that iteration (`g[b, t, j] := ...` for `... += g[b, t, j]`): no
later statement or iteration changes what the sum read.
"""

from __future__ import annotations

import dataclasses

from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, gather_indices
from einjit.ir.tnode import Tnode

__all__ = ["split"]


def split(nest: ll.ForLoop) -> tuple[ll.ForLoop, list[ll.ForLoop]] | None:
    """`nest` as the nest without its movable column sums, and the sums, each group of them
    in a copy of the loops that enclosed it; None when no sum moves (or nothing is left)."""
    if any(isinstance(s, (ll.StagedCompilation, ll.LocalScope)) for s in ll.deep_parts(nest)):
        return None
    places = _places(nest)
    if places is None:
        return None
    uses = _uses(nest)
    moved: dict[int, tuple[tuple[ll.ForLoop, ...], list[ll.ForLoop]]] = {}
    rest = _without_sums(nest, (), uses, places, moved)
    if not moved or not isinstance(rest, ll.ForLoop):
        return None
    return rest, [_rewrap(path, ll.seq(*sums)) for path, sums in moved.values()]


Place = tuple[tuple[ll.ForLoop, ...], tuple[int, ...]]
"""Where a statement is in a nest: the loops around it, outermost first, and its position in
the body of each."""


def _places(nest: ll.ForLoop) -> dict[int, Place] | None:
    """The place of each assignment and loop of `nest` (by identity); None when one object
    is in two places (immutable code may share a subtree), where identity does not tell them
    apart."""
    found: dict[int, Place] = {}
    stack: list[tuple[ll.ForLoop, tuple[ll.ForLoop, ...], tuple[int, ...]]] = [(nest, (), ())]
    while stack:
        loop, path, at = stack.pop()
        for k, st in enumerate(ll.flatten(loop.body)):
            if id(st) in found:
                return None
            found[id(st)] = ((*path, loop), (*at, k))
            if isinstance(st, ll.ForLoop):
                stack.append((st, (*path, loop), (*at, k)))
    return found


def _uses(nest: ll.LLStmt) -> dict[Tnode, list[tuple[ll.LLStmt, bool]]]:
    """Every statement touching each node, and whether it writes it."""
    found: dict[Tnode, list[tuple[ll.LLStmt, bool]]] = {}
    for s in ll.iter_stmts(nest):
        match s:
            case ll.Set(tn, idcs, sc, _) | ll.SetFromVec(tn, idcs, _, _, sc, _):
                found.setdefault(tn, []).append((s, True))
                for read in [*_gets(sc), *(ll.Get(g.ids, g.idcs) for g in gather_indices(idcs))]:
                    found.setdefault(read.tn, []).append((s, False))
            case ll.SetLocal(_, sc):
                for g in _gets(sc):
                    found.setdefault(g.tn, []).append((s, False))
            case ll.ZeroOut(tn):
                found.setdefault(tn, []).append((s, True))
    return found


def _gets(sc: ll.LLScalar) -> list[ll.Get]:
    """The reads of `sc`, the index arrays its run-time indices read included (as `Get`s)."""
    gets = [x for x in ll.iter_scalars(sc) if isinstance(x, ll.Get)]
    return gets + [ll.Get(g.ids, g.idcs) for x in gets for g in gather_indices(x.idcs)]


def _without_sums(loop: ll.ForLoop, path: tuple[ll.ForLoop, ...], uses: dict[Tnode, list[tuple[ll.LLStmt, bool]]],
                  places: dict[int, Place], moved: dict[int, tuple[tuple[ll.ForLoop, ...], list[ll.ForLoop]]]
                  ) -> ll.LLStmt:
    """`loop` with the sums of its body (and of loops inside) left out, recorded in `moved`."""
    here = (*path, loop)
    kept: list[ll.LLStmt] = []
    for s in ll.flatten(loop.body):
        if not isinstance(s, ll.ForLoop):
            kept.append(s)
            continue
        sums, rest = _sums_of(s, here, uses, places)
        if not sums:
            kept.append(_without_sums(s, here, uses, places, moved))
            continue
        moved.setdefault(id(loop), (here, []))[1].append(dataclasses.replace(s, body=ll.seq(*sums)))
        if any(not isinstance(st, ll.Comment) for st in rest):
            kept.append(dataclasses.replace(s, body=ll.seq(*rest)))
    if not any(not isinstance(s, ll.Comment) for s in kept):
        return ll.Noop()
    return dataclasses.replace(loop, body=ll.seq(*kept))


def _sums_of(s: ll.ForLoop, path: tuple[ll.ForLoop, ...], uses: dict[Tnode, list[tuple[ll.LLStmt, bool]]],
             places: dict[int, Place]) -> tuple[list[ll.LLStmt], list[ll.LLStmt]]:
    """The statements of the innermost loop `s` that move (`_movable`), and those that stay;
    none move out of a loop holding a loop. Fusion puts a column sum in the loop of the row's
    own arithmetic (GELU's backward with its bias gradient, LayerNorm's with gamma's and
    beta's): the sum moves out of that loop alone, into a copy of it."""
    body = list(ll.flatten(s.body))
    if (any(isinstance(st, ll.ForLoop) for st in body) or s.parallel or s.unroll or s.start or s.stop
            or s.from_ != 0):
        return [], body
    sums: list[ll.LLStmt] = [st for st in body if isinstance(st, ll.Set) and _movable(st, s, path, uses, places)]
    return sums, [st for st in body if not any(st is m for m in sums)]


def _movable(st: ll.Set, s: ll.ForLoop, path: tuple[ll.ForLoop, ...], uses: dict[Tnode, list[tuple[ll.LLStmt, bool]]],
             places: dict[int, Place]) -> bool:
    """`st`, in the innermost loop `s` (`for j { .. x[..] := f(x[..], ...) .. }`), is summed over
    a loop of `path` (one that does not index its target as itself: a bias gradient `db[j]`, a
    position embedding's `dp[t, j]`, a scatter into `dw[ids[b, t], j]`), is the only statement
    of the nest touching `x`, and each node it reads (index arrays included) is either not
    written in the nest or written only before it, in the cells of the iteration it reads
    (`_done_before`)."""
    enclosing = {p.index for p in path}
    if (Iterator(s.index) not in st.idcs or all(Iterator(sym) in st.idcs for sym in enclosing)
            or ll.Get(st.tn, st.idcs) not in _gets(st.llsc)):
        return False
    if any(u is not st for u, _ in uses.get(st.tn, [])):
        return False
    for g in _gets(st.llsc) + [ll.Get(x.ids, x.idcs) for x in gather_indices(st.idcs)]:
        if g.tn is not st.tn and not all(_done_before(u, places, st, g) for u, w in uses.get(g.tn, []) if w):
            return False
    return True


def _done_before(writer: ll.LLStmt, places: dict[int, Place], st: ll.Set, read: ll.Get) -> bool:
    """`writer` runs before `st` in each iteration of the loops around both (in a statement
    before `st`'s in the innermost such loop's body), and writes only cells of that iteration
    (each such loop indexes the written and the read cell at one axis as itself), so nothing
    later changes the cell `st` reads: a row's values (`g[b, t, j]`, `mean[b, t]`), computed
    in an earlier loop over the row's columns or an earlier pass over the rows of `b`."""
    if not isinstance(writer, (ll.Set, ll.SetFromVec)):
        return False
    (w_loops, w_at), (s_loops, s_at) = places[id(writer)], places[id(st)]
    n = 0
    while n < min(len(w_loops), len(s_loops)) and w_loops[n] is s_loops[n]:
        n += 1
    if w_at[n - 1] >= s_at[n - 1]:
        return False
    return all(any(w == r == Iterator(loop.index) for w, r in zip(writer.idcs, read.idcs, strict=True))
               for loop in s_loops[:n])


def _rewrap(loops: tuple[ll.ForLoop, ...], body: ll.LLStmt) -> ll.ForLoop:
    for loop in reversed(loops):
        body = dataclasses.replace(loop, body=body)
    assert isinstance(body, ll.ForLoop)
    return body
