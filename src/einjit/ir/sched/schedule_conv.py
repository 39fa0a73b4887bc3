"""Convolution nests (and contractions shaped like them) for the scheduling stage:
`schedule.schedule_llc` offers a convolution nest to `channel_blocked` before its generic
rewrites, a plain contraction after its own blocking declines it, and every nest to
`window_reduction` last.

A convolution's nests carry affine indices (`x[b, ci, oh+kh, ow+kw]`). In the NCHW layout of
`einjit.nn` the lhs's unit-stride axis is an image row of 11 or 26 cells, which no vector width
divides, or a 3-cell kernel row; the generic contraction then blocks badly or not at all, while
the channel and batch axes are multiples of the vector width.

**Channel blocking.** A contraction `c[..] := fma(x, y, c[..])` with an affine index anywhere —
the forward `y[b,co,oh,ow] += x[b,ci,oh+kh,ow+kw] * w[co,ci,kh,kw]`, the kernel gradient
`gw[co,ci,kh,kw] += x[b,ci,oh+kh,ow+kw] * gy[b,co,oh,ow]` and the input gradient
`gx[b,ci,oh+kh,ow+kw] += gy[b,co,oh,ow] * w[co,ci,kh,kw]` — is register-blocked like
`schedule`'s contractions, but with the vector axis `j` chosen among the lhs's plain iterators
by the widest vector block its extent takes, not by its stride. The operand that depends on `j`
is packed contiguous along `j` (an im2col panel, or the transposed output gradient), so the
innermost loop is unit-stride whatever the layout; its panel is filled once per value of the
loops it depends on, outside the others. The block's loads and stores of `c` are strided, but
they happen once per whole sum. Every cell of a plain-iterator lhs still sums its terms in the
original order (bit-identical). An affine lhs (the input gradient's scatter `oh+kh`) is summed
by several loops at once, and blocking reorders those terms: it is done only under
`VirtualizeSettings.reassociate`.
A plain contraction that `schedule`'s own blocking declines is blocked the same way. Where the
lhs's unit-stride axis is a candidate (NHWC, `w[kh, kw, ci, co]`), `schedule`'s contraction
blocks along it instead, unless the sum is split (below): the convnet's NHWC kernel gradient,
threaded over its 3 kernel rows, kept a core idle a third of its time.

**Split sums.** A kernel gradient sums tens of thousands of terms into each of a few hundred
cells: the convnet's first has 72 cells (3 row blocks of 8 channels), 43,264 terms each, so
its loops over cells give two threads 3 blocks to share, and its panel (1.4 MB, the whole
output gradient) is packed by one thread. Where a plain lhs's cells sum at least
`SPLIT_MIN_TERMS` terms, its outermost summed loop (the batch) is cut into `SPLIT_CHUNKS`
chunks, outermost: each chunk packs its own panel (a quarter of the bytes, in a core's L2)
and sums its terms into its own partial sums, `part[chunk, cell]`; a small nest then adds
`c + part[0] + part[1] + ...` in chunk order. The chunks are independent, so the threading
stage runs them on threads (`backends/parallel_loops.py`), and the count does not depend on
the thread count: 1 and 2 threads give the same bits. The terms' order changes (chunk by
chunk), so this happens only under `VirtualizeSettings.reassociate`. The partial sums are a
routine-local array (provenance `ROUTINE_LOCAL`), not per-iteration scratch: each chunk
writes its own slice, and the adding nest reads them all.

**Window reductions.** Max pooling, `m[b,c,oh,ow] := max(m[b,c,oh,ow], x[b,c,2*oh+kh,2*ow+kw])`,
arrives with its 2x2 window loops innermost. gcc cannot vectorize those, and its scalar code
for the NaN-propagating max branches on the data, which mispredicts about every other window
element. Moving an lhs loop whose extent the vector width divides (the channels, stride 169)
innermost lets gcc vectorize the max across it with strided loads, branch-free (5x faster on
the convnet's first pooling). Each cell still sees its window in the original order
(bit-identical). The nest is marked `keep_order`, so the interchange stage, which would move
the unit-stride `ow` back inside, leaves it alone.
"""

