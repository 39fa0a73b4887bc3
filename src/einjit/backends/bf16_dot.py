"""AVX512_BF16 register blocks: the C rendering of a bf16-pair contraction kernel
(`ir.sched.bf16_pairs`) as `_mm512_dpbf16_ps` calls, where the compiler targets the
instruction.

The scheduler's kernel nest is

    for kp: for kl in 0..1: for a: for jv: for jl in 0..15:
      acc[a, jv, jl] = fma(A(.., 2*kp + kl), pack[kp, 16*jv + jl, kl], acc[a, jv, jl])

with `acc` a float register block of 16-lane vectors (as fp32 contractions have: loaded
from and stored to the result as whole vectors, kept in registers) and `pack` holding bf16
pairs. `kernel` recognizes it; `render` emits, under `#if defined(__AVX512BF16__)`, a block
holding `acc`'s vectors in `__m512` variables, one `vdpbf16ps` per row and vector per pair of
`k`, the pair of `A` broadcast to every lane (one 32-bit load where the pair is adjacent in
memory); the caller renders the plain nest under `#else`, so the same source compiles
for every CPU, and the choice is the compiler's (`-march=native` defines `__AVX512BF16__` on
a CPU that has it). `vdpbf16ps` adds a pair's two (exact) products one at a time, the second
member's first, each addition rounded to nearest even, and flushes subnormal inputs and
outputs to zero (Intel's pseudo-code; bit for bit what a Sapphire Rapids core gave): results
differ from the plain nest, which adds the first member's product first, by a few float ulps
where the order matters, far below bf16's own resolution.

The nest packing such a panel from the rows of its operand (`pair_pack`) is rendered the same
way, as `einjit_bf16_pairs16` calls that interleave 16 columns of the two rows of a pair with one
`vpermw`: the plain nest's 16-bit copies took 8% of a 512 x 512 matmul (210 against 229
GFLOP/s on a Zen 4 core, PyTorch's bf16 matmul 220).
"""

from __future__ import annotations

from dataclasses import dataclass

from einjit.backends import c_vectors
from einjit.backends.kernel_writer import Writer
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import (
    Affine,
    AxisIndex,
    FixedIdx,
    Iterator,
    Symbol,
    index_symbols,
    make_affine,
    subst_index,
)
from einjit.ir.sched.bf16_pairs import LANES
from einjit.ir.tnode import Tnode

__all__ = ["HELPER", "Kernel", "PairPack", "kernel", "pair_pack", "render", "render_pack"]

HELPER = """\
#if defined(__AVX512BF16__)
#include <immintrin.h>
/* Two bf16 numbers (the pair k, k + 1 of one row) as a 32-bit lane broadcast to all 16 lanes. */
{q} __m512bh einjit_bf16_pair(unsigned short lo, unsigned short hi) {{
  return (__m512bh)_mm512_set1_epi32((int)((unsigned int)lo | ((unsigned int)hi << 16)));
}}
/* The same for a pair stored side by side at `p`: one 32-bit load. */
{q} __m512bh einjit_bf16_pair_at(const unsigned short *p) {{
  int pair;
  memcpy(&pair, p, sizeof pair);
  return (__m512bh)_mm512_set1_epi32(pair);
}}
#if defined(__AVX512BW__)
/* 16 columns of two rows (`lo`: k, `hi`: k + 1) interleaved into 16 pairs at `out`. */
{q} void einjit_bf16_pairs16(unsigned short *out, const unsigned short *lo, const unsigned short *hi) {{
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                         23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i rows = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const void *)lo)),
                                          _mm256_loadu_si256((const void *)hi), 1);
  _mm512_storeu_si512((void *)out, _mm512_permutexvar_epi16(order, rows));
}}
#endif
#endif
"""


