"""Loop scheduling, the optimizer stage that shapes CPU loop nests for gcc (`optimize_proc`'s
"schedule", after simplification and before interchange).

Two rewrites, both expressed in the low-level IR (so the interpreter runs them and the
printers show them), each on a perfect nest around one accumulating `Set` whose loops may run
in any order (`interchange.reorderable`):

**Contractions** `c[.., i, .., j] := fma(A(i, k), B(j, k), c[.., i, .., j])` with `j` the lhs's
unit-stride axis, `k` the summed loops, `A` not depending on `j` and `B` not on `i`. Whatever
the operands' layouts (`a @ b`, the dense layer's `w @ x`, i.e. A·Bᵀ) this becomes

    for j0:                                   (a panel of NB columns)
      pack[k.., b] := B(NB*j0 + b, k)         (B's panel, contiguous along b)
      for i0:                                 (a block of MB rows)
        acc[a, b] := c[MB*i0 + a, NB*j0 + b]
        for k..: acc[a, b] := fma(A(MB*i0 + a, k), pack[k.., b], acc[a, b])
        c[MB*i0 + a, NB*j0 + b] := acc[a, b]

`acc` and `pack` are routine-local nodes. The `a` loops are marked `unroll`: once gcc has
unrolled them every access to `acc` has a constant row, so it keeps the MB×NB accumulator
block in vector registers (register blocking, unroll-and-jam of `i` and `j`; without the
unrolling the block round-trips through memory at every step and runs at half the speed).
The innermost `b` loop is unit-stride everywhere, so it vectorizes. Every output cell
still sums its terms in the original order, so results are bit-identical to the unscheduled
code. Large contractions also mark one loop `parallel` (see `Blocking.parallel_min_work`),
which the C backend runs on OpenMP threads.

**Reductions** whose innermost loop `k` is summed (a row sum, a matrix-vector product, a
convolution's kernel gradient) and that interchange would leave alone get `Blocking.lanes`
independent partial sums over `k = lanes*k0 + l` (or one per `k` when `k` is short), kept
across all the summed loops — the lhs loops move outside — and added into the target in lane
order at the end. That
reassociates float sums, so it happens only under `VirtualizeSettings.reassociate` (on by
default); integer sums are exact either way. Small partial sums are also more accurate: a
float32 sum of 2,000,000 values in [0, 1) is 2e-7 off instead of 1e-5.

Small nests (under `Blocking.min_work` innermost iterations) are left alone: the rewrites
pay only when the arithmetic dominates.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from einjit.ir import low_level as ll
from einjit.ir import ops, provenance, schedule_conv
from einjit.ir.indexing import (
    AxisIndex,
    FixedIdx,
    Iterator,
    Symbol,
    get_symbol,
    index_symbols,
    make_affine,
    subst_index,
)
from einjit.ir.interchange import best_order, perfect_nest, reorderable
from einjit.ir.tnode import LOCAL, Tnode
from einjit.ir.tracing import VirtualizeSettings


@dataclass(frozen=True)
class Blocking:
    """The stage's size parameters, tuned on the development machine (AVX-512 EPYC, gcc 12).

    `min_work`: innermost iterations below which a nest is not worth rescheduling.
    `nb_choices`: register-block widths along the unit-stride lhs axis for 4-byte elements,
    best first (multiples of the 8-float AVX vector), halved for 8-byte elements so the block
    takes the same registers; an axis none of them divides is blocked by its largest divisor
    up to the first choice, if that is at least `min_nb`.
    `mb_max`: the most rows of a register block: 8 rows × 32 columns measured best.
    `lanes`: partial sums of a split reduction: four 8-float vectors, enough independent FMA
    chains to hide the FMA latency.
    `parallel_min_work`: contractions of at least this many multiply-adds (a millisecond or
    so on one core) mark one loop `parallel`: threads pay off only well above their
    fork-join cost, and on a busy machine every barrier may wait for a descheduled thread.
    `private_max_bytes`: the largest packed panel a thread may copy privately (the C
    renderer's stack limit for local arrays).
    """

    min_work: int = 1 << 16
    nb_choices: tuple[int, ...] = (32, 24, 16, 8)
    min_nb: int = 4
    mb_max: int = 8
    lanes: int = 32
    parallel_min_work: int = 1 << 22
    private_max_bytes: int = 16 * 1024


BLOCKING = Blocking()


def schedule_llc(stmt: ll.LLStmt, settings: VirtualizeSettings, blocking: Blocking = BLOCKING) -> ll.LLStmt:
    """Every eligible nest of `stmt` rescheduled; other code unchanged."""
    return ll.seq(*(_schedule_stmt(s, settings, blocking) for s in ll.flatten(stmt)))


def _schedule_stmt(s: ll.LLStmt, settings: VirtualizeSettings, blocking: Blocking) -> ll.LLStmt:
    if not isinstance(s, ll.ForLoop):
        return s
    loops, body = perfect_nest(s)
    inner = list(ll.flatten(body))
    if len(inner) == 1 and isinstance(inner[0], ll.Set) and all(lp.from_ == 0 for lp in loops):
        st = inner[0]
        new = (schedule_conv.channel_blocked(loops, st, settings, blocking) or _contraction(loops, st, blocking)
               or _split_reduction(loops, st, settings, blocking) or schedule_conv.window_reduction(loops, st)
               if math.prod(lp.to_ + 1 for lp in loops) >= blocking.min_work else None)
        if new is not None:
            return new
    rebuilt = schedule_llc(body, settings, blocking)
    for loop in reversed(loops):
        rebuilt = dataclasses.replace(loop, body=rebuilt)
    return rebuilt


# ---------------------------------------------------------------- shared helpers


def _accumulation(st: ll.Set) -> tuple[str, tuple[ll.LLScalar, ...]] | None:
    """("fma", (x, y)) for `fma(x, y, self)`, ("add", (e,)) for `self + e` / `e + self`."""
    own = ll.Get(st.tn, st.idcs)
    terms: tuple[ll.LLScalar, ...]
    match st.llsc:
        case ll.Ternop(ops.Ternop.FMA, x, y, acc) if acc == own:
            terms, kind = (x, y), "fma"
        case ll.Binop(ops.Binop.ADD, acc, e) if acc == own:
            terms, kind = (e,), "add"
        case ll.Binop(ops.Binop.ADD, e, acc) if acc == own:
            terms, kind = (e,), "add"
        case _:
            return None
    if not reorderable(st) or any(_reads(t, st.tn) for t in terms):
        return None
    return kind, terms


def _reads(sc: ll.LLScalar, tn: Tnode) -> bool:
    return any(isinstance(x, (ll.Get, ll.GetMergeBuffer)) and x.tn is tn for x in ll.iter_scalars(sc))


def _symbols(sc: ll.LLScalar) -> set[Symbol]:
    out: set[Symbol] = set()
    for x in ll.iter_scalars(sc):
        match x:
            case ll.Get(_, idcs) | ll.GetMergeBuffer(_, idcs):
                out.update(s for idx in idcs for s in index_symbols(idx))
            case ll.EmbedIndex(idx):
                out.update(index_symbols(idx))
    return out


def _subst(sc: ll.LLScalar, env: dict[Symbol, AxisIndex]) -> ll.LLScalar:
    """`sc` with loop symbols replaced by indices (no local scopes: `reorderable` excludes them)."""
    match sc:
        case ll.Get(tn, idcs):
            return ll.Get(tn, tuple(subst_index(env, i) for i in idcs))
        case ll.GetMergeBuffer(tn, idcs):
            return ll.GetMergeBuffer(tn, tuple(subst_index(env, i) for i in idcs))
        case ll.EmbedIndex(idx):
            return ll.EmbedIndex(subst_index(env, idx))
        case ll.Unop(op, a):
            return ll.Unop(op, _subst(a, env))
        case ll.Binop(op, a, b):
            return ll.Binop(op, _subst(a, env), _subst(b, env))
        case ll.Ternop(op, a, b, c):
            return ll.Ternop(op, _subst(a, env), _subst(b, env), _subst(c, env))
    return sc


def _nest(loops: list[tuple[Symbol, int]], body: ll.LLStmt, unrolled: frozenset[Symbol] = frozenset(),
          parallel: Symbol | None = None) -> ll.LLStmt:
    for s, n in reversed(loops):
        body = ll.ForLoop(s, 0, n - 1, body, unroll=s in unrolled, parallel=s == parallel)
    return body


def _local(label: str, dims: tuple[int, ...], prec: ops.Prec) -> Tnode:
    return Tnode(label, dims, prec, memory_mode=LOCAL, provenance=provenance.SCHEDULED_LOCAL)


def _unit_stride_axis_symbol(tn: Tnode, idcs: tuple[AxisIndex, ...]) -> Symbol | None:
    for d, idx in reversed(list(zip(tn.dims, idcs, strict=True))):
        if d == 1:
            continue
        return idx.symbol if isinstance(idx, Iterator) else None
    return None


# ---------------------------------------------------------------- contractions


def _contraction(loops: list[ll.ForLoop], st: ll.Set, blocking: Blocking) -> ll.LLStmt | None:
    acc = _accumulation(st)
    if acc is None or acc[0] != "fma" or not st.tn.prec.is_float:
        return None
    x, y = acc[1]
    extent = {lp.index: lp.to_ + 1 for lp in loops}
    lhs = {s for idx in st.idcs for s in index_symbols(idx)}
    summed = [lp.index for lp in loops if lp.index not in lhs]
    j = _unit_stride_axis_symbol(st.tn, st.idcs)
    if not summed or j is None or j not in extent:
        return None
    sx, sy = _symbols(x), _symbols(y)
    if j in sx and j not in sy:
        b_first = True
        a_op, b_op, sa, sb = y, x, sy, sx
    elif j in sy and j not in sx:
        b_first = False
        a_op, b_op, sa, sb = x, y, sx, sy
    else:
        return None
    rows = [lp.index for lp in loops if lp.index in lhs and lp.index != j and lp.index in sa
            and lp.index not in sb and extent[lp.index] > 1]
    if not rows:
        return None
    i = max(rows, key=lambda s: extent[s])
    per_vector = max(1, st.tn.prec.itemsize // 4)
    choices = [d // per_vector for d in blocking.nb_choices if d // per_vector >= blocking.min_nb]
    if not choices:
        return None
    nb = next((d for d in choices if extent[j] % d == 0), None) or _divisor_up_to(extent[j], choices[0])
    mb = _divisor_up_to(extent[i], blocking.mb_max)
    if nb < blocking.min_nb:
        return None
    prec = st.tn.prec
    pack = _local("pack", tuple(extent[k] for k in summed) + (nb,), prec)
    accum = _local("acc", (mb, nb), prec)
    j0, i0, a, b = get_symbol("jp"), get_symbol("ib"), get_symbol("ir"), get_symbol("jr")
    packed = {k: get_symbol(k.name) for k in summed}

    col = make_affine(((nb, j0), (1, b)))
    row = make_affine(((mb, i0), (1, a))) if mb > 1 else Iterator(i0)
    b_env: dict[Symbol, AxisIndex] = {j: col, **{k: Iterator(kp) for k, kp in packed.items()}}
    fill = _nest([*((kp, extent[k]) for k, kp in packed.items()), (b, nb)],
                 ll.Set(pack, tuple(Iterator(kp) for kp in packed.values()) + (Iterator(b),), _subst(b_op, b_env),
                        "pack a panel of the unit-stride operand"))
    cell = tuple(subst_index({i: row, j: col}, idx) for idx in st.idcs)
    block = (Iterator(a) if mb > 1 else FixedIdx(0), Iterator(b))
    a_read = _subst(a_op, {i: row})
    p_read = ll.Get(pack, tuple(Iterator(k) for k in summed) + (Iterator(b),))
    args = (p_read, a_read) if b_first else (a_read, p_read)
    update = ll.Set(accum, block, ll.Ternop(ops.Ternop.FMA, args[0], args[1], ll.Get(accum, block)), st.debug)
    ab = [(a, mb), (b, nb)] if mb > 1 else [(b, nb)]
    unrolled = frozenset({a})
    kernel = ll.seq(
        _nest(ab, ll.Set(accum, block, ll.Get(st.tn, cell)), unrolled),
        _nest([*((k, extent[k]) for k in summed), *ab], update, unrolled),
        _nest(ab, ll.Set(st.tn, cell, ll.Get(accum, block)), unrolled))
    outer = [(lp.index, extent[lp.index]) for lp in loops if lp.index in lhs and lp.index not in (i, j)]
    threaded = _parallel_loop(outer, (i0, extent[i] // mb), pack, extent, blocking)
    body = ll.seq(ll.Comment(f"register-blocked {mb}x{nb} contraction into {st.tn.name}"),
                  fill, ll.ForLoop(i0, 0, extent[i] // mb - 1, kernel, parallel=threaded == i0))
    return _nest([*outer, (j0, extent[j] // nb)], body, parallel=threaded)


def _parallel_loop(outer: list[tuple[Symbol, int]], blocks: tuple[Symbol, int], pack: Tnode,
                   extent: dict[Symbol, int], blocking: Blocking) -> Symbol | None:
    """The loop to run on threads, if the nest is large enough: the outermost batch loop, so
    each thread gets a big share and one fork-join serves the whole nest — provided the
    packed panel, written inside it, is small enough for each thread's private copy on the
    stack; else the row-block loop, whose threads share the panel."""
    if math.prod(extent.values()) < blocking.parallel_min_work:
        return None
    batch = next((s for s, n in outer if n > 1), None)
    if batch is not None and pack.size * pack.prec.itemsize <= blocking.private_max_bytes:
        return batch
    return blocks[0] if blocks[1] > 1 else None


def _divisor_up_to(n: int, most: int) -> int:
    return max(d for d in range(1, most + 1) if n % d == 0)


# ---------------------------------------------------------------- split reductions


def _split_reduction(loops: list[ll.ForLoop], st: ll.Set, settings: VirtualizeSettings,
                     blocking: Blocking) -> ll.LLStmt | None:
    acc = _accumulation(st)
    if acc is None or (st.tn.prec.is_float and not settings.reassociate):
        return None
    kind, terms = acc
    k = loops[-1].index
    n = loops[-1].to_ + 1
    lhs = {s for idx in st.idcs for s in index_symbols(idx)}
    if k in lhs or n < 2 or best_order(loops, st) != loops:
        return None
    if n % blocking.lanes == 0:
        n_lanes = blocking.lanes
    elif n <= 2 * blocking.lanes:
        n_lanes = n
    else:
        return None
    lanes = _local("lanes", (n_lanes,), st.tn.prec)
    k0, lane = get_symbol("k0"), get_symbol("l")
    env: dict[Symbol, AxisIndex] = {k: make_affine(((n_lanes, k0), (1, lane))) if n_lanes < n else Iterator(lane)}
    own = (ll.Get(lanes, (Iterator(lane),)),)
    split = tuple(_subst(t, env) for t in terms)
    value = (ll.Ternop(ops.Ternop.FMA, split[0], split[1], own[0]) if kind == "fma"
             else ll.Binop(ops.Binop.ADD, own[0], split[0]))
    step = ll.ForLoop(lane, 0, n_lanes - 1, ll.Set(lanes, own[0].idcs, value, st.debug))
    if n_lanes < n:
        step = ll.ForLoop(k0, 0, n // n_lanes - 1, step)
    summed = [(lp.index, lp.to_ + 1) for lp in loops[:-1] if lp.index not in lhs]
    body = ll.seq(
        ll.Comment(f"{n_lanes} partial sums into {st.tn.name} (reassociated)"),
        ll.ForLoop(lane, 0, n_lanes - 1, ll.Set(lanes, (Iterator(lane),), ll.Constant(0.0))),
        _nest(summed, step),
        ll.ForLoop(lane, 0, n_lanes - 1,
                   ll.Set(st.tn, st.idcs, ll.Binop(ops.Binop.ADD, ll.Get(st.tn, st.idcs), own[0]))))
    return _nest([(lp.index, lp.to_ + 1) for lp in loops[:-1] if lp.index in lhs], body)