from __future__ import annotations

import dataclasses
import math

from einjit.ir import low_level as ll
from einjit.ir import ops, provenance
from einjit.ir.indexing import (
    Affine,
    AxisIndex,
    FixedIdx,
    Iterator,
    Symbol,
    get_symbol,
    index_symbols,
    make_affine,
    subst_index,
)
from einjit.ir.passes.tracing import VirtualizeSettings
from einjit.ir.sched import bf16_widen, cost_model, nests
from einjit.ir.sched import schedule as sched
from einjit.ir.sched.interchange import reorderable
from einjit.ir.tnode import LOCAL, Tnode

NB_MAX = 16
"""The widest channel block, in 4-byte elements. The block's loads and stores of the lhs are
strided here, cell by cell: 8x32 blocks ran the `einjit.nn` convnet step 15% slower than 8x16
(one AVX-512 register per row), and took gcc longer."""

SPLIT_MIN_TERMS = 4096
"""Terms summed into each cell from which a plain-lhs nest's sum is split into chunks: the
convnet's kernel gradients (7,744 and 43,264 terms), not its forward convolutions (9 and 72)
nor its dense layer's gradients (64)."""

SPLIT_CHUNKS = 4
"""Chunks of a split sum: 2 per thread at 2 threads, 1 at 4; a chunk's panel in L2."""

WINDOW_MAX = 16
"""The most iterations of a window reduction's window loops (its innermost summed loops)."""

VECTOR_BYTES = 32
"""The vector gcc vectorizes a window reduction with (AVX2): at `-O2` it vectorizes only loops
whose trip count the vector divides, so the moved loop's extent must be a multiple of it."""


def has_affine(st: ll.Set) -> bool:
    """Whether `st` reads or writes through an affine index: a convolution's nest."""
    reads = (x.idcs for x in ll.iter_scalars(st.llsc) if isinstance(x, ll.Get))
    return any(isinstance(idx, Affine) for idcs in (st.idcs, *reads) for idx in idcs)


def _fma_terms(st: ll.Set) -> tuple[ll.LLScalar, ll.LLScalar] | None:
    """`(x, y)` for `st` = `c := fma(x, y, c)` whose terms neither read `c` nor open a scope."""
    match st.llsc:
        case ll.Ternop(ops.Ternop.FMA, x, y, ll.Get(tn, idcs)) if tn is st.tn and idcs == st.idcs:
            pass
        case _:
            return None
    if any(nests.reads(t, st.tn) or any(isinstance(s, ll.LocalScope) for s in ll.iter_scalars(t)) for t in (x, y)):
        return None
    return x, y


def _scatter(st: ll.Set) -> bool:
    """Whether the lhs is affine, each loop symbol in at most one of its indices."""
    if not any(isinstance(idx, Affine) for idx in st.idcs):
        return False
    if not all(isinstance(idx, (Iterator, FixedIdx, Affine)) for idx in st.idcs):
        return False
    syms = [s for idx in st.idcs for s in index_symbols(idx)]
    return len(syms) == len(set(syms))


