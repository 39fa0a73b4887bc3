"""The analytic cost model that picks a contraction's tile sizes (`schedule.py`).

A scheduled contraction runs a micro-kernel: an `mb`×`nb` block of accumulators held in
vector registers, updated once per step of the summed loops from one packed-panel row (`nb`
values, `ceil(nb / V)` vector loads) and `mb` broadcast values of the other operand. Per
step the kernel takes the longest of three bounds, in cycles:

- FMA throughput: `mb * ceil(nb / V)` vector FMAs at `fma_per_cycle`;
- FMA latency: each accumulator depends on its previous step, so a step lasts at least
  `fma_latency` cycles (fewer than `fma_per_cycle * fma_latency` accumulators leave the FMA
  units idle);
- loads: `mb + ceil(nb / V)` loads at `loads_per_cycle`.

`V` is the vector width in elements of the precision (`vector_bytes / itemsize`), so a double
block needs twice the registers of a float block of the same width. A block must fit the
register file: its `mb * ceil(nb / V)` accumulators, the panel row's `ceil(nb / V)` vectors and
one broadcast, at most `vector_registers` in all (`fits`); gcc spills the accumulators to
memory otherwise, and the block runs at a fraction of the speed (8×32 floats, 32 AVX2
vectors, ran the digits MLP at a third of ONNX Runtime's speed on a 16-register machine).
Widths of exactly `row_vectors` vectors are preferred: a panel row of two vectors shares
each broadcast between two FMAs and leaves registers for the most rows. (It was also the one
width whose float block gcc -O2 kept in registers, 8×16 and 4×64 ran at a third of the
speed, before blocks became arrays of vectors in C, `nests.RegisterBlock`.) So AVX-512 (32 registers of 16 floats)
gets 8×32 float blocks, AVX2 (16 registers of 8 floats) 6×16, and SSE 6×8.

Extents the block does not divide leave tails (`rows % mb` tail rows priced with the same
formula, which the scheduler runs as blocks a row shorter, `row_blocks`, never costlier; the
last `cols % nb` columns in a panel padded to `nb`, priced as a full one). A
nest narrower than the preferred width (a convolution's output row of 13) takes the widest
power of two it holds instead (8, then a padded panel of 5), wasting less than the padding
to 32 would (that made a convnet step 15% slower). Each
block also pays `block_overhead` cycles (loading and storing its accumulators, loop startup).

The summed loop is tiled (`kc`) when the packed panel — `depth × nb` elements — would not
fit in half the L2 cache, so the panel packed once per column block stays in L2 while every
row block of the other operand streams past it; for a weight gradient (`Shape.strided_rows`,
row blocks outside the panels) also so that every panel of the chunk, packed side by side,
stays in half the L2, and one panel would fit in half the L1. Results stay bit-identical: each output
cell still sums its terms in their original order, a chunk at a time.

`Machine()` describes the development machine (AVX-512, 2 FMA units, 1 MiB L2 per core);
`machine.py` picks the description of the processor at hand (or the one `EINJIT_MACHINE`
names), so the generated C is the same for the same model on the same kind of processor.
`EINJIT_SEARCH=1` (`search.py`) measures candidates on the machine at hand instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Machine", "Shape", "Tile", "candidates", "choose", "cycles", "fits", "row_blocks", "rows_that_fit"]


@dataclass(frozen=True)
class Machine:
    """The processor the model prices code for."""

    vector_bytes: int = 64
    vector_registers: int = 32
    row_vectors: int = 2
    fma_per_cycle: int = 2
    fma_latency: int = 4
    loads_per_cycle: int = 2
    block_overhead: int = 24
    l1_bytes: int = 32 << 10
    l2_bytes: int = 1 << 20
    bf16_dot: bool = False
    """The CPU multiplies pairs of bf16 numbers into float accumulators in one instruction
    (AVX512_BF16's `vdpbf16ps`): bf16 contractions pack their panel in pairs (`bf16_pairs`)."""
    amx_tiles: bool = False
    """The CPU multiplies bf16 tiles into float tiles (AMX: `tdpbf16ps`): bf16 contractions of
    one summed loop are packed in tiles instead of panels (`amx_tiles`)."""
    row_pack: bool = False
    """A weight gradient's row operand, which steps along the summed loops by whole rows, is
    packed one row block at a time (`schedule.py`'s `apack`) rather than read where it lies.
    On this AVX-512 Zen 4 a step of an 8x32 block is 16 FMAs, and the stride prefetcher brings
    its one line of row values from the L2 in time: the GPT MLP's 512 x 128 weight gradient
    (1024 rows summed) took 1.28 ms packed, 1.20 ms unpacked, its packing reading a 32-byte
    piece of each of 128 rows 2 KiB apart per block. AVX2's 6x16 blocks step in 6 cycles, where
    the packing was measured (znver3), so "avx2" and "generic" keep it. The cost: where A comes
    from DRAM rather than the L2 or L3, each row block's first panel waits on it, a line per
    step (the packing loop keeps many misses in flight): that 512 x 128 one then took 1.57-1.69
    ms instead of 1.38-1.43 (64 MiB written between calls). In the GPT step A is the nest
    before's output: its MLP weight gradients took 0.02-0.12 ms less each (one the same)."""


@dataclass(frozen=True)
class Shape:
    """A contraction as the scheduler sees it: `rows` × `cols` output cells (per batch), each
    a sum over `depth` terms, of which `outer_depth` come from the outermost summed loop (the
    one a k-tile splits)."""

    rows: int
    cols: int
    depth: int
    outer_depth: int
    itemsize: int
    strided_rows: bool = False
    """The row operand steps along the summed loops by more than one element (a weight
    gradient's `xᵀ·dy`, summed over the rows of both): the scheduler packs it too where no
    batch loop comes between (`schedule.py`), and chunks the summed loop either way."""


@dataclass(frozen=True)
class Tile:
    """`mb` rows × `nb` columns of accumulators; `kc` iterations of the outermost summed loop
    per chunk (its whole extent when the panel fits)."""

    mb: int
    nb: int
    kc: int


def lanes(machine: Machine, itemsize: int) -> int:
    return max(1, machine.vector_bytes // itemsize)


def fits(mb: int, nb: int, itemsize: int, machine: Machine) -> bool:
    """Whether an `mb`×`nb` block's accumulators, its panel row and a broadcast fit the
    vector registers."""
    vectors = math.ceil(nb / lanes(machine, itemsize))
    return mb * vectors + vectors + 1 <= machine.vector_registers


def rows_that_fit(nb: int, itemsize: int, mb_max: int, machine: Machine) -> int:
    """The most rows, up to `mb_max`, of an `nb`-wide block that `fits` (at least one)."""
    return next((mb for mb in range(mb_max, 1, -1) if fits(mb, nb, itemsize, machine)), 1)


def step_cycles(mb: int, nb: int, itemsize: int, machine: Machine) -> float:
    """Cycles of one summed-loop step of an `mb`×`nb` block."""
    vectors = math.ceil(nb / lanes(machine, itemsize))
    return max(mb * vectors / machine.fma_per_cycle, float(machine.fma_latency),
               (mb + vectors) / machine.loads_per_cycle)


def cycles(shape: Shape, tile: Tile, machine: Machine) -> float:
    """Estimated cycles of the whole contraction (per batch) under `tile`."""
    panels = math.ceil(shape.cols / tile.nb)
    full_rows, tail_rows = divmod(shape.rows, tile.mb)
    chunks = math.ceil(shape.outer_depth / tile.kc)
    total = 0.0
    for n_blocks, height in ((full_rows, tile.mb), (1 if tail_rows else 0, tail_rows)):
        if n_blocks:
            total += panels * n_blocks * (shape.depth * step_cycles(height, tile.nb, shape.itemsize, machine)
                                          + chunks * machine.block_overhead)
    return total


def row_blocks(rows: int, mb: int) -> tuple[int, int, int]:
    """How the scheduler cuts `rows` given blocks of at most `mb` rows: (height, full, short),
    `full` blocks of `height` rows then `short` blocks of `height - 1`, as few blocks as `mb`
    allows and of heights that differ by one at most. A step of a block costs
    `max(throughput * height, latency)`, convex in the height, so for a given number of blocks
    equal heights cost least: 128 rows in 6-row blocks are 18 x 6 + 4 x 5 rather than 21 x 6 and
    a 2-row tail whose step waited on the FMA latency with 4 accumulators (a C harness of the
    weight-gradient nest on the shared znver3, 1 thread, median of 1,500 alternating calls:
    1-4% faster at 32, 64 and 128 rows x 128 columns). On threads the
    blocks share out evenly, where the tail had run in an `omp single` after the others (the GPT
    step's 128-row weight gradients lost ~5% at 2 threads that way). `cycles` still prices the
    old split (full blocks and one tail), never cheaper, so the model's choices stay as they were."""
    blocks = -(-rows // mb)
    height = -(-rows // blocks)
    short = blocks * height - rows
    return height, blocks - short, short


def k_chunk(shape: Shape, nb: int, machine: Machine) -> int:
    """The outermost summed loop's chunk: the whole loop if the panel fits in half the L2.
    With `strided_rows` (row blocks outside the panels, each run against every panel of the
    chunk) the chunk also keeps all the chunk's panels in half the L2, and where the rows are
    packed (`Machine.row_pack`) one panel in half the L1, beside the packed rows.
    On the shared znver3 (AVX2, best of 300 interleaved calls, CPU time) the GPT MLP's weight
    gradients over 16 x 64 rows: 512 x 128 as good at 2- or 4-step chunks (this gives 4), 5-8%
    slower at 8, 9% at 16; 128 x 512 best at 1 or 2 (this gives 2), 8-10% slower at 4. Unpacked
    on this Zen 4 (AVX-512), the panel streams from the L2 as fast: 512 x 128 took 1.21 ms at
    2-step chunks (the L1 bound), 1.19 at 4, 1.18 in one chunk (this gives one); 128 x 512 1.22,
    1.21, 1.20 (this gives 4); 128 x 128 0.306, 0.302, 0.299 (this gives one). Keeping the
    chunk's rows of A in half the L2 beside the panels (3-step chunks for the MLP's) made the
    GPT step's weight gradients 0.2 ms slower in all (per-nest profile, best of 4 runs)."""
    inner = max(1, shape.depth // max(1, shape.outer_depth)) * shape.itemsize
    fit = (machine.l2_bytes // 2) // (inner * nb)
    if shape.strided_rows:
        fit = min(fit, (machine.l2_bytes // 2) // (inner * shape.cols))
    if shape.strided_rows and machine.row_pack:
        fit = min(fit, (machine.l1_bytes // 2) // (inner * nb))
    return max(1, min(shape.outer_depth, fit))


def candidates(shape: Shape, widths: tuple[int, ...], mb_max: int, machine: Machine) -> list[Tile]:
    """Every tile within the register budget, for `widths` (column-block widths for 4-byte
    elements, scaled to the precision so a block takes the same registers) and up to
    `mb_max` rows, in the order of `widths` then taller first."""
    per_vector = max(1, shape.itemsize // 4)
    scaled = list(dict.fromkeys(max(1, w // per_vector) for w in widths))
    full = [w for w in scaled if math.ceil(w / lanes(machine, shape.itemsize)) == machine.row_vectors]
    out: list[Tile] = []
    for w in full or scaled:
        # a nest narrower than the block gets the widest power of two it holds, and pads the rest
        nb = w if w <= shape.cols else 1 << (shape.cols.bit_length() - 1)
        for mb in range(min(mb_max, shape.rows), 0, -1):
            tile = Tile(mb, nb, k_chunk(shape, nb, machine))
            if fits(mb, nb, shape.itemsize, machine) and tile not in out:
                out.append(tile)
    return out


def choose(shape: Shape, widths: tuple[int, ...], mb_max: int, machine: Machine) -> Tile | None:
    """The cheapest candidate by `cycles`; the first in candidate order among equals."""
    found = candidates(shape, widths, mb_max, machine)
    return min(found, key=lambda t: cycles(shape, t, machine)) if found else None