@dataclass(frozen=True)
class Kernel:
    """A recognized kernel nest: `pairs` steps of `kp`, the `kl` and `a` (row, None for one
    row) symbols, the float block `acc` of `rows` × `nb`, the pair panel with the indices
    before its pair axes (`lead`: outer summed loops, which the kernel runs inside) and the
    other operand's read."""

    kp: Symbol
    pairs: int
    kl: Symbol
    a: Symbol | None
    rows: int
    nb: int
    acc: Tnode
    pack: Tnode
    lead: tuple[AxisIndex, ...]
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
    loops: list[ll.ForLoop] = []
    st = _only(lane.body)
    while isinstance(st, ll.ForLoop) and st.from_ == 0 and len(loops) < 3:
        loops.append(st)
        st = _only(st.body)
    if not isinstance(st, ll.Set) or len(loops) < 2 or loops[-1].to_ + 1 != LANES:
        return None
    a, rows = (loops[0].index, loops[0].to_ + 1) if len(loops) == 3 else (None, 1)
    jv, jl, vectors = loops[-2].index, loops[-1].index, loops[-2].to_ + 1
    acc = st.tn
    block = (Iterator(a) if a is not None else FixedIdx(0), Iterator(jv), Iterator(jl))
    match st.llsc:
        case ll.Ternop(ops.Ternop.FMA, ll.Get() as x, ll.Get() as y, ll.Get(acc_tn, acc_idcs)):
            pass
        case _:
            return None
    if acc is not acc_tn or acc_idcs != block or st.idcs != block or not c_vectors.is_block(acc) \
            or acc.prec is not ops.single or acc.dims != (rows, vectors, LANES):
        return None
    nb = vectors * LANES
    pair_at = (Iterator(loop.index), make_affine(((LANES, jv), (1, jl))), Iterator(lane.index))
    inner = {loop.index, lane.index, jv, jl} | ({a} if a is not None else set())
    for pack, other in ((x, y), (y, x)):
        lead = pack.idcs[:-3]
        if pack.idcs[-3:] == pair_at and pack.tn.prec is ops.bf16 and pack.tn.dims[-2:] == (nb, 2) \
                and not inner & set().union(*map(index_symbols, lead)) \
                and other.tn.prec is ops.bf16 and not {jv, jl} & set().union(*map(index_symbols, other.idcs)):
            return Kernel(loop.index, loop.to_ + 1, lane.index, a, rows, nb, acc, pack.tn, lead, other)
    return None


def _adjacent(k: Kernel) -> bool:
    """Whether the two members of a pair of the other operand are consecutive in memory (its
    innermost axis steps by one with `kl`, which no other axis reads): the pair is then one
    32-bit load, broadcast (`vpbroadcastd` from memory), instead of two 16-bit loads, a shift,
    an or and a broadcast per row and pair."""
    idcs = [idx for d, idx in zip(k.other.tn.dims, k.other.idcs, strict=True) if d > 1]
    if not idcs or any(k.kl in index_symbols(idx) for idx in idcs[:-1]):
        return False
    match idcs[-1]:
        case Iterator(sym):
            return sym == k.kl
        case Affine(terms, _):
            return (1, k.kl) in terms
    return False


def render(w: Writer, k: Kernel, kp: str, indent: str) -> list[str]:
    """The AVX512_BF16 block for `k`, opening with `#if` and ending with `#else`: the caller
    renders the plain nest and the `#endif`. `kp` is the C name of the pair loop's counter.
    The accumulators are the register block's own vectors (an array gcc keeps in registers),
    copied into `__m512` variables for the intrinsics."""
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
            lines.append(f"{inner}__m512 d{r}_{v}_ = (__m512){acc}[{r * vectors + v}];")
    lines.append(f"{inner}for ({w.index_type} {kp} = 0; {kp} < {k.pairs}; ++{kp}) {{")
    w.loops[k.kp] = (0, k.pairs - 1)
    adjacent = _adjacent(k)
    try:
        for v in range(vectors):
            at = w.index(k.pack, (*k.lead, Iterator(k.kp), FixedIdx(v * LANES), FixedIdx(0)), "read")
            lines.append(f"{body}const __m512bh p{v}_ = (__m512bh)_mm512_loadu_si512((const void *)&{pack}[{at}]);")
        for r in range(k.rows):
            lo, hi = (w.index(k.other.tn, _fixed(k, r, member), "read") for member in (0, 1))
            pair = f"einjit_bf16_pair_at(&{other}[{lo}])" if adjacent else \
                f"einjit_bf16_pair({other}[{lo}], {other}[{hi}])"
            lines.append(f"{body}const __m512bh x{r}_ = {pair};")
            lines += [f"{body}d{r}_{v}_ = _mm512_dpbf16_ps(d{r}_{v}_, x{r}_, p{v}_);" for v in range(vectors)]
    finally:
        del w.loops[k.kp]
    lines.append(inner + "}")
    vector = c_vectors.type_name(k.acc)
    for r in range(k.rows):
        for v in range(vectors):
            lines.append(f"{inner}{acc}[{r * vectors + v}] = ({vector})d{r}_{v}_;")
    return [*lines, indent + "}", "#else"]