def channel_blocked(loops: list[ll.ForLoop], st: ll.Set, settings: VirtualizeSettings,
                    blocking: sched.Blocking) -> ll.LLStmt | None:
    """The channel-blocked nest, or None when it does not apply."""
    terms = _fma_terms(st)
    if terms is None or not st.tn.prec.is_float:
        return None
    scatter = _scatter(st)
    if scatter and not settings.reassociate or not scatter and not reorderable(st):
        return None
    x, y = terms
    extent = {lp.index: lp.to_ + 1 for lp in loops}
    lhs = {s for idx in st.idcs for s in index_symbols(idx)}
    summed = [lp.index for lp in loops if lp.index not in lhs]
    if not summed or not lhs <= extent.keys():
        return None
    sx, sy = nests.symbols(x), nests.symbols(y)
    per_vector = max(1, st.tn.prec.computed_in.itemsize // 4)
    choices = [d // per_vector for d in blocking.nb_choices if blocking.min_nb <= d // per_vector <= NB_MAX]

    def width(s: Symbol) -> int:
        return next((d for d in choices if extent[s] % d == 0), 0)

    plain = [idx.symbol for idx in st.idcs if isinstance(idx, Iterator)]
    candidates = [s for s in plain if (s in sx) != (s in sy) and width(s)]
    chunks = 1 if scatter else _chunks(st, summed, extent, settings)
    if (not candidates or not scatter and nests.unit_stride_axis_symbol(st.tn, st.idcs) in candidates
            and (chunks == 1 or not has_affine(st))):
        return None  # `schedule`'s contraction blocks along the unit-stride axis itself, unless it is split
    j = max(candidates, key=lambda s: (width(s), extent[s]))
    nb = width(j)
    a_op, b_op, b_first = (y, x, True) if j in sx else (x, y, False)
    sa, sb = nests.symbols(a_op), nests.symbols(b_op)
    rows = [lp.index for lp in loops if lp.index in lhs and lp.index != j and lp.index in sa
            and lp.index not in sb and extent[lp.index] > 1]
    if not rows:
        return None
    # 8 rows (`Blocking.mb_max`): 4 rows took a quarter less gcc time but 7-12% more run time;
    # fewer where the accumulators would not fit the register file (6 rows of 16 floats on AVX2)
    mb_max = cost_model.rows_that_fit(nb, st.tn.prec.computed_in.itemsize, blocking.mb_max, blocking.machine)
    i = max(rows, key=lambda s: (_divisor_up_to(extent[s], mb_max), s in plain, extent[s]))
    mb = _divisor_up_to(extent[i], mb_max)
    across = _second_row_axis([s for s in rows if s != i], extent, mb, nb, st.tn.prec.computed_in.itemsize, blocking)
    # a bf16 row operand (the weights of a mixed-precision step) is widened once (`bf16_widen`)
    wide = bf16_widen.copies(a_op, math.prod(extent.values()), st.tn.prec.computed_in)
    nest = _blocked_nest(loops, st, (bf16_widen.reading(a_op, wide), b_op, b_first), (i, mb), (j, nb), summed,
                         blocking.machine.vector_bytes, chunks, across)
    return ll.seq(*bf16_widen.fills(wide), nest)


def _second_row_axis(rows: list[Symbol], extent: dict[Symbol, int], mb: int, nb: int, itemsize: int,
                     blocking: sched.Blocking) -> tuple[Symbol, int] | None:
    """A second lhs axis the block's rows span, whole, where `mb` rows of vectors are fewer than
    the FMAs in flight that keep the pipeline busy (`fma_latency * fma_per_cycle`): a kernel
    gradient's rows are its 3 kernel rows, 3 accumulators of 8 channels, one FMA chain each;
    its 3 kernel columns too make 9."""
    machine = blocking.machine
    vectors = math.ceil(nb / cost_model.lanes(machine, itemsize))
    if mb * vectors >= machine.fma_latency * machine.fma_per_cycle:
        return None
    fitting = [s for s in rows if mb * extent[s] <= 2 * blocking.mb_max
               and cost_model.fits(mb * extent[s], nb, itemsize, machine)]
    return max(((s, extent[s]) for s in fitting), key=lambda se: se[1], default=None)


def _chunks(st: ll.Set, summed: list[Symbol], extent: dict[Symbol, int], settings: VirtualizeSettings) -> int:
    """How many chunks the sum of a plain-lhs nest splits into (1: not split)."""
    if (not settings.reassociate or st.tn.prec != st.tn.prec.computed_in
            or math.prod(extent[k] for k in summed) < SPLIT_MIN_TERMS or extent[summed[0]] % SPLIT_CHUNKS):
        return 1
    return SPLIT_CHUNKS


def _blocked_nest(loops: list[ll.ForLoop], st: ll.Set, operands: tuple[ll.LLScalar, ll.LLScalar, bool],
                  row_axis: tuple[Symbol, int], col_axis: tuple[Symbol, int], summed: list[Symbol],
                  vector_bytes: int, chunks: int = 1, across: tuple[Symbol, int] | None = None) -> ll.LLStmt:
    """for panel loops: for j0: pack B's panel; for other lhs loops: for i0: acc := c; sum; c := acc.
    Split into `chunks` (> 1): for chunk: (the same over the chunk's terms, acc := 0,
    part[chunk] := acc); then c += part[0] + part[1] + ... `across`: a second row axis, whole
    in each block (its rows are `mb` blocks of its extent)."""
    a_op, b_op, b_first = operands
    (i, mb), (j, nb) = row_axis, col_axis
    extent = {lp.index: lp.to_ + 1 for lp in loops}
    lhs = {s for idx in st.idcs for s in index_symbols(idx)}
    prec = st.tn.prec.computed_in
    chunk, first = get_symbol("kc"), summed[0]
    extent[first] //= chunks
    in_chunk: dict[Symbol, AxisIndex] = {first: make_affine(((extent[first], chunk), (1, first)))} if chunks > 1 else {}
    pack = nests.scheduler_local("pack", tuple(extent[k] for k in summed) + (nb,), prec)
    j0, i0, a, b = get_symbol("jp"), get_symbol("ib"), get_symbol("ir"), get_symbol("jr")
    i2, m2 = across or (None, 1)
    a2 = get_symbol("ic")
    rb = nests.register_block(mb * m2, nb, prec, vector_bytes, b)
    packed = {k: get_symbol(k.name) for k in summed}
    col = make_affine(((nb, j0), (1, b)))
    row = make_affine(((mb, i0), (1, a))) if mb > 1 else Iterator(i0)
    rows: dict[Symbol, AxisIndex] = {i: row} if i2 is None else {i: row, i2: Iterator(a2)}
    b_env: dict[Symbol, AxisIndex] = {j: col, **{k: Iterator(kp) for k, kp in packed.items()}}
    if chunks > 1:
        b_env[first] = make_affine(((extent[first], chunk), (1, packed[first])))
    fill = nests.nest([*((kp, extent[k]) for k, kp in packed.items()), (b, nb)],
                       ll.Set(pack, tuple(Iterator(kp) for kp in packed.values()) + (Iterator(b),),
                              nests.subst(b_op, b_env), "pack a panel of the vector-axis operand"))
    cell = rb.cell(tuple(subst_index({**rows, j: col}, idx) for idx in st.idcs))
    block_row = make_affine(((m2, a), (1, a2))) if mb > 1 else Iterator(a2)
    block = rb.at(block_row if i2 is not None else Iterator(a) if mb > 1 else FixedIdx(0))
    p_read = rb.by_column(ll.Get(pack, tuple(Iterator(k) for k in summed) + (Iterator(b),)))
    a_read = nests.subst(a_op, {**rows, **in_chunk})
    args = (p_read, a_read) if b_first else (a_read, p_read)
    update = ll.Set(rb.node, block, ll.Ternop(ops.Ternop.FMA, args[0], args[1], ll.Get(rb.node, block)), st.debug)
    ab = [*([(a, mb)] if mb > 1 else []), *([(a2, m2)] if i2 is not None else []), *rb.loops()]
    unrolled = frozenset({a, a2}) | rb.unrolled
    part = Tnode("part", (chunks, *st.tn.dims), prec, memory_mode=LOCAL,
                 provenance=provenance.ROUTINE_LOCAL) if chunks > 1 else None
    start: ll.LLScalar = ll.Get(st.tn, cell) if part is None else ll.Constant(0.0)
    out_node, out_cell = (st.tn, cell) if part is None else (part, (Iterator(chunk), *cell))
    kernel = ll.seq(
        nests.nest(ab, ll.Set(rb.node, block, start), unrolled),
        nests.nest([*((k, extent[k]) for k in summed), *ab], update, unrolled),
        nests.nest(ab, ll.Set(out_node, out_cell, ll.Get(rb.node, block)), unrolled))
    sb = nests.symbols(b_op)
    outer = [lp.index for lp in loops if lp.index in lhs and lp.index not in (i, i2, j)]
    panel_loops = [(s, extent[s]) for s in outer if s in sb]
    other_loops = [(s, extent[s]) for s in outer if s not in sb]
    inner = nests.nest(other_loops, ll.ForLoop(i0, 0, extent[i] // mb - 1, kernel))
    kind = "convolution" if has_affine(st) else "contraction"
    spans = f" ({mb}x{m2} rows)" if i2 is not None else ""
    comment = ll.Comment(f"channel-blocked {mb * m2}x{nb}{spans} {kind} into {st.tn.name}")
    blocked = nests.nest([*panel_loops, (j0, extent[j] // nb)], ll.seq(comment, fill, inner))
    if part is None:
        return blocked
    note = ll.Comment(f"{st.tn.name}'s sum split into {chunks} chunks of its axis {first.name} (reassociated)")
    return ll.seq(note, ll.ForLoop(chunk, 0, chunks - 1, blocked), _added_parts(st, part, extent))


def _added_parts(st: ll.Set, part: Tnode, extent: dict[Symbol, int]) -> ll.LLStmt:
    """`c += part[0] + part[1] + ...` over `c`'s cells, in chunk order."""
    fresh = {idx.symbol: get_symbol(idx.symbol.name) for idx in st.idcs if isinstance(idx, Iterator)}
    idcs = tuple(subst_index({s: Iterator(t) for s, t in fresh.items()}, idx) for idx in st.idcs)
    total: ll.LLScalar = ll.Get(st.tn, idcs)
    for k in range(part.dims[0]):
        total = ll.Binop(ops.Binop.ADD, total, ll.Get(part, (FixedIdx(k), *idcs)))
    return nests.nest([(t, extent[s]) for s, t in fresh.items()], ll.Set(st.tn, idcs, total, st.debug))



def window_reduction(loops: list[ll.ForLoop], st: ll.Set) -> ll.LLStmt | None:
    """The window reduction with a vector-width lhs loop innermost, or None when it does not
    apply (tried after `schedule`'s generic rewrites)."""
    if not has_affine(st) or not reorderable(st) or not nests.reads(st.llsc, st.tn):
        return None
    lhs = {idx.symbol for idx in st.idcs if isinstance(idx, Iterator)}
    window = 0
    while window < len(loops) - 1 and loops[len(loops) - 1 - window].index not in lhs:
        window += 1
    if not window or math.prod(lp.to_ + 1 for lp in loops[-window:]) > WINDOW_MAX:
        return None
    vector = VECTOR_BYTES // st.tn.prec.computed_in.itemsize
    fits = [lp for lp in loops[:-window] if lp.index in lhs and (lp.to_ + 1) % vector == 0]
    if not fits:
        return None
    stride = {idx.symbol: math.prod(st.tn.dims[k + 1:]) for k, idx in enumerate(st.idcs) if isinstance(idx, Iterator)}
    moved = min(fits, key=lambda lp: stride[lp.index])
    axis = next(k for k, idx in enumerate(st.idcs) if idx == Iterator(moved.index))
    note = f"{st.tn.name} vectorized across its axis {axis}: the window loops stay outside"
    order = [lp for lp in loops if lp is not moved] + [moved]
    body: ll.LLStmt = st
    for lp in reversed(order):
        body = dataclasses.replace(lp, body=body, keep_order=lp is order[0])
    return ll.seq(ll.Comment(note), body)


def _divisor_up_to(n: int, most: int) -> int:
    return max(d for d in range(1, most + 1) if n % d == 0)
