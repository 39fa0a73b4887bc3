"""Sums computed inside expressions, split over vector lanes: an optimizer stage for CPU code
(`optimize_proc`'s "scope_sums", after "causal").

The softmax's backward needs each row's `sum(dP * P / total)` inside the expression that
uses it, as a local scope (`ll.LocalScope`):

    v := 0;  for k:  v := v - dP[k] * P[k] / total

The scheduling stage's split sums reach only nests accumulating into a node, so this stayed
one dependent chain of subtractions with a division per term, which gcc does not vectorize:
at T=64 it was a third of the softmax backward's time. Here the scope's innermost loop
becomes `LANES` partial sums over `k = 8*k0 + l`, in a scheduler-local array whose lane loop
gcc vectorizes (the divisions with it), folded pairwise (upper half onto the lower half) and
added into `v` at the end:

    v := 0;  lanes[:] := 0;  for k0: for l:  lanes[l] := lanes[l] - dP[8*k0+l] * P[...] / total
    lanes[l] := lanes[l] + lanes[l+4] (l < 4); ... ;  v := v + lanes[0]

After the causal stage, a clipped scope loop arrives as chunks of `causal.CHUNK` iterations
around a whole loop over the chunk: that whole loop is the lane loop as it is, and the chunk
loop keeps its clip. The lanes are as many as a chunk's iterations on every machine, so a
clipped scope and the same scope whole add the same terms (and zeros) into the same lanes,
and a sum has the same bits under every `EINJIT_MACHINE`.

That reassociates float sums, so it happens only under `VirtualizeSettings.reassociate`, in
single and double precision, for scopes run at least `MIN_WORK` innermost iterations in all.
The partial sums start at +0, so they never become -0 (a sum or difference is -0 only from a
-0 operand, or rounding towards minus infinity), and skipped or added-back terms of zero leave
them as they are, as they left `v`.
"""

from __future__ import annotations

import dataclasses
import math

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import AxisIndex, FixedIdx, Iterator, get_symbol, make_affine
from einjit.ir.passes.tracing import VirtualizeSettings
from einjit.ir.sched import nests
from einjit.ir.sched.causal import CHUNK
from einjit.ir.sched.interchange import perfect_nest, rewrap
from einjit.ir.tnode import Tnode

__all__ = ["LANES", "MIN_WORK", "split_scope_sums"]

MIN_WORK = 1 << 12
"""Innermost iterations (of every run of a scope together) below which it stays as it is: the
split pays only where the chain dominates (the scheduling stage's split sums' threshold)."""

LANES = CHUNK
"""The partial sums: a vector of floats under AVX2, the causal stage's chunk."""


def split_scope_sums(stmt: ll.LLStmt, settings: VirtualizeSettings) -> ll.LLStmt:
    """`stmt` with the sums of its eligible local scopes split into `LANES` partial sums."""
    return _stmt(stmt, 1) if settings.reassociate else stmt


def _stmt(stmt: ll.LLStmt, trips: int) -> ll.LLStmt:
    """`stmt`, run `trips` times, with its scopes split."""
    match stmt:
        case ll.Seq():
            return ll.seq(*(_stmt(s, trips) for s in ll.flatten(stmt)))
        case ll.ForLoop(from_=lo, to_=hi, body=body):
            inner = _stmt(body, trips * max(1, hi - lo + 1))
            return stmt if inner is body else dataclasses.replace(stmt, body=inner)
        case ll.Set(llsc=sc):
            new = _scalar(sc, trips)
            return stmt if new is sc else dataclasses.replace(stmt, llsc=new)
        case ll.SetLocal(sid, sc):
            new = _scalar(sc, trips)
            return stmt if new is sc else ll.SetLocal(sid, new)
    return stmt


def _scalar(sc: ll.LLScalar, trips: int) -> ll.LLScalar:
    """`sc` with the scopes in it split (itself when none is)."""
    match sc:
        case ll.LocalScope(sid, body, orig):
            inner = _stmt(body, trips)
            scope = sc if inner is body else ll.LocalScope(sid, inner, orig)
            return _split(scope, trips) or scope
        case ll.Unop() | ll.Binop() | ll.Ternop():
            parts = ll.scalar_children(sc)
            new = [_scalar(x, trips) for x in parts]
            if all(a is b for a, b in zip(new, parts, strict=True)):
                return sc
            rebuilt = iter(new)
            return ll.map_operands(sc, lambda _: next(rebuilt))
    return sc


