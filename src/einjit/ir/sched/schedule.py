"""Loop scheduling, the optimizer stage that shapes CPU loop nests for gcc (`optimize_proc`'s
"schedule", after simplification and before interchange).

Two rewrites, both expressed in the low-level IR (so the interpreter runs them and the
printers show them), each on a perfect nest around one accumulating `Set` whose loops may run
in any order (`interchange.reorderable`):

**Contractions** `c[.., i, .., j] := fma(A(i, k), B(j, k), c[.., i, .., j])` with `j` the lhs's
unit-stride axis, `k` the summed loops, `A` not depending on `j` and `B` not on `i`. Whatever
the operands' layouts (`a @ b`, the dense layer's `w @ x`, i.e. A·Bᵀ) this becomes

    for kt:                                   (chunks of the outermost k, if the panel is big)
      for j0:                                 (a panel of NB columns)
        pack[k.., b] := B(NB*j0 + b, k)       (B's panel, contiguous along b)
        for i0:                               (a block of MB rows)
          acc[a, b] := c[MB*i0 + a, NB*j0 + b]
          for k..: acc[a, b] := fma(A(MB*i0 + a, k), pack[k.., b], acc[a, b])
          c[MB*i0 + a, NB*j0 + b] := acc[a, b]

`acc` and `pack` are routine-local nodes. `acc` is a register block (`nests.RegisterBlock`):
its NB columns are NB/V vectors of V lanes (V from the machine description), so the `b` loop
is a loop over vectors around one over their lanes, which the C backend renders as one
vector statement on an array of vectors (`backends/c_vectors.py`). The `a` loops and the
vector loops are marked `unroll`: once gcc has unrolled them every index of that array is a
constant, so gcc -O2 keeps the MB×NB accumulator block in vector registers (register
blocking, unroll-and-jam of `i` and `j`). A float array whose column loop gcc vectorized
itself stays in memory at -O2: on AVX2 one accumulator per step went through the stack,
and `a @ b` ran at a quarter of the FMA peak. The lane loops are unit-stride everywhere.
MB, NB and the chunk come from the cost model (`cost_model.py`), or from measurements under
`EINJIT_SEARCH=1`.

Extents they do not divide take the same path with tails: rows run in blocks as even as MB
allows, the last ones a row shorter (`cost_model.row_blocks`: 128 rows in 6-row blocks are
18 x 6 + 4 x 5, not 21 x 6 and a 2-row tail whose FMAs waited on their latency, and which ran
in an `omp single` on threads), and the last `cols % NB` columns run one panel padded to NB
columns (zeros in the pack and the accumulators, never stored; a block of vectors is loaded
and stored through a zero-padded `edge` buffer, since a vector cannot cover part of a row):
gcc keeps only full-width blocks in registers
(an 8×16 block ran at a third of the speed of 8×32, a 31-wide one scalar), so the padded
block, although it computes unused columns, is the fastest way to do the tail. A last chunk
of `k` is shorter. Every output cell still sums its terms in the original order, so results are
bit-identical to the unscheduled code.

When A steps along the summed loops by whole rows (a weight gradient `w.grad += xᵀ·dy`,
summed over the batch × time rows of both operands), each step of a block would read its
`MB` values from a new cache line, every row of A a power-of-two bytes from the next (a few
L1 sets), and read all of A again for every panel: those nests ran at 55-60% of the FMA peak
where `x @ w` of the same size ran at 80-90%. Then (when there are two panels or more) the row
blocks go outside the panels (`_rows_outer_chunk`): B's k chunk is packed whole in one pass
along its rows, every panel side by side (each a row longer than the chunk, so that the
panels do not start a power of two bytes apart), then each row block runs against every
panel. Where the machine wants A packed too (`Machine.row_pack`: AVX2), each row block first
packs its own rows (`apack[0, k.., a] := A(MB*i0 + a, k..)`, a few KiB in L1), and the chunk
is sized so that one panel would fit in half the L1; the kernel then streams `MB` adjacent
values per step. On AVX-512 a block step is long enough for the hardware to bring A's line
from the L2 in time, and the kernel reads A where it lies. Either way the chunk keeps the
panels in half the L2 (`cost_model.k_chunk`). There B too is read where it lies, nothing
packed, when its rows are short and a panel would overflow the L1 anyway (`unpacked_panel`:
the attention projections' and the MLP fc's weight gradients, whose packing ran alone before
the first FMA, reading its operand cold).

With batch loops around the nest that B does not read (a dense layer over `batch, time`,
whose weight is B), every panel of a chunk is packed first, into `pack[panel, k.., b]`, and
the batch loops then go around all the panels' row blocks (`schedule_batched`): each batch
cell's rows are read from memory once rather than once per panel. Only where a panel fits
in half the L1 and all of them in half the L2 (`_packs_all_panels`): the GPT step's 128 x 128
projections ran 10-15% faster, its 512-deep ones, whose panel fills the L1, slower.

bf16 contractions accumulate in float32: the accumulator block and the panel are float
(`Prec.computed_in`), bf16 operands widened while packing, and the bf16 nodes the row operand
reads widened once into float copies before the nest (`bf16_widen`); on a machine with a bf16 dot
product (`Machine.bf16_dot`) a contraction of two bf16 reads packs its panel in pairs instead
(`bf16_pairs`), which the C renderer turns into `vdpbf16ps` where the compiler targets it; on
a machine with AMX (`Machine.amx_tiles`) such a contraction of one summed loop is packed in tiles
(`amx_tiles`), which the C renderer turns into `tdpbf16ps`.

Large contractions (`Blocking.parallel_min_work`) run on OpenMP threads: the outermost batch
loop if there is one, else the column-panel loop when each thread gets at least
`Blocking.min_panels_per_thread` panels, each thread packing its own panel, else each panel's
row blocks, sharing its panel (one thread packs it). Either way the nest is one parallel
region: the C renderer runs a serial loop around threaded loops (the k chunks around the
panels, the panels around their row blocks) on every thread of one region, with a barrier
per step instead of a fork-join (`c_syntax._Writer.loop_region`).

**Reductions** whose innermost loop `k` is summed (a row sum, a matrix-vector product, a
convolution's kernel gradient) or subtracted (LayerNorm's backward subtracts its row sums:
one dependent chain per row before) and that interchange would leave alone get
`Blocking.lanes` independent partial sums over `k = lanes*k0 + l` (or one per `k` when `k` is
short), kept across all the summed loops — the lhs loops move outside — folded pairwise
(upper half onto lower half) and added into the target at the end (subtracted, for a
subtracted sum). The partial sums are a register block of vectors when the step is
arithmetic the vectors compute (a dot product: ATL's matvec), else a plain array (a sum of
`exp`s, which gcc vectorizes itself: einjit's inline `exp`, libmvec's in double). That
reassociates float sums, so it happens only under `VirtualizeSettings.reassociate` (on by
default); integer sums are exact either way. Small partial sums are also more accurate: a
float32 sum of 2,000,000 values in [0, 1) is 2e-7 off instead of 1e-5.

Small nests (under `Blocking.min_work` innermost iterations) are left alone: the rewrites
pay only when the arithmetic dominates. The split reduction alone reaches further down
(`Blocking.min_split_work`): a decode step's matrix-vector products are small but all
reduction. Nests whose order is already fixed (`ForLoop.keep_order`) are left alone.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from einjit.ir import low_level as ll
from einjit.ir import ops
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
from einjit.ir.passes.tracing import VirtualizeSettings
from einjit.ir.sched import (
    amx_tiles,
    bf16_pairs,
    bf16_widen,
    cost_model,
    first_writes,
    nests,
    schedule_batched,
    schedule_conv,
    unpacked_panel,
)
from einjit.ir.sched.interchange import best_order, perfect_nest, reorderable, rewrap, unit_stride_symbol
from einjit.ir.sched.machine import host_machine
from einjit.ir.tnode import Tnode


@dataclass(frozen=True)
class Blocking:
    """The stage's size parameters. Tile sizes come from the cost model (`cost_model.py`)
    unless `tile` fixes them.

    `min_work`: innermost iterations below which a nest is not worth rescheduling.
    `nb_choices`: the register-block widths the cost model considers along the unit-stride
    lhs axis, for 4-byte elements (halved for 8-byte ones, so a block takes the same
    registers), listed in the order ties are broken; `min_nb`: narrower axes are left alone.
    `mb_max`: the most rows of a register block (fewer where the register file is smaller).
    `machine`: what the cost model prices code for; `schedule_llc` without a blocking uses
    the processor at hand (`machine.host_machine`).
    `tile`: fixed tile sizes instead of the model's (the search's candidates, tests).
    `lanes`: partial sums of a split reduction: four 8-float vectors, enough independent FMA
    chains to hide the FMA latency.
    `min_unroll_work`: contractions of fewer multiply-adds whose extents the block does not
    divide keep their blocks but do not ask gcc to unroll the block rows. Unrolled blocks are
    what takes gcc's time, and tails repeat them (a tail panel, tail rows, both): the convnet
    step's three 256K-multiply-add dense-layer nests, with 10 classes and 400 features, cost
    gcc 0.4 s of 1.3 s, and ran no slower without unrolling. Small nests without tails stay
    unrolled: the 2→32→32→1 MLP's 64K-multiply-add layers ran 6% faster with it.
    `parallel_min_work`: contractions of at least this many multiply-adds (a millisecond or
    so on one core) run on threads: threads pay off only well above their fork-join cost, and
    on a busy machine every barrier may wait for a descheduled thread.
    `min_panels_per_thread`: column panels each thread should get before the panel loop is
    the one on threads (one fork-join for the nest) rather than each panel's row blocks.
    `min_split_work`: nests below `min_work` but of at least this many innermost iterations,
    summing along an innermost loop of at least `lanes`, still get the split reduction: the
    matrix-vector products of a one-token decode step (128 x 128) are otherwise one
    sequential FMA chain per row, latency-bound at a fifth of the vector rate.
    """

    min_work: int = 1 << 16
    nb_choices: tuple[int, ...] = (32, 16, 8)
    min_nb: int = 4
    mb_max: int = 8
    machine: cost_model.Machine = cost_model.Machine()
    tile: cost_model.Tile | None = None
    lanes: int = 32
    min_unroll_work: int = 1 << 19
    parallel_min_work: int = 1 << 22
    min_panels_per_thread: int = 2
    min_split_work: int = 1 << 12


TileChooser = Callable[[cost_model.Shape, Blocking], "cost_model.Tile | None"]
"""Picks a contraction's tile: `choose_tile` (the cost model) by default, `search.py`'s
measuring chooser under `EINJIT_SEARCH=1`."""


def schedule_llc(stmt: ll.LLStmt, settings: VirtualizeSettings, blocking: Blocking | None = None,
                 tile_for: TileChooser | None = None) -> ll.LLStmt:
    """Every eligible nest of `stmt` rescheduled; other code unchanged. The default
    blocking prices code for the processor at hand."""
    chooser = tile_for or _default_chooser()
    if blocking is None:
        blocking = Blocking(machine=host_machine())
    items = list(ll.flatten(stmt))
    return ll.seq(*(_schedule_stmt(s, settings, blocking, chooser, zeroed)
                    for s, zeroed in zip(items, first_writes.zeroed_before(items), strict=True)))


def _default_chooser() -> TileChooser:
    """The cost model, or under `EINJIT_SEARCH=1` the measuring search (with the timer the
    backend layer installed in it)."""
    if os.environ.get("EINJIT_SEARCH", "").strip() in ("", "0"):
        return choose_tile
    from einjit.ir.sched import search  # it builds its candidates with this module

    return search.tile_for if search.enabled() else choose_tile


def _schedule_stmt(s: ll.LLStmt, settings: VirtualizeSettings, blocking: Blocking,
                   tile_for: TileChooser, zeroed: frozenset[Tnode] = frozenset()) -> ll.LLStmt:
    if not isinstance(s, ll.ForLoop):
        return s
    loops, body = perfect_nest(s)
    inner = list(ll.flatten(body))
    if any(lp.keep_order for lp in loops):
        return s
    if len(inner) == 1 and isinstance(inner[0], ll.Set) and all(lp.from_ == 0 for lp in loops):
        st = inner[0]
        work = math.prod(lp.to_ + 1 for lp in loops)
        if work >= blocking.min_work:
            new = _rewritten(loops, st, settings, blocking, tile_for, st.tn in zeroed)
        elif work >= blocking.min_split_work and loops[-1].to_ + 1 >= blocking.lanes:
            new = _split_reduction(loops, st, settings, blocking)
        else:
            new = None
        if new is not None:
            return new
    return rewrap(loops, schedule_llc(body, settings, blocking, tile_for))


def _rewritten(loops: list[ll.ForLoop], st: ll.Set, settings: VirtualizeSettings, blocking: Blocking,
               tile_for: TileChooser, zeroed: bool = False) -> ll.LLStmt | None:
    """The first rewrite that applies. A convolution (an affine index anywhere) is blocked along
    its channels first; a plain contraction along its unit-stride axis, with tails, and along
    a channel or batch axis only when that fails (measured equal on the convnet's 10-class
    layer, and the plain blocking also serves the awkward widths)."""
    def conv() -> ll.LLStmt | None:
        return schedule_conv.channel_blocked(loops, st, settings, blocking)

    def plain() -> ll.LLStmt | None:
        return _contraction(loops, st, blocking, tile_for, zeroed)

    first, second = (conv, plain) if schedule_conv.has_affine(st) else (plain, conv)
    return (first() or second() or _split_reduction(loops, st, settings, blocking)
            or schedule_conv.window_reduction(loops, st))


# ---------------------------------------------------------------- accumulations


def _accumulation(st: ll.Set) -> tuple[str, tuple[ll.LLScalar, ...]] | None:
    """("fma", (x, y)) for `fma(x, y, self)`, ("add", (e,)) for `self + e` / `e + self`,
    ("sub", (e,)) for `self - e` (LayerNorm's backward subtracts its row sums)."""
    own = ll.Get(st.tn, st.idcs)
    terms: tuple[ll.LLScalar, ...]
    match st.llsc:
        case ll.Ternop(ops.Ternop.FMA, x, y, acc) if acc == own:
            terms, kind = (x, y), "fma"
        case ll.Binop(ops.Binop.ADD, acc, e) if acc == own:
            terms, kind = (e,), "add"
        case ll.Binop(ops.Binop.ADD, e, acc) if acc == own:
            terms, kind = (e,), "add"
        case ll.Binop(ops.Binop.SUB, acc, e) if acc == own:
            terms, kind = (e,), "sub"
        case _:
            return None
    if not reorderable(st) or any(nests.reads(t, st.tn) for t in terms):
        return None
    return kind, terms


# ---------------------------------------------------------------- contractions


@dataclass(frozen=True)
class _Contraction:
    """A recognized contraction nest: `st` accumulates `A(i, k..) * B(j, k..)` into cells
    indexed by `i`, `j` and the `outer` (batch) loops, summed over `summed`."""

    st: ll.Set
    i: Symbol
    j: Symbol
    summed: tuple[Symbol, ...]
    outer: tuple[Symbol, ...]
    extent: dict[Symbol, int]
    a_op: ll.LLScalar
    b_op: ll.LLScalar
    b_first: bool
    b_along_k: bool
    """B is unit-stride along the innermost summed loop, not along `j` (A·Bᵀ)."""
    a_strided: bool
    """A steps along the innermost summed loop by more than one element: a block's row reads
    hit a new cache line at every step (`xᵀ·dy`, a weight gradient summed over the rows of
    both operands), so its row blocks go outside the panels when no batch loop comes between,
    and A is packed too where the machine wants it (`_Layout.apack`)."""

    def shape(self) -> cost_model.Shape:
        depth = math.prod(self.extent[k] for k in self.summed)
        return cost_model.Shape(self.extent[self.i], self.extent[self.j], depth, self.extent[self.summed[0]],
                                self.st.tn.prec.computed_in.itemsize, self.a_strided)


def _recognize(loops: list[ll.ForLoop], st: ll.Set, blocking: Blocking) -> _Contraction | None:
    acc = _accumulation(st)
    if acc is None or acc[0] != "fma" or not st.tn.prec.is_float:
        return None
    x, y = acc[1]
    extent = {lp.index: lp.to_ + 1 for lp in loops}
    lhs = {s for idx in st.idcs for s in index_symbols(idx)}
    summed = tuple(lp.index for lp in loops if lp.index not in lhs)
    j = nests.unit_stride_axis_symbol(st.tn, st.idcs)
    if not summed or j is None or j not in extent or extent[j] < blocking.min_nb:
        return None
    sx, sy = nests.symbols(x), nests.symbols(y)
    if j in sx and j not in sy:
        b_first, a_op, b_op, sa, sb = True, y, x, sy, sx
    elif j in sy and j not in sx:
        b_first, a_op, b_op, sa, sb = False, x, y, sx, sy
    else:
        return None
    rows = [lp.index for lp in loops if lp.index in lhs and lp.index != j and lp.index in sa
            and lp.index not in sb and extent[lp.index] > 1]
    if not rows:
        return None  # one row: the panel would be read once, so packing it cannot pay
    i = max(rows, key=lambda s: extent[s])
    outer = tuple(lp.index for lp in loops if lp.index in lhs and lp.index not in (i, j))
    b_reads = [(x.tn, x.idcs) for x in ll.iter_scalars(b_op) if isinstance(x, ll.Get)]
    along_k = bool(b_reads) and all(unit_stride_symbol(tn, idcs, summed[-1]) and not unit_stride_symbol(tn, idcs, j)
                                    for tn, idcs in b_reads)
    a_reads = [(x.tn, x.idcs) for x in ll.iter_scalars(a_op) if isinstance(x, ll.Get)]
    k_last = summed[-1]
    a_strided = (extent[k_last] > 1
                 and any(k_last in nests.symbols(ll.Get(tn, idcs)) and not unit_stride_symbol(tn, idcs, k_last)
                         for tn, idcs in a_reads))
    return _Contraction(st, i, j, summed, outer, extent, a_op, b_op, b_first, along_k, a_strided)


def choose_tile(shape: cost_model.Shape, blocking: Blocking) -> cost_model.Tile | None:
    """`blocking.tile` when fixed (clipped to the extents), else the cost model's choice."""
    if blocking.tile is not None:
        t = blocking.tile
        return cost_model.Tile(min(t.mb, shape.rows), min(t.nb, shape.cols), min(t.kc, shape.outer_depth))
    return cost_model.choose(shape, blocking.nb_choices, blocking.mb_max, blocking.machine)


def _contraction(loops: list[ll.ForLoop], st: ll.Set, blocking: Blocking,
                 tile_for: TileChooser, zeroed: bool = False) -> ll.LLStmt | None:
    c = _recognize(loops, st, blocking)
    if c is None:
        return None
    if amx_tiles.applies(c.a_op, c.b_op, len(c.summed), st.tn, blocking.machine):
        return amx_tiles.tiled(st, c.i, c.j, c.summed[0], [(s, c.extent[s]) for s in c.outer], c.extent, c.a_op,
                               c.b_op, c.b_first, zeroed, _threaded(c, blocking))
    tile = tile_for(c.shape(), blocking)
    if tile is None:
        return None
    return _blocked(c, tile, blocking, zeroed)


def _span(step: int, block: Symbol | None, inner: Symbol, offset: int = 0) -> AxisIndex:
    """`step * block + inner + offset`: an index inside a block (or the tail, without `block`)."""
    return make_affine(((step, block), (1, inner)) if block is not None else ((1, inner),), offset)


@dataclass(frozen=True)
class _Layout:
    """How `_blocked` cuts one contraction: the tile, the packed panel and the accumulator
    block (with the `edge` buffer a padded tail panel's block is loaded from and stored
    through, when the block is vectors: a vector cannot be part of a row), the loop symbols
    of the blocks (`j0` panels, `i0` row blocks, `kt` k chunks, `a` / `b` rows and columns
    inside a block, `kp` the summed loops), how many full blocks and how large the tails are
    along each axis (rows: `n_rows` blocks of `mb`, then `n_short` of `mb - 1`,
    `cost_model.row_blocks`), and which loops run on threads. With `kl`, the panel holds bf16 pairs
    (`bf16_pairs`): `kp` counts pairs of the innermost summed loop and `kl` the one of a pair. With
    `apack`, one row block of A at a time is packed per k chunk (`rows_outer`, `Machine.row_pack`)."""

    c: _Contraction
    mb: int
    nb: int
    kc: int
    pack: Tnode
    block: nests.RegisterBlock
    edge: Tnode | None
    j0: Symbol
    i0: Symbol
    kt: Symbol
    a: Symbol
    b: Symbol
    kp: dict[Symbol, Symbol]
    n_cols: int
    tail_cols: int
    n_rows: int
    n_short: int
    n_chunks: int
    tail_chunk: int
    unrolled: frozenset[Symbol]
    batch: Symbol | None
    inner_threads: bool
    by_panels: bool
    kl: Symbol | None
    apack: Tnode | None
    zero_start: bool = False
    rows_outer: bool = False
    """Row blocks outside the panels (`_rows_outer_chunk`): `pack` holds every panel of the
    chunk (a row of padding after each), `apack` (if any) one row block."""
    in_place: bool = False
    """B is read where it lies, nothing packed (`unpacked_panel`): a weight gradient whose panel
    streams from the L2 either way."""
    pack_all: bool = False
    """Every column panel is packed before any row block runs (`pack[panel, k.., b]`), so the
    batch loops go around all the panels (`schedule_batched`): each batch's rows are read from
    memory once, not once per panel (`_packs_all_panels`)."""

    @property
    def k1(self) -> Symbol:
        return self.c.summed[0]

    @property
    def rest(self) -> tuple[Symbol, ...]:
        return self.c.summed[1:]

    def pack_at(self, panel: AxisIndex) -> tuple[AxisIndex, ...]:
        """A cell of the packed panel; `panel` counts panels where `pack` holds them all (`pack_all`,
        `rows_outer`)."""
        if self.kl is not None:
            return bf16_pairs.pack_at([self.kp[k] for k in self.c.summed[:-1]], self.kp[self.kz], self.b, self.kl)
        if self.rows_outer:
            return panel, self.flat_step(), Iterator(self.b)
        at = (Iterator(self.kp[self.k1]), *(Iterator(self.kp[k]) for k in self.rest), Iterator(self.b))
        return (panel, *at) if self.pack_all else at

    def flat_step(self) -> AxisIndex:
        """The step of the summed loops inside a chunk, counted across all of them: a row of a
        `rows_outer` panel."""
        terms, stride = [], 1
        for k in reversed(self.c.summed):
            terms.append((stride, self.kp[k]))
            stride *= self.kc if k == self.k1 else self.c.extent[k]
        return make_affine(terms)

    @property
    def kz(self) -> Symbol:
        """The summed loop that bf16 pairs run along: the innermost."""
        return self.c.summed[-1]

    def k_loops(self, depth: int) -> list[tuple[Symbol, int]]:
        if self.kl is not None:
            if not self.rest:
                return bf16_pairs.k_loops([], self.kp[self.k1], self.kl, depth)
            outer = [(self.kp[self.k1], depth), *((self.kp[k], self.c.extent[k]) for k in self.rest[:-1])]
            return bf16_pairs.k_loops(outer, self.kp[self.kz], self.kl, self.c.extent[self.kz])
        return [(self.kp[self.k1], depth), *((self.kp[k], self.c.extent[k]) for k in self.rest)]

    def k_at(self, chunk: Symbol | None, offset: int = 0) -> AxisIndex:
        """The outermost summed loop's index in the chunk counted by `chunk` (None: one chunk
        starting at `offset`)."""
        terms = [(self.kc, chunk)] if chunk is not None else []
        inner = bf16_pairs.k_terms(self.kp[self.k1], self.kl) if self.kl is not None and not self.rest \
            else [(1, self.kp[self.k1])]
        return make_affine([*terms, *inner], offset)

    def k_env(self, k_at: AxisIndex) -> dict[Symbol, AxisIndex]:
        env = {self.k1: k_at, **{k: Iterator(self.kp[k]) for k in self.rest}}
        if self.kl is not None and self.rest:
            env[self.kz] = make_affine(bf16_pairs.k_terms(self.kp[self.kz], self.kl))
        return env


def _layout(c: _Contraction, tile: cost_model.Tile, blocking: Blocking) -> _Layout:
    extent, prec = c.extent, c.st.tn.prec.computed_in
    mb, n_rows, n_short = cost_model.row_blocks(extent[c.i], tile.mb)
    nb, kc = tile.nb, tile.kc
    pairs = bf16_pairs.applies(c.a_op, c.b_op, tuple(extent[k] for k in c.summed), kc, nb, blocking.machine)
    n_cols, tail_cols = divmod(extent[c.j], nb)
    panels = n_cols + (1 if tail_cols else 0)
    panel_dims = (kc, *(extent[k] for k in c.summed[1:]), nb)
    in_place = (c.a_strided and not pairs and not tail_cols and not c.b_along_k
                and unpacked_panel.reads_in_place(c.b_op, c.summed[-1], prec, math.prod(panel_dims) * prec.itemsize,
                                                  blocking.machine))
    pack_all = not pairs and not in_place and _packs_all_panels(c, kc, nb, nb * panels, blocking)
    pack = (bf16_pairs.pack(panel_dims[:-2], panel_dims[-2], nb) if pairs
            else nests.scheduler_local("pack", (panels, *panel_dims) if pack_all else panel_dims, prec))
    j0, i0, kt, a, b = get_symbol("jp"), get_symbol("ib"), get_symbol("kt"), get_symbol("ir"), get_symbol("jr")
    block = nests.register_block(mb, nb, prec, blocking.machine.vector_bytes, b)
    kp = {k: get_symbol(k.name) for k in c.summed}
    edge = nests.scheduler_local("edge", (mb, nb), prec) if tail_cols and block.lanes > 1 else None
    n_chunks, tail_chunk = divmod(extent[c.summed[0]], kc)
    small = math.prod(extent.values()) < blocking.min_unroll_work
    unrolled = frozenset() if small and (tail_cols or n_short) else frozenset({a})
    batch = next((s for s in c.outer if extent[s] > 1), None) if _threaded(c, blocking) else None
    inner_threads = batch is None and _threaded(c, blocking)
    by_panels = inner_threads and n_cols >= 2 * blocking.min_panels_per_thread
    # A is read once per panel: packing it (where the machine packs rows) pays with two panels
    # or more; its row blocks go outside the panels (`_rows_outer_chunk`), on threads where the
    # nest is, packed or not. With every row of A's chunk packed first and the panels outside
    # (the order before), the chunk had to keep all the packed rows in half the L2: the GPT
    # MLP's 512 x 128 weight gradient (1024 rows summed) took 2-step chunks, reloading its
    # output 8 times, and ran 3-10% slower (znver3)
    rows_outer = c.a_strided and not pairs and panels >= 2 and all(extent[s] == 1 for s in c.outer)
    rest = tuple(extent[k] for k in c.summed[1:])
    packs_rows = rows_outer and blocking.machine.row_pack
    apack = nests.scheduler_local("apack", (1, kc, *rest, mb), prec) if packs_rows else None
    if rows_outer:
        # one row more per panel than the chunk's steps: panels a power of two bytes apart
        # (16 KiB at 2-step chunks) took their rows, packed in one pass along B's rows, into
        # one L1 set; the GPT MLP proj's 128 x 512 weight gradient ran 2-3% faster padded (Zen 4,
        # operands in the L3), its packing alone took 0.042 ms instead of 0.074
        pack = nests.scheduler_local("pack", (panels, kc * math.prod(rest) + 1, nb), prec)
    return _Layout(c, mb, nb, kc, pack, block, edge, j0, i0, kt, a, b, kp, n_cols, tail_cols, n_rows, n_short,
                   n_chunks, tail_chunk, unrolled, batch, inner_threads, by_panels,
                   get_symbol("kl") if pairs else None, apack, rows_outer=rows_outer, in_place=in_place,
                   pack_all=pack_all)


def _packs_all_panels(c: _Contraction, kc: int, nb: int, width: int, blocking: Blocking) -> bool:
    """Whether every panel of a k chunk is packed before the row blocks: when batch loops the
    packed operand does not read come around the panels, one panel (`nb` columns) fits in half
    the L1 and all of them (`width` columns, padded) in half the L2. The GPT step's attention
    projections (1024 rows as 16 batches of 64, 128 x 128 weights packed) read their row
    operand once per panel otherwise, 8 times from L3 (the nest before wrote it, the output
    takes the other half of the L2), and ran 10-15% slower. A panel that fills the L1 (512
    steps of 16 columns) would instead come from the L2 for every row block, as slow again,
    and a weight gradient (`a_strided`, its rows packed too) keeps its order."""
    if c.a_strided or not any(c.extent[s] > 1 for s in c.outer):
        return False
    if nests.symbols(c.b_op) & {s for s in c.outer if c.extent[s] > 1}:
        return False
    step = kc * math.prod(c.extent[k] for k in c.summed[1:]) * c.st.tn.prec.computed_in.itemsize
    return step * nb <= blocking.machine.l1_bytes // 2 and step * width <= blocking.machine.l2_bytes // 2


def _blocked(c: _Contraction, tile: cost_model.Tile, blocking: Blocking, zeroed: bool = False) -> ll.LLStmt:
    """The contraction as column panels × row blocks × k chunks, with narrower tail blocks
    where `tile` does not divide an extent (see the module docstring). `zeroed`: the target
    holds zeros when the nest starts, so a single chunk starts its blocks at zero
    (`first_writes.zero_start`)."""
    lay = _layout(c, tile, blocking)
    lay = dataclasses.replace(lay, zero_start=first_writes.zero_start(zeroed, lay.n_chunks, lay.tail_chunk))
    wide = {} if lay.kl is not None else \
        bf16_widen.copies(c.a_op, math.prod(c.extent.values()), c.st.tn.prec.computed_in)
    if wide:
        lay = dataclasses.replace(lay, c=dataclasses.replace(c, a_op=bf16_widen.reading(c.a_op, wide)))
    chunks = []
    if lay.n_chunks:
        body = _chunk(lay, lay.k_at(lay.kt if lay.n_chunks > 1 else None), lay.kc)
        chunks.append(ll.ForLoop(lay.kt, 0, lay.n_chunks - 1, body) if lay.n_chunks > 1 else body)
    if lay.tail_chunk:
        chunks.append(_chunk(lay, lay.k_at(None, lay.kc * lay.n_chunks), lay.tail_chunk))
    tiles = f"{lay.mb}x{lay.nb}" + (f", {lay.kc}-step k chunks" if lay.kc < c.extent[lay.k1] else "")
    kind = "register-blocked" if lay.unrolled else "blocked (rows not unrolled: a small nest)"
    start = ", from zero" if lay.zero_start else ""
    body = ll.seq(ll.Comment(f"{kind} {tiles} contraction into {c.st.tn.name}{start}"), *chunks)
    return ll.seq(*bf16_widen.fills(wide),
                  schedule_batched.batch_inside_panels(lay.pack, [(s, c.extent[s]) for s in c.outer], body, lay.batch,
                                                       lay.j0))


def _chunk(lay: _Layout, k_at: AxisIndex, depth: int) -> ll.LLStmt:
    """One k chunk: every full column panel, then the tail panel; with `pack_all`, every panel
    packed first, then every panel's row blocks."""
    if lay.rows_outer:
        return _rows_outer_chunk(lay, k_at, depth)
    parts: list[ll.LLStmt] = []
    for stage in (("pack",), ("rows",)) if lay.pack_all else (("pack", "rows"),):
        parts.extend(_panels(lay, k_at, depth, frozenset(stage)))
    return ll.seq(*parts)


def _panels(lay: _Layout, k_at: AxisIndex, depth: int, stage: frozenset[str]) -> list[ll.LLStmt]:
    """`stage` ("pack", "rows" or both) of every full column panel, then of the tail panel."""
    b, nb = lay.b, lay.nb
    parts: list[ll.LLStmt] = []
    if lay.n_cols == 1:
        parts.append(_panel(lay, Iterator(b), FixedIdx(0), nb, k_at, depth, lay.inner_threads, stage))
    elif lay.n_cols:
        by_rows = lay.inner_threads and not lay.by_panels
        parts.append(ll.ForLoop(lay.j0, 0, lay.n_cols - 1,
                                _panel(lay, _span(nb, lay.j0, b), Iterator(lay.j0), nb, k_at, depth, by_rows, stage),
                                parallel=lay.by_panels))
    if lay.tail_cols:
        start = nb * lay.n_cols
        if "rows" in stage:  # no comment between packings: the batch loops go after the last
            parts.append(ll.Comment(f"the last {lay.tail_cols} of {lay.c.extent[lay.c.j]} columns, padded to {nb}"))
        parts.append(_panel(lay, _span(nb, None, b, start), FixedIdx(lay.n_cols), lay.tail_cols, k_at, depth,
                            lay.inner_threads, stage))
    return parts


def _rows_outer_chunk(lay: _Layout, k_at: AxisIndex, depth: int) -> ll.LLStmt:
    """One k chunk of a weight gradient on one thread, row blocks outside the panels: B's
    chunk packed whole, every panel in one pass along B's rows, then per row block its rows of
    A, packed once (a few KiB, in L1) where the machine packs rows (`Machine.row_pack`), run
    against every panel. Packing one panel at a time
    read a 64-byte piece of each of the chunk's rows of B, 2 KiB apart for a 512-wide operand
    (a few L1 sets), for each panel: on znver3 the MLP proj's weight gradient (128 x 512 over
    1024 rows) took 2.06-2.29 ms of CPU time that way, 1.75-1.85 ms this way (1.5 ms with
    nothing packed), the 128 x 128 ones 0.47 ms before, 0.44 ms after."""
    c, a, b, nb = lay.c, lay.a, lay.b, lay.nb
    k_loops, k_env = lay.k_loops(depth), lay.k_env(k_at)
    parts = [] if lay.in_place else _chunk_packing(lay, k_loops, k_env)

    def block_rows(row: AxisIndex, height: int) -> ll.LLStmt:
        steps: list[ll.LLStmt] = []
        if lay.apack is not None:
            r = Iterator(a) if height > 1 else FixedIdx(0)
            ks = [Iterator(lay.kp[k]) for k in c.summed]
            pack_rows = ll.Set(lay.apack, (FixedIdx(0), *ks, r), nests.subst(c.a_op, {c.i: row, **k_env}),
                               "pack a block of rows")
            steps.append(nests.nest([*k_loops, *([(a, height)] if height > 1 else [])], pack_rows))
        if lay.n_cols == 1:
            steps.append(_kernel(lay, row, height, Iterator(b), FixedIdx(0), nb, k_at, depth))
        elif lay.n_cols:
            steps.append(ll.ForLoop(lay.j0, 0, lay.n_cols - 1, _kernel(lay, row, height, _span(nb, lay.j0, b),
                                                                        Iterator(lay.j0), nb, k_at, depth)))
        if lay.tail_cols:
            steps.append(ll.Comment(f"the last {lay.tail_cols} of {c.extent[c.j]} columns, padded to {nb}"))
            steps.append(_kernel(lay, row, height, _span(nb, None, b, nb * lay.n_cols),
                                 FixedIdx(lay.n_cols), lay.tail_cols, k_at, depth))
        return ll.seq(*steps)

    parts.extend(_row_blocks(lay, block_rows, lay.inner_threads))
    return ll.seq(*parts)


def _chunk_packing(lay: _Layout, k_loops: list[tuple[Symbol, int]],
                   k_env: dict[Symbol, AxisIndex]) -> list[ll.LLStmt]:
    """A `rows_outer` chunk's packing: every panel of B in one pass along its rows, the tail
    panel zero-padded."""
    c, b, nb = lay.c, lay.b, lay.nb

    def fill(panel: AxisIndex, col: AxisIndex) -> ll.Set:
        return ll.Set(lay.pack, lay.pack_at(panel), nests.subst(c.b_op, {c.j: col, **k_env}),
                      "pack the chunk's panels of the unit-stride operand")

    def along_b(loops: list[tuple[Symbol, int]]) -> list[tuple[Symbol, int]]:
        return [*loops, *k_loops] if c.b_along_k else [*k_loops, *loops]

    parts: list[ll.LLStmt] = [ll.Comment(f"pack the chunk's {c.extent[c.j]} columns in panels of {nb}")]
    if lay.n_cols:
        parts.append(nests.nest(along_b([(lay.j0, lay.n_cols), (b, nb)]), fill(Iterator(lay.j0), _span(nb, lay.j0, b))))
    if lay.tail_cols:
        tail = FixedIdx(lay.n_cols)
        parts.append(nests.nest(along_b([(b, lay.tail_cols)]), fill(tail, _span(nb, None, b, nb * lay.n_cols))))
        parts.append(nests.nest(k_loops, ll.ForLoop(b, lay.tail_cols, nb - 1,
                                                    ll.Set(lay.pack, lay.pack_at(tail), ll.Constant(0.0)))))
    return parts


def _row_blocks(lay: _Layout, body: Callable[[AxisIndex, int], ll.LLStmt], threaded: bool) -> list[ll.LLStmt]:
    """`body(row, height)` for every row block: the `n_rows` full ones, then the `n_short` ones
    a row shorter (`cost_model.row_blocks`), each kind a loop over its blocks (`i0`, on threads
    if `threaded`) where there are several; `row` is the row inside the block (`a`, or fixed in
    one-row blocks)."""
    parts: list[ll.LLStmt] = []
    for start, count, height in ((0, lay.n_rows, lay.mb), (lay.mb * lay.n_rows, lay.n_short, lay.mb - 1)):
        if not count:
            continue
        if start:
            shape = f", in {count} blocks of {height}" if count > 1 else ""
            parts.append(ll.Comment(f"the last {count * height} of {lay.c.extent[lay.c.i]} rows{shape}"))
        if count == 1:
            parts.append(body(_span(height, None, lay.a, start) if height > 1 else FixedIdx(start), height))
        else:
            row = _span(height, lay.i0, lay.a, start) if height > 1 else make_affine(((1, lay.i0),), start)
            parts.append(ll.ForLoop(lay.i0, 0, count - 1, body(row, height), parallel=threaded))
    return parts


def _panel(lay: _Layout, col: AxisIndex, panel: AxisIndex, width: int, k_at: AxisIndex, depth: int,
           threaded_rows: bool, stage: frozenset[str]) -> ll.LLStmt:
    """One column panel (`panel` counts them): pack it (zero-padded to `nb` columns), then
    every row block; `stage` says which of the two ("pack", "rows")."""
    c, b, nb = lay.c, lay.b, lay.nb
    k_env: dict[Symbol, AxisIndex] = {c.j: col, **lay.k_env(k_at)}
    k_loops = lay.k_loops(depth)
    # read B along its own unit stride: rows of `w` in the dense layer's `w @ x`
    order = [(b, width), *k_loops] if c.b_along_k else [*k_loops, (b, width)]
    fill = ll.Set(lay.pack, lay.pack_at(panel), nests.subst(c.b_op, k_env), "pack a panel of the unit-stride operand")
    parts: list[ll.LLStmt] = []
    if "pack" in stage and not lay.in_place:
        parts.append(nests.nest(order, fill))
        if width < nb:
            parts.append(nests.nest(k_loops, ll.ForLoop(b, width, nb - 1, ll.Set(lay.pack, lay.pack_at(panel),
                                                                                   ll.Constant(0.0)))))
    if "rows" not in stage:
        return ll.seq(*parts)
    parts.extend(_row_blocks(lay, lambda row, height: _kernel(lay, row, height, col, panel, width, k_at, depth),
                             threaded_rows))
    return ll.seq(*parts)


def _kernel(lay: _Layout, row: AxisIndex, height: int, col: AxisIndex, panel: AxisIndex, width: int,
            k_at: AxisIndex, depth: int) -> ll.LLStmt:
    """One block; in a tail panel (`width < nb`) it still updates all `nb` columns (the
    padding columns hold zeros and are never stored), since gcc keeps only full-width
    blocks in registers. A block of vectors loads and stores a tail panel's columns through
    `edge`, zero-padded, a row at a time. A's values come from `apack` (the block's own rows)
    when its rows are packed (`rows_outer`), B's from `panel` where `pack` holds every panel
    (`pack_all`, `rows_outer`). A `zero_start` block starts at zero instead of loading the output."""
    c, st, a, b, rb = lay.c, lay.c.st, lay.a, lay.b, lay.block
    unrolled = lay.unrolled | rb.unrolled if lay.unrolled else lay.unrolled
    r = Iterator(a) if height > 1 else FixedIdx(0)
    block = rb.at(r)
    cell = tuple(subst_index({c.i: row, c.j: col}, idx) for idx in st.idcs)
    if lay.apack is not None:
        a_read: ll.LLScalar = ll.Get(lay.apack, (FixedIdx(0), *(Iterator(lay.kp[k]) for k in c.summed), r))
    else:
        a_read = nests.subst(c.a_op, {c.i: row, **lay.k_env(k_at)})
    if lay.in_place:
        packed = rb.by_column(nests.subst(c.b_op, {c.j: col, **lay.k_env(k_at)}))
    else:
        packed = rb.by_column(ll.Get(lay.pack, lay.pack_at(panel)))
    x, y = (packed, a_read) if c.b_first else (a_read, packed)
    update = ll.Set(rb.node, block, ll.Ternop(ops.Ternop.FMA, x, y, ll.Get(rb.node, block)), st.debug)
    rows = [(a, height)] if height > 1 else []
    columns = [*rows, *rb.loops()]
    if width == lay.nb:
        load = [nests.nest(columns, ll.Set(rb.node, block, ll.Get(st.tn, rb.cell(cell))), unrolled)]
        store = [nests.nest(columns, ll.Set(st.tn, rb.cell(cell), ll.Get(rb.node, block)), unrolled)]
    elif lay.edge is None:
        zero_tail = ll.ForLoop(b, width, lay.nb - 1, ll.Set(rb.node, block, ll.Constant(0.0)))
        load = [nests.nest([*rows, (b, width)], ll.Set(rb.node, block, ll.Get(st.tn, cell)), unrolled),
                nests.nest(rows, zero_tail, unrolled)]
        store = [nests.nest([*rows, (b, width)], ll.Set(st.tn, cell, ll.Get(rb.node, block)), unrolled)]
    else:
        edge = (r, Iterator(b))
        zero_tail = ll.ForLoop(b, width, lay.nb - 1, ll.Set(lay.edge, edge, ll.Constant(0.0)))
        load = [nests.nest([*rows, (b, width)], ll.Set(lay.edge, edge, ll.Get(st.tn, cell)), unrolled),
                nests.nest(rows, zero_tail, unrolled),
                nests.nest(columns, ll.Set(rb.node, block, ll.Get(lay.edge, rb.cell(edge))), unrolled)]
        store = [nests.nest(columns, ll.Set(lay.edge, rb.cell(edge), ll.Get(rb.node, block)), unrolled),
                 nests.nest([*rows, (b, width)], ll.Set(st.tn, cell, ll.Get(lay.edge, edge)), unrolled)]
    if lay.zero_start:
        load = [nests.nest(columns, ll.Set(rb.node, block, ll.Constant(0.0)), unrolled)]
    return ll.seq(*load, nests.nest([*lay.k_loops(depth), *columns], update, unrolled), *store)


def _threaded(c: _Contraction, blocking: Blocking) -> bool:
    """Whether the nest is large enough for threads: they pay off only well above their
    fork-join cost. A batched nest runs its outermost batch loop on threads (each thread packs
    its own panels); otherwise the column panels, each thread packing its own, or — with too
    few panels to share — the row blocks of each panel. The k chunks and panels around them
    stay serial loops in one parallel region, so a chunk costs a barrier, not a fork-join."""
    return math.prod(c.extent.values()) >= blocking.parallel_min_work


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
    k0, lane = get_symbol("k0"), get_symbol("l")
    # vectors only where the C backend computes the step on whole vectors: a sum of `exp`s
    # keeps a plain array, whose loop gcc vectorizes with the inline exp
    # (a bf16 sum accumulates in float32, its bf16 reads widened lane by lane)
    prec = st.tn.prec.computed_in
    vector = nests.vector_ops_only(st.llsc, prec)
    rb = nests.register_block(1, n_lanes, prec, blocking.machine.vector_bytes if vector else 0, lane, "lanes")
    env: dict[Symbol, AxisIndex] = {k: make_affine(((n_lanes, k0), (1, lane))) if n_lanes < n else Iterator(lane)}
    own = ll.Get(rb.node, rb.at(FixedIdx(0)))
    split = tuple(rb.by_column(nests.subst(t, env)) for t in terms)
    value = (ll.Ternop(ops.Ternop.FMA, split[0], split[1], own) if kind == "fma"
             else ll.Binop(ops.Binop.ADD, own, split[0]))
    step = nests.nest(rb.loops(), ll.Set(rb.node, own.idcs, value, st.debug), rb.unrolled)
    if n_lanes < n:
        step = ll.ForLoop(k0, 0, n // n_lanes - 1, step)
    summed = [(lp.index, lp.to_ + 1) for lp in loops[:-1] if lp.index not in lhs]
    into = ops.Binop.SUB if kind == "sub" else ops.Binop.ADD
    if rb.lanes > 1:
        halves, total = _halved(rb.node, rb.lane)
    else:
        halves, total = [], ll.Get(rb.node, (FixedIdx(0), FixedIdx(0)))
    body = ll.seq(
        ll.Comment(f"{n_lanes} partial sums into {st.tn.name} (reassociated)"),
        nests.nest(rb.loops(), ll.Set(rb.node, own.idcs, ll.Constant(0.0)), rb.unrolled),
        nests.nest(summed, step),
        *_folded(rb),
        *halves,
        ll.Set(st.tn, st.idcs, ll.Binop(into, ll.Get(st.tn, st.idcs), total)))
    return nests.nest([(lp.index, lp.to_ + 1) for lp in loops[:-1] if lp.index in lhs], body)


def _halved(block: Tnode, lane: Symbol) -> tuple[list[ll.LLStmt], ll.LLScalar]:
    """The lanes of the block's first vector summed pairwise: its upper half added onto its
    lower half into a vector of half the lanes, and so on down to two lanes, whose sum is the
    total. Each step is one vector statement (`c_vectors`: a block read by halves), so the total
    is log2(lanes) dependent additions: added into the target lane after lane, LayerNorm's row
    sums waited 16 dependent additions per row, twice, forward and backward."""
    steps: list[ll.LLStmt] = []
    lanes = block.dims[-1]
    at: tuple[AxisIndex, ...] = (FixedIdx(0), FixedIdx(0), Iterator(lane))
    while lanes > 2:
        half = nests.one_vector("lanes", lanes // 2, block.prec)
        upper = (FixedIdx(0), FixedIdx(0), make_affine(((1, lane),), lanes // 2))
        steps.append(ll.ForLoop(lane, 0, lanes // 2 - 1, ll.Set(half, at, ll.Binop(
            ops.Binop.ADD, ll.Get(block, at), ll.Get(block, upper)))))
        block, lanes = half, lanes // 2
    cells = [ll.Get(block, (FixedIdx(0), FixedIdx(0), FixedIdx(k))) for k in range(lanes)]
    return steps, ll.Binop(ops.Binop.ADD, cells[0], cells[1])


def _folded(rb: nests.RegisterBlock) -> list[ll.LLStmt]:
    """The partial sums added pairwise into the block's first vector (or first cell): each
    step adds the upper part onto the lower, so the sum at the end of a short reduction is
    log2 dependent additions, not one per lane: a decode step's 128-long row sums spent more
    time adding their 32 lanes one by one than in the lanes. Vectors fold as whole vectors;
    the first vector's lanes are then halved (`_halved`)."""
    vector = rb.lanes > 1
    n = rb.node.dims[1]
    folds: list[ll.LLStmt] = []
    while n > 1:
        half = n // 2
        top = n - half
        if vector:
            for v in range(half):
                own: tuple[AxisIndex, ...] = (FixedIdx(0), FixedIdx(v), Iterator(rb.lane))
                upper: tuple[AxisIndex, ...] = (FixedIdx(0), FixedIdx(v + top), Iterator(rb.lane))
                fold = ll.Set(rb.node, own, ll.Binop(ops.Binop.ADD, ll.Get(rb.node, own), ll.Get(rb.node, upper)))
                folds.append(ll.ForLoop(rb.lane, 0, rb.lanes - 1, fold))
        else:
            own, upper = (FixedIdx(0), Iterator(rb.col)), (FixedIdx(0), make_affine(((1, rb.col),), top))
            fold = ll.Set(rb.node, own, ll.Binop(ops.Binop.ADD, ll.Get(rb.node, own), ll.Get(rb.node, upper)))
            folds.append(ll.ForLoop(rb.col, 0, half - 1, fold))
        n = top
    return folds
