"""Transposing copies as 8x8 blocks in vector registers: how the C renderer writes the
scheduler's transposing panel packs.

A contraction whose column operand is contiguous along the summed axis (the attention's
`q kᵀ` and `dY vᵀ`, a layer's `w @ x` weight) packs each panel of it transposed:

    for jr in 0..15:  for i in 0..31:  pack[i * 16 + jr] = k[(16*jp + jr) * 128 + i]

The loads run along `i`, the stores along `jr`: gcc vectorizes neither side (AVX2 has no
scatter) and copies one float at a time, a quarter of the attention's `q kᵀ` nest (64 x 64 x 32
per head, K packed per head). Here a nest of two loops whose one statement copies a float
array into another, contiguous along the inner loop where it reads and along the outer loop
where it writes, both extents whole multiples of 8, renders as 8x8 blocks: eight row loads,
three rounds of shuffles (gcc's `vunpcklps`, `vshufps`, `vperm2f128`), eight column stores.
In a harness the GPT benchmark's `q kᵀ` nest ran 0.16-0.22 ms against 0.22-0.26 ms with the
scalar pack. A copy moves bits: the result is the same as the loops'.
"""

from __future__ import annotations

from dataclasses import dataclass

from einjit.backends.kernel_writer import Writer
from einjit.ir import low_level as ll
from einjit.ir import ops, provenance
from einjit.ir.indexing import Affine, AxisIndex, FixedIdx, Iterator, Symbol
from einjit.ir.tnode import Tnode

__all__ = ["BLOCK", "HELPERS", "Transpose", "kernel", "render"]

BLOCK = 8
"""The side of a transposed block: one AVX2 vector of floats."""


@dataclass(frozen=True)
class Transpose:
    """`outer` and `inner` the nest's loops, `st` its copy; `src_rows` the floats between the
    source rows (a step of `outer`), `dst_rows` those between the destination rows (a step of
    `inner`)."""

    outer: ll.ForLoop
    inner: ll.ForLoop
    st: ll.Set
    src_rows: int
    dst_rows: int


def kernel(loop: ll.ForLoop) -> Transpose | None:
    """`loop` as a transposing copy in 8x8 blocks, or None. The copy must write distinct cells
    (`dst_rows` at least the outer extent), so that the blocks' order cannot matter."""
    inner = _whole(loop)
    if inner is None or not isinstance(inner, ll.ForLoop) or _whole(inner) is None:
        return None
    st = _whole(inner)
    if not (isinstance(st, ll.Set) and isinstance(st.llsc, ll.Get) and st.llsc.tn is not st.tn
            and st.tn.prec is ops.single and st.llsc.tn.prec is ops.single):
        return None
    src, dst = _offsets(st.llsc.tn, st.llsc.idcs), _offsets(st.tn, st.idcs)
    if src is None or dst is None:
        return None
    a, b = loop.index, inner.index
    if src.get(b) != 1 or dst.get(a) != 1:
        return None
    src_rows, dst_rows = src.get(a, 0), dst.get(b, 0)
    if src_rows < 1 or dst_rows < loop.to_ + 1:
        return None
    return Transpose(loop, inner, st, src_rows, dst_rows)


def render(w: Writer, t: Transpose, names: tuple[str, str], indent: str) -> list[str]:
    """The nest as loops over 8x8 blocks (`names`: the C names of its loops' counters), each
    one `einjit_transpose_f32x8` call at the block's first cell; the block's other cells are
    those of the loops' next 7 steps, in bounds."""
    w.helpers |= {"vector_f32x8", "vector_f32x8_transpose"}
    a, b = t.outer, t.inner
    src = t.st.llsc
    assert isinstance(src, ll.Get)  # `kernel` matched a copy
    w.loops[a.index], w.loops[b.index] = (a.from_, a.to_), (b.from_, b.to_)
    try:
        dst_at = f"&{w.node_name(t.st.tn, written=True)}[{w.index(t.st.tn, t.st.idcs, 'write')}]"
        src_at = f"&{w.node_name(src.tn)}[{w.index(src.tn, src.idcs, 'read')}]"
    finally:
        del w.loops[a.index], w.loops[b.index]
    note = f" /* {t.st.debug}, {BLOCK}x{BLOCK} blocks */" if t.st.debug else ""
    outer, inner = names
    return [f"{indent}for ({w.index_type} {outer} = 0; {outer} < {a.to_ + 1}; {outer} += {BLOCK}) {{",
            f"{indent}  for ({w.index_type} {inner} = 0; {inner} < {b.to_ + 1}; {inner} += {BLOCK}) {{",
            f"{indent}    einjit_transpose_f32x8({dst_at}, {t.dst_rows}, {src_at}, {t.src_rows});{note}",
            f"{indent}  }}",
            f"{indent}}}"]


