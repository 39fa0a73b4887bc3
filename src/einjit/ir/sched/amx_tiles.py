"""The tile layout of bf16 contractions on CPUs with AMX (Sapphire Rapids and later).

AMX multiplies tiles held in eight tile registers: `tdpbf16ps` adds to a 16 x 16 float tile
C the product of a 16-row tile A of 32 bf16 numbers a row (the summed index along a row) and
a tile B of 16 rows of 16 *pairs*, row `p` holding the pairs `(k, k + 1) = (2p, 2p + 1)` of
16 columns side by side (Intel's "VNNI" layout; the same pairs as `bf16_pairs`). One
instruction is 16 x 16 x 32 multiply-adds, 16 times `vdpbf16ps`'s work.

A contraction `c[i, j] += A(i, k) * B(j, k)` with bf16 operands (one summed loop, both
operands plain bf16 reads, so packing copies cells exactly) becomes

    apack[mt, kt, r, q] := A(16*mt + r, 32*kt + q)              (zero past the extents)
    bpack[nt, kt, p, col, l] := B(16*nt + col, 32*kt + 2*p + l)  (zero past the extents)
    for mb, nb:                                    (blocks of U x V tiles: 32 x 32 cells)
      ctile[ri, cj] := c[32*mb + ri, 32*nb + cj]   (the cells inside the extents; else zero)
      for kt: for u, v, p, l, r, col:              (the kernel: one `tdpbf16ps` per u, v and kt)
        ctile[16*u + r, 16*v + col] := fma(apack[U*mb + u, kt, r, 2*p + l],
                                           bpack[V*nb + v, kt, p, col, l], ctile[..])
      c[32*mb + ri, 32*nb + cj] := ctile[ri, cj]

Each tile of either pack is 1 KiB of contiguous memory (16 rows of 64 bytes), so a tile load
reads whole cache lines with a 64-byte stride; `ctile` holds the block's U x V float tiles as
one `16U x 16V` row-major array (tile `(u, v)` starts at row `16u`, column `16v`, its rows
`64V` bytes apart). Extents the tiles do not divide are padded with zeros in the packs (the
padding adds exact zeros) and the block's cells outside the result are neither loaded nor
stored, so every shape takes this path.

In the low-level IR this is the scalar update above, which the interpreter runs and every C
compiler compiles (the fp32 fallback): each cell sums its products in the original order of
`k` (`32*kt + 2*p + l`), so the fallback is bit-identical to the unscheduled nest. The C
renderer turns the kernel loop into tile loads, `_tile_dpbf16ps` and tile stores where the
compiler targets AMX (`backends.amx_tiles`). The packs are made once per contraction (per
batch cell): their cost is `O(M*K + N*K)` against the kernel's `O(M*N*K)`. The block loop over
rows runs on threads where the nest is large (`parallel`): `ctile` is then each thread's own.
"""

from __future__ import annotations

from dataclasses import dataclass

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import Affine, AxisIndex, FixedIdx, Iterator, Symbol, get_symbol, make_affine, subst_index
from einjit.ir.sched import nests
from einjit.ir.sched.cost_model import Machine
from einjit.ir.tnode import Tnode

__all__ = ["ROWS", "DEPTH", "BLOCK", "applies", "tiled"]

ROWS = 16
"""Rows of every tile, and columns of a float tile."""
DEPTH = 32
"""bf16 numbers per row of A's tile: the summed indices of one `tdpbf16ps`."""
BLOCK = 2
"""Tiles per block along rows and along columns (at most): 2 x 2 float tiles, 2 tiles of A and
2 of B, 8 tile registers in all; each tile of A and B loaded serves two products."""


def _bf16_read(sc: ll.LLScalar) -> bool:
    return isinstance(sc, ll.Get) and sc.tn.prec is ops.bf16


def applies(a_op: ll.LLScalar, b_op: ll.LLScalar, n_summed: int, target: Tnode, machine: Machine) -> bool:
    """Whether a contraction of `a_op * b_op` into `target` over `n_summed` loops takes AMX
    tiles: on a machine with them, both operands plain bf16 reads, one summed loop, and a
    target accumulated in float32 (float32 or bf16 storage)."""
    return (machine.amx_tiles and _bf16_read(a_op) and _bf16_read(b_op) and n_summed == 1
            and target.prec.computed_in is ops.single)


@dataclass(frozen=True)
class _Piece:
    """Part of a range split into digits (`index = sum(stride * digit)`): the loops over the
    digits that vary, the digits (iterators or fixed), and the index they make."""

    loops: list[tuple[Symbol, int]]
    digits: tuple[AxisIndex, ...]
    index: AxisIndex


