"""Register blocks as C vectors: how the C renderer stores the scheduler's accumulator blocks
(`ir.sched.nests.RegisterBlock`, provenance `REGISTER_BLOCK`) and renders the loops over
their lanes.

gcc -O2 does not keep a float array in registers once it has vectorized the loop over its
columns itself: on AVX2 one accumulator of every block went through the stack at each step of
the summed loop, a store-to-load chain that ran `a @ b` at a quarter of the FMA peak (-O3
scalarizes it, but the toolchain avoids -O3). So a block of dims `(.., lanes)` is declared
as an array of GCC vectors (`einjit_f32x8 acc[8]`), and a loop over its lanes whose one
statement reads other arrays either contiguously along the lane or not at all becomes one
vector statement: loads (`einjit_load_*`, unaligned), broadcasts (`einjit_splat_*`) and
`einjit_fma_*`. The scheduler unrolls the loops around it, so every index of the array is
a constant and gcc keeps it in vector registers.

Arithmetic is unchanged lane by lane: `einjit_fma_*` is x86's vector FMA where the compiler
targets it, else `fmaf`/`fma` per lane (which gcc vectorizes where it can), `+` and `*` on
vectors round like the scalar operations, so results are bit-identical to the scalar loop.
Any other use of a block (a loop that does not fit, a single cell) addresses a lane of a
vector, `acc[3][l]`. A loop over half the lanes of a block may read it by halves, at the lane
and at the lane plus that half (`half`): the scheduler sums a vector's lanes that way, into a
block of half the lanes (`einjit_low_*` plus `einjit_high_*`, a shuffle each).
"""

from __future__ import annotations

from collections.abc import Iterable

from einjit.ir import low_level as ll
from einjit.ir import ops, provenance
from einjit.ir.indexing import Affine, AxisIndex, FixedIdx, Iterator, Symbol, index_symbols, subst_index
from einjit.ir.sched.nests import vector_ops_only
from einjit.ir.tnode import Tnode

_ELEMENTS = {ops.single: ("f32", "float", "f"), ops.double: ("f64", "double", "")}
_LANES = (2, 4, 8, 16)

def is_block(tn: Tnode) -> bool:
    """Whether `tn` is stored as an array of vectors of its last axis."""
    return (tn.provenance == provenance.REGISTER_BLOCK and tn.prec in _ELEMENTS and len(tn.dims) >= 2
            and tn.dims[-1] in _LANES)


def vector_name(tn: Tnode) -> str:
    """`f32x8`: the vector of a block, naming its type and helpers."""
    return f"{_ELEMENTS[tn.prec][0]}x{tn.dims[-1]}"


def type_name(tn: Tnode) -> str:
    return f"einjit_{vector_name(tn)}"


def vectors(tn: Tnode) -> int:
    """How many vectors the block's array holds."""
    return tn.size // tn.dims[-1]


_INTRINSICS = {("f32", 16): ("__AVX512F__", "__builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)-1, 4)"),
               ("f64", 8): ("__AVX512F__", "__builtin_ia32_vfmaddpd512_mask(a, b, c, (unsigned char)-1, 4)"),
               ("f32", 8): ("__FMA__", "__builtin_ia32_vfmaddps256(a, b, c)"),
               ("f64", 4): ("__FMA__", "__builtin_ia32_vfmaddpd256(a, b, c)"),
               ("f32", 4): ("__FMA__", "__builtin_ia32_vfmaddps(a, b, c)"),
               ("f64", 2): ("__FMA__", "__builtin_ia32_vfmaddpd(a, b, c)")}
"""x86's FMA for each vector, where the compiler targets it: gcc's vectorizer would split the
lane loop of a 64-byte vector into 32-byte halves on CPUs it tunes for 256-bit vectors
(Ice Lake, Sapphire Rapids), with shuffles and stack traffic. The builtins are what
`<immintrin.h>`'s `_mm*_fmadd_p*` return (gcc's and clang's; 4 is `_MM_FROUND_CUR_DIRECTION`),
called directly because parsing that header under `-march=native` cost gcc 0.4 s per
translation unit, a third of an outlined GPT step's unit."""


def _helper(short: str, elem: str, suffix: str, lanes: int) -> str:
    t = f"einjit_{short}x{lanes}"
    splat = ", ".join(["x"] * lanes)
    loop = f"""\
  for (int l = 0; l < {lanes}; ++l) c[l] = fma{suffix}(a[l], b[l], c[l]);
  return c;
"""
    if (short, lanes) in _INTRINSICS:
        macro, fma = _INTRINSICS[short, lanes]
        body = f"""\
#ifdef {macro}
  return {fma};
#else
{loop}#endif
"""
    else:
        body = loop
    return f"""\
/* {lanes} {elem}s of a register block, in vector registers (GCC vector extensions). */
typedef {elem} {t} __attribute__((vector_size({lanes * (4 if elem == "float" else 8)})));
{{q}} {t} einjit_load_{short}x{lanes}(const {elem} *p) {{{{
  {t} v;
  memcpy(&v, p, sizeof v);
  return v;
}}}}
{{q}} void einjit_store_{short}x{lanes}({elem} *p, {t} v) {{{{
  memcpy(p, &v, sizeof v);
}}}}
{{q}} {t} einjit_splat_{short}x{lanes}({elem} x) {{{{
  {t} v = {{{{{splat}}}}};
  return v;
}}}}
/* Lane by lane as fma{suffix} rounds: one vector FMA where the CPU has it. */
{{q}} {t} einjit_fma_{short}x{lanes}({t} a, {t} b, {t} c) {{{{
{body}}}}}
"""