def _term(st: ll.SetLocal) -> tuple[ops.Binop, ll.LLScalar] | None:
    """`(op, t)` for `v := v + t`, `v := t + v` or `v := v - t`, `t` not reading `v` nor
    holding a scope of its own."""
    match st.value:
        case ll.Binop(ops.Binop.ADD | ops.Binop.SUB as op, ll.GetLocal(sid), term) if sid == st.id:
            pass
        case ll.Binop(ops.Binop.ADD as op, term, ll.GetLocal(sid)) if sid == st.id:
            pass
        case _:
            return None
    if any(isinstance(x, (ll.GetLocal, ll.LocalScope)) for x in ll.iter_scalars(term)):
        return None
    return op, term


def _split(scope: ll.LocalScope, trips: int) -> ll.LocalScope | None:
    """`scope` with its sum over partial sums; None when it is no eligible sum: one perfect
    nest (the scope's local starts at 0) whose innermost loop, whole from 0, only adds or
    subtracts a term."""
    items = list(ll.flatten(scope.body))
    prec = scope.id.tn.prec
    if (len(items) != 1 or not isinstance(items[0], ll.ForLoop)
            or prec not in nests.VECTOR_PRECS or prec.computed_in != prec):
        return None
    loops, body = perfect_nest(items[0])
    inner = list(ll.flatten(body))
    if len(inner) != 1 or not isinstance(inner[0], ll.SetLocal) or inner[0].id != scope.id:
        return None
    found = _term(inner[0])
    last = loops[-1]
    extent = last.to_ - last.from_ + 1
    if (found is None or last.from_ != 0 or last.start or last.stop or last.unroll or last.parallel
            or extent % LANES or any(lp.keep_order for lp in loops)
            or trips * math.prod(lp.to_ - lp.from_ + 1 for lp in loops) < MIN_WORK):
        return None
    op, term = found
    lanes = nests.scheduler_local("lanes", (LANES,), prec)
    lane = get_symbol("l")
    at: tuple[AxisIndex, ...] = (Iterator(lane),)
    if extent == LANES:  # a causal chunk's whole loop, or a scope loop of one vector
        step: ll.LLStmt = ll.ForLoop(lane, 0, LANES - 1, ll.Set(
            lanes, at, ll.Binop(op, ll.Get(lanes, at), nests.subst(term, {last.index: Iterator(lane)}))))
    else:
        k0 = get_symbol("k0")
        split = nests.subst(term, {last.index: make_affine(((LANES, k0), (1, lane)))})
        step = ll.ForLoop(k0, 0, extent // LANES - 1, ll.ForLoop(
            lane, 0, LANES - 1, ll.Set(lanes, at, ll.Binop(op, ll.Get(lanes, at), split))))
    body = ll.seq(
        ll.Comment(f"{LANES} partial sums into {scope.id.tn.name} (reassociated)"),
        ll.ForLoop(lane, 0, LANES - 1, ll.Set(lanes, at, ll.Constant(0.0))),
        rewrap(loops[:-1], step),
        *_folded(lanes),
        ll.SetLocal(scope.id, ll.Binop(ops.Binop.ADD, ll.GetLocal(scope.id), ll.Get(lanes, (FixedIdx(0),)))))
    return ll.LocalScope(scope.id, body, scope.orig_indices)


def _folded(lanes: Tnode) -> list[ll.LLStmt]:
    """The upper half of the partial sums added onto the lower, until one is left."""
    folds: list[ll.LLStmt] = []
    n = lanes.dims[0]
    while n > 1:
        half = n // 2
        lane = get_symbol("l")
        own: tuple[AxisIndex, ...] = (Iterator(lane),)
        upper: tuple[AxisIndex, ...] = (make_affine(((1, lane),), n - half),)
        folds.append(ll.ForLoop(lane, 0, half - 1, ll.Set(
            lanes, own, ll.Binop(ops.Binop.ADD, ll.Get(lanes, own), ll.Get(lanes, upper)))))
        n -= half
    return folds
