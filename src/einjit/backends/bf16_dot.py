"""AVX512_BF16 register blocks: the C rendering of a bf16-pair contraction kernel
(`ir.sched.bf16_pairs`) as `_mm512_dpbf16_ps` calls, where the compiler targets the
instruction.

The scheduler's kernel nest is

    for kp: for kl in 0..1: for a: for b in 0..nb-1:
      acc[a, b] = fma(A(.., 2*kp + kl), pack[kp, b, kl], acc[a, b])

with `acc` a float block and `pack` holding bf16 pairs. `kernel` recognizes it; `render`
emits, under `#if defined(__AVX512BF16__)`, a block holding `acc` in `__m512` variables (16
columns each), one `vdpbf16ps` per row and vector per pair of `k`, the pair of `A` broadcast
to every lane; the caller renders the scalar nest under `#else`, so the same source compiles
for every CPU, and the choice is the compiler's (`-march=native` defines `__AVX512BF16__` on
a CPU that has it). `vdpbf16ps` computes each pair's two products and their sum without
intermediate rounding, flushes subnormal inputs and outputs to zero and rounds once per pair
(to nearest even): results differ from the scalar nest (one rounding per product) by a few
float ulps per pair, far below bf16's own resolution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import AxisIndex, FixedIdx, Iterator, Symbol, index_symbols, subst_index
from einjit.ir.tnode import Tnode

__all__ = ["HELPER", "Kernel", "kernel", "render"]

LANES = 16
"""Floats per AVX-512 vector: columns per `vdpbf16ps`."""

HELPER = """\
#if defined(__AVX512BF16__)
#include <immintrin.h>
/* Two bf16 numbers (the pair k, k + 1 of one row) as a 32-bit lane broadcast to all 16 lanes. */
{q} __m512bh einjit_bf16_pair(unsigned short lo, unsigned short hi) {{
  return (__m512bh)_mm512_set1_epi32((int)((unsigned int)lo | ((unsigned int)hi << 16)));
}}
#endif
"""


class Writer(Protocol):
    """What `render` needs of the C renderer's writer (`c_syntax._Writer`)."""

    loops: dict[Symbol, tuple[int, int]]
    helpers: set[str]
    index_type: str

    def node_name(self, tn: Tnode, written: bool = False) -> str: ...

    def index(self, tn: Tnode, idcs: tuple[AxisIndex, ...], what: str, extra_last: int = 0) -> str: ...


@dataclass(frozen=True)
class Kernel:
    """A recognized kernel nest: `pairs` steps of `kp`, the `kl` and `a` (row, None for one
    row) symbols, the float block `acc` of `rows` × `nb`, the pair panel and the other
    operand's read."""

    kp: Symbol
    pairs: int
    kl: Symbol
    a: Symbol | None
    rows: int
    nb: int
    acc: Tnode
    pack: Tnode
    other: ll.Get


def _only(stmt: ll.LLStmt) -> ll.LLStmt | None:
    inner = [s for s in ll.flatten(stmt) if not isinstance(s, ll.Comment)]
    return inner[0] if len(inner) == 1 else None


def kernel(loop: ll.ForLoop) -> Kernel | None:
    """`loop` as a bf16-pair kernel nest, or None if it is anything else."""
    lane = _only(loop.body)
    if (loop.from_ != 0 or loop.start or loop.stop or not isinstance(lane, ll.ForLoop)
            or (lane.from_, lane.to_) != (0, 1)):
        return None
    row = _only(lane.body)
    a: Symbol | None = None
    rows = 1
    if isinstance(row, ll.ForLoop) and row.from_ == 0 and isinstance(_only(row.body), ll.ForLoop):
        a, rows, row = row.index, row.to_ + 1, _only(row.body)
    if not isinstance(row, ll.ForLoop) or row.from_ != 0:
        return None
    b, nb = row.index, row.to_ + 1
    st = _only(row.body)
    if not isinstance(st, ll.Set) or nb % LANES:
        return None
    acc = st.tn
    block = (Iterator(a) if a is not None else FixedIdx(0), Iterator(b))
    match st.llsc:
        case ll.Ternop(ops.Ternop.FMA, ll.Get() as x, ll.Get() as y, ll.Get(acc_tn, acc_idcs)):
            pass
        case _:
            return None
    if acc is not acc_tn or acc_idcs != block or st.idcs != block or acc.prec is not ops.single \
            or acc.dims != (rows, nb):
        return None
    pair_at = (Iterator(loop.index), Iterator(b), Iterator(lane.index))
    for pack, other in ((x, y), (y, x)):
        if pack.idcs == pair_at and pack.tn.prec is ops.bf16 and pack.tn.dims[1:] == (nb, 2) \
                and other.tn.prec is ops.bf16 and not any(b in index_symbols(idx) for idx in other.idcs):
            return Kernel(loop.index, loop.to_ + 1, lane.index, a, rows, nb, acc, pack.tn, other)
    return None


def render(w: Writer, k: Kernel, kp: str, indent: str) -> list[str]:
    """The AVX512_BF16 block for `k`, opening with `#if` and ending with `#else`: the caller
    renders the scalar nest and the `#endif`. `kp` is the C name of the pair loop's counter."""
    w.helpers.add("bf16_dot")
    acc = w.node_name(k.acc, written=True)
    pack = w.node_name(k.pack)
    other = w.node_name(k.other.tn)
    vectors = k.nb // LANES
    inner = indent + "  "
    body = indent + "    "
    lines = ["#if defined(__AVX512BF16__)", indent + "{"]
    for r in range(k.rows):
        for v in range(vectors):
            lines.append(f"{inner}__m512 d{r}_{v}_ = _mm512_loadu_ps(&{acc}[{r * k.nb + v * LANES}]);")
    lines.append(f"{inner}for ({w.index_type} {kp} = 0; {kp} < {k.pairs}; ++{kp}) {{")
    w.loops[k.kp] = (0, k.pairs - 1)
    try:
        for v in range(vectors):
            at = w.index(k.pack, (Iterator(k.kp), FixedIdx(v * LANES), FixedIdx(0)), "read")
            lines.append(f"{body}const __m512bh p{v}_ = (__m512bh)_mm512_loadu_si512((const void *)&{pack}[{at}]);")
        for r in range(k.rows):
            lo, hi = (w.index(k.other.tn, _fixed(k, r, member), "read") for member in (0, 1))
            lines.append(f"{body}const __m512bh x{r}_ = einjit_bf16_pair({other}[{lo}], {other}[{hi}]);")
            lines += [f"{body}d{r}_{v}_ = _mm512_dpbf16_ps(d{r}_{v}_, x{r}_, p{v}_);" for v in range(vectors)]
    finally:
        del w.loops[k.kp]
    lines.append(inner + "}")
    for r in range(k.rows):
        for v in range(vectors):
            lines.append(f"{inner}_mm512_storeu_ps(&{acc}[{r * k.nb + v * LANES}], d{r}_{v}_);")
    return [*lines, indent + "}", "#else"]


def _fixed(k: Kernel, row: int, member: int) -> tuple[AxisIndex, ...]:
    env: dict[Symbol, AxisIndex] = {k.kl: FixedIdx(member)}
    if k.a is not None:
        env[k.a] = FixedIdx(row)
    return tuple(subst_index(env, idx) for idx in k.other.idcs)
