"""Max and min reductions over lanes, an optimizer stage for CPU code (`optimize_proc`'s
"extrema", after "schedule").

A row maximum (softmax's `max`, the loss's log-sum-exp) arrives as one statement
`m[i] = max(m[i], x[i, k])` inside the loops of its nest, `k` innermost. In C that is one
dependent chain of NaN-aware compares through `m[i]`: gcc vectorizes no part of it, and
softmax's max ran at 3 GB/s, slower than the `exp` after it. Here the innermost loop is split
into `lanes` independent partial extrema, `k = lanes*k0 + l`, kept across all the reduced loops
(the lhs loops move outside, as in the scheduling stage's split sums), folded pairwise (upper
half onto the lower) and combined into the target at the end. The partial extrema are a plain
array whose lane loop gcc vectorizes (compare and blend); the softmax max ran 6x faster.

A maximum is the same set of values whichever order it is taken in, NaNs included (any NaN
makes it NaN): only the sign of a zero tie and the payload of a NaN may differ, so the split
happens only under `VirtualizeSettings.reassociate`, and only in single and double precision
(what the lanes' neutral infinities and gcc's vector compares cover). Nests the scheduling
stage rewrote, nests of fewer than `MIN_WORK` innermost iterations, innermost extents the
lanes do not divide, and nests that interchange would reorder are left alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import AxisIndex, FixedIdx, Iterator, Symbol, get_symbol, index_symbols, make_affine
from einjit.ir.passes.tracing import VirtualizeSettings
from einjit.ir.sched import nests
from einjit.ir.sched.interchange import best_order, perfect_nest, reorderable, rewrap
from einjit.ir.sched.machine import host_machine
from einjit.ir.tnode import Tnode

EXTREMA = (ops.Binop.MAX, ops.Binop.MIN)

MIN_WORK = 1 << 12
"""Innermost iterations below which a nest stays as it is: the split pays only where the chain
dominates (the same threshold as the scheduling stage's split sums)."""


def split_extrema(stmt: ll.LLStmt, settings: VirtualizeSettings, vector_bytes: int | None = None) -> ll.LLStmt:
    """Every eligible max or min reduction nest of `stmt` split into partial extrema over
    `vector_bytes` worth of lanes (default: the host's vectors). Code with no nest to split is
    returned as it is (rebuilding every loop of a training step cost most of the stage)."""
    width = host_machine().vector_bytes if vector_bytes is None else vector_bytes
    parts = list(ll.flatten(stmt))
    new = [_split_stmt(s, settings, width) for s in parts]
    if all(a is b for a, b in zip(parts, new, strict=True)):
        return stmt
    return ll.seq(*new)


def _split_stmt(s: ll.LLStmt, settings: VirtualizeSettings, vector_bytes: int) -> ll.LLStmt:
    if not isinstance(s, ll.ForLoop):
        return s
    loops, body = perfect_nest(s)
    if any(lp.keep_order for lp in loops):
        return s
    inner = list(ll.flatten(body))
    if len(inner) == 1 and isinstance(inner[0], ll.Set) and all(lp.from_ == 0 for lp in loops):
        new = _split(loops, inner[0], settings, vector_bytes)
        if new is not None:
            return new
    new_body = split_extrema(body, settings, vector_bytes)
    return s if new_body is body else rewrap(loops, new_body)


def _extremum(st: ll.Set) -> tuple[ops.Binop, ll.LLScalar, bool] | None:
    """(op, term, own first) for `self = max(self, term)` or `max(term, self)` (and `min`)."""
    own = ll.Get(st.tn, st.idcs)
    match st.llsc:
        case ll.Binop(op, acc, term) if op in EXTREMA and acc == own:
            first = True
        case ll.Binop(op, term, acc) if op in EXTREMA and acc == own:
            first = False
        case _:
            return None
    if not reorderable(st) or nests.reads(term, st.tn):
        return None
    return op, term, first


def _split(loops: list[ll.ForLoop], st: ll.Set, settings: VirtualizeSettings, vector_bytes: int) -> ll.LLStmt | None:
    found = _extremum(st)
    prec = st.tn.prec
    if found is None or not settings.reassociate or prec not in nests.VECTOR_PRECS:
        return None
    op, term, own_first = found
    k, n = loops[-1].index, loops[-1].to_ + 1
    n_lanes = max(1, vector_bytes // prec.itemsize)
    lhs = {s for idx in st.idcs for s in index_symbols(idx)}
    work = math.prod(lp.to_ + 1 for lp in loops)
    if k in lhs or n_lanes < 2 or n % n_lanes or work < MIN_WORK or best_order(loops, st) != loops:
        return None
    lanes = nests.scheduler_local("lanes", (n_lanes,), prec)
    k0, lane = get_symbol("k0"), get_symbol("l")
    at: tuple[AxisIndex, ...] = (Iterator(lane),)
    own = ll.Get(lanes, at)

    def combine(a: ll.LLScalar, b: ll.LLScalar) -> ll.LLScalar:
        return ll.Binop(op, a, b) if own_first else ll.Binop(op, b, a)

    split = nests.subst(term, {k: make_affine(((n_lanes, k0), (1, lane)))})
    step = ll.ForLoop(k0, 0, n // n_lanes - 1, ll.ForLoop(lane, 0, n_lanes - 1,
                                                         ll.Set(lanes, at, combine(own, split), st.debug)))
    summed = [(lp.index, lp.to_ + 1) for lp in loops[:-1] if lp.index not in lhs]
    assert op.neutral is not None  # max and min have infinities
    body = ll.seq(
        ll.Comment(f"{n_lanes} partial {op.name.lower()}ima into {st.tn.name} (reassociated)"),
        ll.ForLoop(lane, 0, n_lanes - 1, ll.Set(lanes, at, ll.Constant(op.neutral))),
        nests.nest(summed, step),
        *_folded(lanes, lane, combine),
        ll.Set(st.tn, st.idcs, combine(ll.Get(st.tn, st.idcs), ll.Get(lanes, (FixedIdx(0),)))))
    return rewrap([lp for lp in loops[:-1] if lp.index in lhs], body)


def _folded(lanes: Tnode, lane: Symbol, combine: Callable[[ll.LLScalar, ll.LLScalar], ll.LLScalar]
            ) -> list[ll.LLStmt]:
    """The upper half of the partial extrema combined onto the lower, until one is left:
    log2(lanes) vector steps rather than one dependent step per lane."""
    folds: list[ll.LLStmt] = []
    n = lanes.dims[0]
    while n > 1:
        half = n // 2
        top = n - half
        own: tuple[AxisIndex, ...] = (Iterator(lane),)
        upper: tuple[AxisIndex, ...] = (make_affine(((1, lane),), top),)
        fold = ll.Set(lanes, own, combine(ll.Get(lanes, own), ll.Get(lanes, upper)))
        folds.append(ll.ForLoop(lane, 0, half - 1, fold))
        n = top
    return folds
