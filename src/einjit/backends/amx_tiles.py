"""AMX tile kernels: the C rendering of a bf16 tile contraction's kernel loop
(`ir.sched.amx_tiles`) as `_tile_dpbf16ps` calls, where the compiler targets AMX.

The scheduler's kernel loop is

    for kt (order kept): for u < U: for v < V: for p < 16: for l < 2: for r < 16: for col < 16:
      ctile[16*u + r, 16*v + col] = fma(apack[X + u, kt, r, 2*p + l],
                                        bpack[Y + v, kt, p, col, l], ctile[..])

with `X`, `Y` the block's first tiles. `kernel` recognizes it; `render` emits, under
`#if defined(__AMX_TILE__) && defined(__AMX_BF16__)` (`-march=native` defines both on a CPU
with AMX), a block that loads the U x V float tiles from `ctile`, then per `kt` the U tiles
of A and V of B and one `tdpbf16ps` per pair, and stores the float tiles back, guarded by
`einjit_amx_start()`; the caller renders the plain loop after it as the `else` branch (and
as the only code where the compiler does not target AMX).

`einjit_amx_start` asks Linux once per process for the tile data state (`arch_prctl
(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, which a process must do before its first tile
instruction) and loads the tile shapes (every tile 16 rows of 64 bytes) on every call: the
configuration belongs to the thread, every thread that runs a kernel needs it, and other
code in the same thread (a library's own AMX kernels) may have loaded other shapes since. Where
the kernel refuses the permission it returns 0 and the plain loop runs: the fp32 fallback,
same results as the interpreter, at the float kernel's speed.

`tdpbf16ps` adds a pair's two (exact) products into the accumulator one at a time, rounded
to nearest even, subnormal inputs and outputs flushed to zero (Intel's pseudo-code): where
the hardware follows it, each cell's sum is the plain loop's, in the same order; tests hold
it to the float32 accumulation bound (`depth * 2**-24` of the sum of magnitudes) either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from einjit.backends.kernel_writer import Writer
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import AxisIndex, FixedIdx, Iterator, Symbol, make_affine, subst_index
from einjit.ir.sched.amx_tiles import DEPTH, ROWS
from einjit.ir.tnode import Tnode

__all__ = ["GUARD", "HELPER", "Kernel", "kernel", "render"]

GUARD = "#if defined(__AMX_TILE__) && defined(__AMX_BF16__)"

HELPER = """\
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifndef EINJIT_AMX_REQUEST
/* arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): 0 when the process may use the tiles. */
#define EINJIT_AMX_REQUEST() syscall(SYS_arch_prctl, 0x1023, 18)
#endif
/* Whether this thread may run tile kernels now: the permission asked once per process (asking
   again is harmless, so threads racing here do no harm), the tile shapes loaded on every call
   (they are per thread, and other code may have changed them). 0: run the plain loop. */
{q} int einjit_amx_start(void) {{
  static int permitted; /* 0: not asked yet, 1: granted, -1: refused */
  int state = __atomic_load_n(&permitted, __ATOMIC_RELAXED);
  if (state == 0) {{
    state = EINJIT_AMX_REQUEST() == 0 ? 1 : -1;
    __atomic_store_n(&permitted, state, __ATOMIC_RELAXED);
  }}
  if (state < 0) return 0;
  static const struct {{
    unsigned char palette, start_row, reserved[14];
    unsigned short colsb[16];
    unsigned char rows[16];
  }} shapes = {{1, 0, {{0}}, {{64, 64, 64, 64, 64, 64, 64, 64}}, {{16, 16, 16, 16, 16, 16, 16, 16}}}};
  _tile_loadconfig(&shapes);
  return 1;
}}
#endif
"""

A_TILES = 4
"""The tile registers: float tiles from 0 (at most 4), A's from 4, B's from 6."""
B_TILES = 6


@dataclass(frozen=True)
class Kernel:
    """A recognized kernel loop: `steps` of `kt`, the block's `u_tiles` x `v_tiles` float
    tiles in `ctile`, the reads of the packs (`apack`, `bpack`) and the tile symbols `u`, `v`
    and the in-tile symbols `p`, `l`, `r`, `col`."""

    kt: Symbol
    steps: int
    u_tiles: int
    v_tiles: int
    ctile: Tnode
    apack: ll.Get
    bpack: ll.Get
    inner: tuple[Symbol, ...]


def _loops(stmt: ll.LLStmt, depth: int) -> tuple[list[ll.ForLoop], ll.LLStmt]:
    loops: list[ll.ForLoop] = []
    while len(loops) < depth and isinstance(stmt, ll.ForLoop) and stmt.from_ == 0 and not stmt.start \
            and not stmt.stop:
        loops.append(stmt)
        stmt = stmt.body
    return loops, stmt


def kernel(loop: ll.ForLoop) -> Kernel | None:
    """`loop` as an AMX kernel loop, or None if it is anything else."""
    if not loop.keep_order or loop.from_ != 0 or loop.start or loop.stop:
        return None
    loops, st = _loops(loop.body, 6)
    if len(loops) != 6 or not isinstance(st, ll.Set):
        return None
    u, v, p, lane, r, col = (lp.index for lp in loops)
    u_tiles, v_tiles, *inner = (lp.to_ + 1 for lp in loops)
    if inner != [DEPTH // 2, 2, ROWS, ROWS] or not (1 <= u_tiles <= 2 and 1 <= v_tiles <= 2):
        return None
    ctile = st.tn
    at = (make_affine([(ROWS, u), (1, r)]), make_affine([(ROWS, v), (1, col)]))
    match st.llsc:
        case ll.Ternop(ops.Ternop.FMA, ll.Get() as x, ll.Get() as y, ll.Get(acc, acc_at)):
            pass
        case _:
            return None
    if acc is not ctile or acc_at != at or st.idcs != at or ctile.prec is not ops.single \
            or ctile.dims != (ROWS * u_tiles, ROWS * v_tiles):
        return None
    kt = Iterator(loop.index)
    for a, b in ((x, y), (y, x)):
        if (a.tn.prec is ops.bf16 and b.tn.prec is ops.bf16 and a.tn.dims[1:] == (loop.to_ + 1, ROWS, DEPTH)
                and b.tn.dims[1:] == (loop.to_ + 1, DEPTH // 2, ROWS, 2)
                and a.idcs[1:] == (kt, Iterator(r), make_affine([(2, p), (1, lane)]))
                and b.idcs[1:] == (kt, Iterator(p), Iterator(col), Iterator(lane))
                and _first_tile(a.idcs[0], u) and _first_tile(b.idcs[0], v)):
            return Kernel(loop.index, loop.to_ + 1, u_tiles, v_tiles, ctile, a, b, (u, v, p, lane, r, col))
    return None


def _first_tile(idx: AxisIndex, tile: Symbol) -> bool:
    """Whether `idx` is `tile` plus an index of the enclosing loops (the block's first tile)."""
    match idx:
        case Iterator(s):
            return s == tile
        case _:
            return (1, tile) in getattr(idx, "symbols", ())


def render(w: Writer, k: Kernel, kt: str, indent: str) -> list[str]:
    """The AMX block for `k`, from `#if` to `} else` and `#endif`: the caller renders the plain
    loop next, the `else` branch. `kt` is the C name of the tile-step loop's counter."""
    w.helpers.add("amx_tiles")
    u, v, p, lane, r, col = k.inner
    ctile, apack, bpack = w.node_name(k.ctile, written=True), w.node_name(k.apack.tn), w.node_name(k.bpack.tn)
    inner, body = indent + "  ", indent + "    "
    row_bytes = 4 * ROWS * k.v_tiles
    corner: dict[Symbol, AxisIndex] = {p: FixedIdx(0), lane: FixedIdx(0), r: FixedIdx(0), col: FixedIdx(0)}
    lines = [GUARD, indent + "if (einjit_amx_start()) {"]
    c_tiles = [(tu, tv) for tu in range(k.u_tiles) for tv in range(k.v_tiles)]

    def at(get: ll.Get, env: dict[Symbol, AxisIndex]) -> str:
        return w.index(get.tn, tuple(subst_index({**corner, **env}, idx) for idx in get.idcs), "read")

    for t, (tu, tv) in enumerate(c_tiles):
        lines.append(f"{inner}_tile_loadd({t}, &{ctile}[{tu * ROWS * ROWS * k.v_tiles + tv * ROWS}], {row_bytes});")
    lines.append(f"{inner}for ({w.index_type} {kt} = 0; {kt} < {k.steps}; ++{kt}) {{")
    w.loops[k.kt] = (0, k.steps - 1)
    try:
        for tu in range(k.u_tiles):
            lines.append(f"{body}_tile_loadd({A_TILES + tu}, &{apack}[{at(k.apack, {u: FixedIdx(tu)})}], 64);")
        for tv in range(k.v_tiles):
            lines.append(f"{body}_tile_loadd({B_TILES + tv}, &{bpack}[{at(k.bpack, {v: FixedIdx(tv)})}], 64);")
    finally:
        del w.loops[k.kt]
    lines += [f"{body}_tile_dpbf16ps({t}, {A_TILES + tu}, {B_TILES + tv});" for t, (tu, tv) in enumerate(c_tiles)]
    lines.append(inner + "}")
    for t, (tu, tv) in enumerate(c_tiles):
        lines.append(f"{inner}_tile_stored({t}, &{ctile}[{tu * ROWS * ROWS * k.v_tiles + tv * ROWS}], {row_bytes});")
    return [*lines, indent + "} else", "#endif"]