def _fixed(k: Kernel, row: int, member: int) -> tuple[AxisIndex, ...]:
    env: dict[Symbol, AxisIndex] = {k.kl: FixedIdx(member)}
    if k.a is not None:
        env[k.a] = FixedIdx(row)
    return tuple(subst_index(env, idx) for idx in k.other.idcs)


@dataclass(frozen=True)
class PairPack:
    """A recognized pair-panel packing nest: `pairs` steps of `kp`, the `kl` and column `b`
    symbols, `width` columns (whole vectors), the panel written and the bf16 operand read."""

    kp: Symbol
    pairs: int
    kl: Symbol
    b: Symbol
    width: int
    pack: ll.Set
    source: ll.Get


def pair_pack(loop: ll.ForLoop) -> PairPack | None:
    """`loop` as the packing of a pair panel from a bf16 operand whose rows run along the
    columns (`for kp: for kl in 0..1: for b: pack[.., kp, b, kl] = B(2*kp + kl, b)`, B unit
    stride along `b`), or None. gcc compiled that nest to one 16-bit load and store per cell,
    8% of a 512 x 512 bf16 matmul on a Zen 4 core; `render_pack` interleaves 16 columns of
    the two rows in one permutation."""
    lane = _only(loop.body)
    if loop.from_ != 0 or not isinstance(lane, ll.ForLoop) or (lane.from_, lane.to_) != (0, 1):
        return None
    cols = _only(lane.body)
    if not isinstance(cols, ll.ForLoop) or cols.from_ != 0 or (cols.to_ + 1) % LANES:
        return None
    if any(lp.start or lp.stop or lp.parallel for lp in (loop, lane, cols)):
        return None  # clipped bounds or threads: the plain nest's rendering keeps them
    st = _only(cols.body)
    kp, kl, b = loop.index, lane.index, cols.index
    match st:
        case ll.Set(tn, idcs, ll.Get(src, src_idcs) as source) if tn.prec is ops.bf16 and src.prec is ops.bf16:
            pass
        case _:
            return None
    if len(idcs) < 3 or idcs[-3:] != (Iterator(kp), Iterator(b), Iterator(kl)) or tn.dims[-1] != 2 \
            or any({kp, kl, b} & set(index_symbols(x)) for x in idcs[:-3]):
        return None
    if not _steps_by_one(src, src_idcs, b) or any(b in index_symbols(x) for x in src_idcs[:-1]):
        return None
    return PairPack(kp, loop.to_ + 1, kl, b, cols.to_ + 1, st, source)


def _steps_by_one(tn: Tnode, idcs: tuple[AxisIndex, ...], b: Symbol) -> bool:
    """Whether `tn[idcs]`'s innermost axis (of more than one cell) is `b` with coefficient one."""
    inner = [idx for d, idx in zip(tn.dims, idcs, strict=True) if d > 1]
    match inner[-1] if inner else None:
        case Iterator(sym):
            return sym == b
        case Affine(terms, _):
            return (1, b) in terms
    return False


def render_pack(w: Writer, p: PairPack, kp: str, indent: str) -> list[str]:
    """The AVX-512 packing of `p`, opening with `#if` and ending with `#else`, as `render`."""
    w.helpers.add("bf16_dot")
    pack, source = w.node_name(p.pack.tn, written=True), w.node_name(p.source.tn)
    inner = indent + "  "
    head = f"{indent}for ({w.index_type} {kp} = 0; {kp} < {p.pairs}; ++{kp}) {{"
    lines = ["#if defined(__AVX512BF16__) && defined(__AVX512BW__)", head]
    w.loops[p.kp] = (0, p.pairs - 1)
    try:
        for v in range(p.width // LANES):
            col = FixedIdx(v * LANES)
            out = w.index(p.pack.tn, tuple(subst_index({p.b: col, p.kl: FixedIdx(0)}, x) for x in p.pack.idcs), "write")
            lo, hi = (w.index(p.source.tn, tuple(subst_index({p.b: col, p.kl: FixedIdx(m)}, x) for x in p.source.idcs),
                              "read") for m in (0, 1))
            lines.append(f"{inner}einjit_bf16_pairs16(&{pack}[{out}], &{source}[{lo}], &{source}[{hi}]);")
    finally:
        del w.loops[p.kp]
    return [*lines, indent + "}", "#else"]