def _pieces(n: int, strides: tuple[int, ...], syms: tuple[Symbol, ...]) -> list[_Piece]:
    """`0 .. n-1` as digits of the `strides` (the last 1, each dividing the one before): the
    whole steps of the first digit, then the rest of the range with that digit fixed."""
    full, rest = divmod(n, strides[0])
    out = []
    if full:
        digit_extents = ((s, big // small) for s, big, small in zip(syms[1:], strides, strides[1:], strict=False))
        loops = [(syms[0], full), *digit_extents]
        out.append(_Piece(loops, tuple(Iterator(s) for s in syms),
                          make_affine([(stride, s) for stride, s in zip(strides, syms, strict=True)])))
    if rest:
        for p in _pieces(rest, strides[1:], syms[1:]):
            out.append(_Piece(p.loops, (FixedIdx(full), *p.digits),
                              make_affine(_terms(p.index), strides[0] * full + _offset(p.index))))
    return out


def _terms(idx: AxisIndex) -> list[tuple[int, Symbol]]:
    match idx:
        case Iterator(s):
            return [(1, s)]
        case Affine(terms, _):
            return list(terms)
    return []


def _offset(idx: AxisIndex) -> int:
    match idx:
        case FixedIdx(value):
            return value
        case Affine(_, offset):
            return offset
    return 0


def _tile_order(loops: list[tuple[Symbol, int]], order: tuple[Symbol, ...]) -> list[tuple[Symbol, int]]:
    """A pack's loops tile by tile (each 1 KiB tile written whole before the next), the
    operand's unit-stride axis innermost. Packing B along its rows instead, every tile
    column at once, wrote 64 lines 32 KiB apart at each step (n = 1024; the same L1 sets) and
    took as long as the tile products (3 ms of 6.2 on a Sapphire Rapids-class core)."""
    return sorted(loops, key=lambda lp: order.index(lp[0]))


def _tiles(n: int, per_tile: int, per_block: int) -> tuple[int, int]:
    """Tiles along an extent, rounded up to whole blocks, and tiles per block."""
    tiles = -(-n // per_tile)
    block = min(per_block, tiles)
    return -(-tiles // block) * block, block


def tiled(st: ll.Set, i: Symbol, j: Symbol, k: Symbol, outer: list[tuple[Symbol, int]], extent: dict[Symbol, int],
          a_op: ll.LLScalar, b_op: ll.LLScalar, b_first: bool, zeroed: bool, threaded: bool) -> ll.LLStmt:
    """The contraction `st` (rows `i`, unit-stride columns `j`, summed `k`, batch loops
    `outer`) in AMX tiles, as in the module docstring. `zeroed`: the target holds zeros when
    the nest starts, so the blocks start at zero; `threaded`: the row blocks run on threads."""
    m, n, depth = extent[i], extent[j], extent[k]
    m_tiles, u_tiles = _tiles(m, ROWS, BLOCK)
    n_tiles, v_tiles = _tiles(n, ROWS, BLOCK)
    k_tiles = -(-depth // DEPTH)
    apack = nests.scheduler_local("apack", (m_tiles, k_tiles, ROWS, DEPTH), ops.bf16)
    bpack = nests.scheduler_local("bpack", (n_tiles, k_tiles, DEPTH // 2, ROWS, 2), ops.bf16)
    ctile = nests.scheduler_local("ctile", (ROWS * u_tiles, ROWS * v_tiles), ops.single)
    mt, r, kt, q, nt, col, p, lane = (get_symbol(s) for s in ("mt", "r", "kt", "q", "nt", "col", "p", "l"))
    packs: list[ll.LLStmt] = [ll.Comment(f"AMX tiles: A's {m} x {depth} and B's {depth} x {n} in 16 x 32 tiles")]
    a_contiguous = nests.unit_stride_axis_symbol(a_op.tn, a_op.idcs) == k if isinstance(a_op, ll.Get) else False
    b_contiguous = nests.unit_stride_axis_symbol(b_op.tn, b_op.idcs) == k if isinstance(b_op, ll.Get) else False
    if m_tiles * ROWS > m or depth % DEPTH:  # padding: zeros
        packs.append(ll.ZeroOut(apack))
    for rows in _pieces(m, (ROWS, 1), (mt, r)):
        for ks in _pieces(depth, (DEPTH, 1), (kt, q)):
            loops = _tile_order([*rows.loops, *ks.loops], (mt, kt, r, q) if a_contiguous else (mt, kt, q, r))
            packs.append(nests.nest(loops, ll.Set(apack, (rows.digits[0], ks.digits[0], rows.digits[1], ks.digits[1]),
                                                  nests.subst(a_op, {i: rows.index, k: ks.index}),
                                                  "pack A in tiles of 16 rows x 32")))
    if n_tiles * ROWS > n or depth % DEPTH:
        packs.append(ll.ZeroOut(bpack))
    for cols in _pieces(n, (ROWS, 1), (nt, col)):
        for ks in _pieces(depth, (DEPTH, 2, 1), (kt, p, lane)):
            order = (nt, kt, col, p, lane) if b_contiguous else (nt, kt, p, lane, col)
            loops = _tile_order([*cols.loops, *ks.loops], order)
            packs.append(nests.nest(loops, ll.Set(bpack, (cols.digits[0], ks.digits[0], ks.digits[1], cols.digits[1],
                                                          ks.digits[2]),
                                                  nests.subst(b_op, {j: cols.index, k: ks.index}),
                                                  "pack B in tiles of 16 pairs x 16 columns")))
    block_rows, block_cols = ROWS * u_tiles, ROWS * v_tiles
    mb, nb, u, v, ri, cj = (get_symbol(s) for s in ("mb", "nb", "u", "v", "ri", "cj"))
    kernel = _kernel(ctile, apack, bpack, (mb, nb, kt, u, v, p, lane, r, col), (u_tiles, v_tiles, k_tiles), b_first,
                     st.debug)
    blocks: list[ll.LLStmt] = []
    for rows in _pieces(m, (block_rows, 1), (mb, ri)):
        for cols in _pieces(n, (block_cols, 1), (nb, cj)):
            env = {mb: rows.digits[0], nb: cols.digits[0]}
            cells = [rows.loops[-1], cols.loops[-1]]
            at = (Iterator(ri), Iterator(cj))
            cell = tuple(subst_index({i: rows.index, j: cols.index}, idx) for idx in st.idcs)
            partial = rows.loops[-1][1] < block_rows or cols.loops[-1][1] < block_cols
            load: list[ll.LLStmt] = [ll.ZeroOut(ctile)] if zeroed or partial else []
            if not zeroed:
                load.append(nests.nest(cells, ll.Set(ctile, at, ll.Get(st.tn, cell))))
            body = ll.seq(*load, _subst_stmt(kernel, env), nests.nest(cells, ll.Set(st.tn, cell, ll.Get(ctile, at))))
            block_loops = [lp for lp in (rows.loops[0], cols.loops[0]) if lp[0] in (mb, nb)]
            blocks.append(nests.nest(block_loops, body, parallel=mb if threaded and rows.loops[0][1] > 1 else None))
    tiles = f"{u_tiles} x {v_tiles} tiles of 16 x 16 per block"
    body = ll.seq(*packs, ll.Comment(f"AMX tile contraction into {st.tn.name}: {tiles}"), *blocks)
    return nests.nest(outer, body)


def _kernel(ctile: Tnode, apack: Tnode, bpack: Tnode, syms: tuple[Symbol, ...], counts: tuple[int, int, int],
            b_first: bool, debug: str) -> ll.ForLoop:
    """The tile products of one block: `kt` outermost, then the block's tiles and each tile
    product's own loops, the order later stages keep (`keep_order`) and the renderer reads."""
    mb, nb, kt, u, v, p, lane, r, col = syms
    u_tiles, v_tiles, k_tiles = counts
    at = (make_affine([(ROWS, u), (1, r)]), make_affine([(ROWS, v), (1, col)]))
    a_read = ll.Get(apack, (make_affine([(u_tiles, mb), (1, u)]), Iterator(kt), Iterator(r),
                            make_affine([(2, p), (1, lane)])))
    b_read = ll.Get(bpack, (make_affine([(v_tiles, nb), (1, v)]), Iterator(kt), Iterator(p), Iterator(col),
                            Iterator(lane)))
    x, y = (b_read, a_read) if b_first else (a_read, b_read)
    update = ll.Set(ctile, at, ll.Ternop(ops.Ternop.FMA, x, y, ll.Get(ctile, at)), debug)
    inner = nests.nest([(u, u_tiles), (v, v_tiles), (p, DEPTH // 2), (lane, 2), (r, ROWS), (col, ROWS)], update)
    return ll.ForLoop(kt, 0, k_tiles - 1, inner, keep_order=True)


def _subst_stmt(loop: ll.ForLoop, env: dict[Symbol, AxisIndex]) -> ll.ForLoop:
    """The kernel with the block symbols replaced (fixed in a tail block)."""
    body = loop.body
    loops = []
    while isinstance(body, ll.ForLoop):
        loops.append(body)
        body = body.body
    assert isinstance(body, ll.Set) and isinstance(body.llsc, ll.Ternop)
    fma = body.llsc
    args = tuple(nests.subst(arg, env) for arg in (fma.arg1, fma.arg2, fma.arg3))
    new: ll.LLStmt = ll.Set(body.tn, body.idcs, ll.Ternop(fma.op, *args), body.debug)
    for lp in reversed(loops):
        new = ll.ForLoop(lp.index, lp.from_, lp.to_, new)
    return ll.ForLoop(loop.index, loop.from_, loop.to_, new, keep_order=True)