def _halves(short: str, lanes: int) -> str:
    t, h = f"einjit_{short}x{lanes}", f"einjit_{short}x{lanes // 2}"
    low = ", ".join(str(k) for k in range(lanes // 2))
    high = ", ".join(str(k) for k in range(lanes // 2, lanes))
    return f"""\
/* The lower and the upper half of a {t}, as a {h}: a lane shuffle where the compiler has
   one (gcc 12, clang), else through memory. */
{{q}} {h} einjit_low_{short}x{lanes}({t} v) {{{{
#if defined(__clang__) || __GNUC__ >= 12
  return __builtin_shufflevector(v, v, {low});
#else
  {h} r;
  memcpy(&r, &v, sizeof r);
  return r;
#endif
}}}}
{{q}} {h} einjit_high_{short}x{lanes}({t} v) {{{{
#if defined(__clang__) || __GNUC__ >= 12
  return __builtin_shufflevector(v, v, {high});
#else
  {h} r;
  memcpy(&r, (const char *)&v + sizeof r, sizeof r);
  return r;
#endif
}}}}
"""


HELPERS = {**{f"vector_{short}x{n}": _helper(short, elem, suffix, n)
              for short, elem, suffix in _ELEMENTS.values() for n in _LANES},
           **{f"vector_halves_{short}x{n}": _halves(short, n)
              for short, _, _ in _ELEMENTS.values() for n in _LANES if n >= 4}}
"""The helpers of each vector type, by name (`helper`), rendered on demand; the halves
(`halves`) sorted after every vector type (`vector_halves_*`), whose halves they return."""


def helper(tn: Tnode) -> str:
    return f"vector_{vector_name(tn)}"


def halves(tn: Tnode) -> list[str]:
    """The helpers a read of half of `tn`'s vectors needs: both vector types, the halves."""
    short, lanes = _ELEMENTS[tn.prec][0], tn.dims[-1]
    return [f"vector_{short}x{lanes}", f"vector_{short}x{lanes // 2}", f"vector_halves_{short}x{lanes}"]


def lane_statement(loop: ll.ForLoop) -> ll.Set | None:
    """The statement of a loop over the lanes of a register block that renders as one vector
    statement, or None. Every block it touches must be indexed by the loop at its last axis
    (only there; a block of twice the loop's lanes may be read by halves, `half`), every other
    array read either contiguously along the loop (the loop's coefficient 1 on the last axis)
    or independently of it, all in the block's precision (a bf16 read only independently of
    it, widened before the broadcast), with constants, FMAs, additions and multiplications
    only; another array it writes is written contiguously."""
    body = list(ll.flatten(loop.body))
    if loop.from_ != 0 or loop.start or loop.stop or len(body) != 1 or not isinstance(body[0], ll.Set):
        return None
    st, lane, lanes = body[0], loop.index, loop.to_ + 1
    accesses: list[ll.Set | ll.Get] = [st, *(x for x in ll.iter_scalars(st.llsc) if isinstance(x, ll.Get))]
    blocks = [x for x in accesses if is_block(x.tn)]
    if not blocks or st.tn.prec is not blocks[0].tn.prec or not vector_ops_only(st.llsc, st.tn.prec, lane):
        return None
    for x in accesses:
        mode = access_mode(x.tn, x.idcs, lane)
        if is_block(x.tn):
            whole = x.idcs[-1] == Iterator(lane) and x.tn.dims[-1] == lanes
            halved = x is not st and x.tn.dims[-1] == 2 * lanes and half(x.tn, x.idcs, lane) is not None
            if mode != "load" or not (whole or halved):
                return None
        elif mode is None or (x is st and mode != "load"):
            return None
    return st


def half(tn: Tnode, idcs: tuple[AxisIndex, ...], lane: Symbol) -> str | None:
    """"low" or "high" where a loop over half of `tn`'s lanes reads them at `lane` or at
    `lane` plus that half (summing a vector's lanes pairwise, `schedule._halved`), else None."""
    if tn.dims[-1] < 4:
        return None
    n = tn.dims[-1] // 2
    match idcs[-1]:
        case Iterator(s) if s == lane:
            return "low"
        case Affine(((1, s),), offset) if s == lane and offset == n:
            return "high"
    return None


def half_name(tn: Tnode, part: str) -> str:
    """`einjit_low_f32x16`: the helper taking half of a vector of `tn`'s block."""
    return f"einjit_{part}_{vector_name(tn)}"


def access_mode(tn: Tnode, idcs: tuple[AxisIndex, ...], lane: Symbol) -> str | None:
    """"load" where `tn[idcs]` runs contiguously along `lane`, "splat" where it does not
    depend on it, None otherwise."""
    if not any(lane in index_symbols(idx) for idx in idcs):
        return "splat"
    if any(lane in index_symbols(idx) for idx in idcs[:-1]):
        return None
    match idcs[-1]:
        case Iterator(s) if s == lane:
            return "load"
        case Affine(terms, _) if dict((s, c) for c, s in terms).get(lane) == 1:
            return "load"
    return None


def at_lane_zero(idcs: Iterable[AxisIndex], lane: Symbol) -> tuple[AxisIndex, ...]:
    """The indices of a vector's first lane."""
    return tuple(subst_index({lane: FixedIdx(0)}, idx) for idx in idcs)