def _whole(loop: ll.ForLoop) -> ll.LLStmt | None:
    """The one statement of a loop over `0..8k-1` that runs in order on one thread, or None."""
    if (loop.from_ != 0 or (loop.to_ + 1) % BLOCK or loop.start or loop.stop or loop.parallel
            or loop.unroll or loop.keep_order):
        return None
    body = [s for s in ll.flatten(loop.body) if not isinstance(s, (ll.Comment, ll.Noop))]
    return body[0] if len(body) == 1 else None


def _offsets(tn: Tnode, idcs: tuple[AxisIndex, ...]) -> dict[Symbol, int] | None:
    """Each loop symbol's coefficient in the row-major flat index of `tn[idcs]`; None for an
    index that is not affine (a gather, a sub-axis) or a register block (`c_vectors`)."""
    if tn.provenance == provenance.REGISTER_BLOCK:
        return None
    out: dict[Symbol, int] = {}
    for idx, stride in zip(idcs, ll.row_major_strides(tn.dims), strict=True):
        match idx:
            case FixedIdx():
                pass
            case Iterator(s):
                out[s] = out.get(s, 0) + stride
            case Affine(terms, _):
                for c, s in terms:
                    out[s] = out.get(s, 0) + c * stride
            case _:
                return None
    return out


def _helper() -> str:
    """The C of `einjit_transpose_f32x8`, unrolled (gcc -O2 keeps the 24 vectors in registers)."""
    lo, hi = "0, 8, 1, 9, 4, 12, 5, 13", "2, 10, 3, 11, 6, 14, 7, 15"
    pairs_lo, pairs_hi = "0, 1, 8, 9, 4, 5, 12, 13", "2, 3, 10, 11, 6, 7, 14, 15"
    halves_lo, halves_hi = "0, 1, 2, 3, 8, 9, 10, 11", "4, 5, 6, 7, 12, 13, 14, 15"
    lines = [f"  einjit_f32x8 r{k} = einjit_load_f32x8(src + {k} * src_rows);" for k in range(BLOCK)]
    for k in range(0, BLOCK, 2):
        lines += [f"  einjit_f32x8 t{k} = EINJIT_SHUFFLE_F32X8(r{k}, r{k + 1}, {lo});",
                  f"  einjit_f32x8 t{k + 1} = EINJIT_SHUFFLE_F32X8(r{k}, r{k + 1}, {hi});"]
    for k in range(0, BLOCK, 4):
        for j, (a, b) in enumerate(((k, k + 2), (k + 1, k + 3))):
            lines += [f"  einjit_f32x8 u{k + 2 * j} = EINJIT_SHUFFLE_F32X8(t{a}, t{b}, {pairs_lo});",
                      f"  einjit_f32x8 u{k + 2 * j + 1} = EINJIT_SHUFFLE_F32X8(t{a}, t{b}, {pairs_hi});"]
    for k in range(BLOCK // 2):
        lines += [f"  einjit_store_f32x8(dst + {k} * dst_rows, EINJIT_SHUFFLE_F32X8(u{k}, u{k + 4}, {halves_lo}));",
                  f"  einjit_store_f32x8(dst + {k + 4} * dst_rows, EINJIT_SHUFFLE_F32X8(u{k}, u{k + 4}, {halves_hi}));"]
    body = "\n".join(lines).replace("{", "{{").replace("}", "}}")
    return f"""\
/* An 8x8 block of floats transposed in vector registers: row r of `src` (rows `src_rows`
   floats apart) becomes column r of `dst` (rows `dst_rows` apart). */
#ifdef __clang__
#define EINJIT_SHUFFLE_F32X8(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
typedef int einjit_i32x8 __attribute__((vector_size(32)));
#define EINJIT_SHUFFLE_F32X8(a, b, ...) __builtin_shuffle(a, b, (einjit_i32x8){{{{__VA_ARGS__}}}})
#endif
{{q}} void einjit_transpose_f32x8(float *dst, long dst_rows, const float *src, long src_rows) {{{{
{body}
}}}}
"""


HELPERS = {"vector_f32x8_transpose": _helper()}
"""The block transpose, after the `einjit_f32x8` helpers it uses (helpers render sorted by name)."""
