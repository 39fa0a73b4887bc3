"""The panel layout of bf16 contractions on CPUs with a bf16 dot product (AVX512_BF16).

`vdpbf16ps` multiplies 16 *pairs* of bf16 numbers by 16 other pairs and adds each pair's two
products into one float lane. A contraction `c[i, j] += A(i, k) * B(j, k)` with bf16 operands
therefore packs B's panel with two consecutive `k` side by side for every column,
`pack[k / 2, j, k % 2]`, so that one 64-byte load holds the pairs of 16 columns; the other
operand's pair `A(i, k), A(i, k + 1)` is broadcast to every lane. The summed loop runs over
pairs (`kp`) and the member of a pair (`kl`); the accumulators stay float.

In the low-level IR this is still the scalar update `acc[a, b] := fma(A(.., 2*kp + kl),
pack[kp, b, kl], acc[a, b])`, which the interpreter runs and every C compiler compiles (the
fp32 fallback); the C renderer turns that nest into `_mm512_dpbf16_ps` calls where the
compiler targets AVX512_BF16 (`backends.bf16_dot`). The pairs run along the innermost summed
loop: with several (a weight gradient of a sequence model sums over batch and time), the
outermost is chunked as in float and the pairs are two steps of the innermost, the panel
holding `pack[k.., kp, j, kl]`. Only even extents take the layout (a pair never straddles a
chunk, and there is no odd tail), and only panels of whole
16-float vectors: a narrower register block (8 lanes, as a 10-column output takes) has no
`vdpbf16ps` kernel, and its pair nest ran as the scalar fallback, bf16 widened at every
multiply-add (the MLP's 256 x 256 by 10 logits at 3.6 GFLOP/s, 0.56 ms against float's 0.01 ms
on a Zen 4 core). Other contractions keep the float panel, into which bf16 operands are widened
while packing.
"""

from __future__ import annotations

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import AxisIndex, Iterator, Symbol
from einjit.ir.sched import nests
from einjit.ir.sched.cost_model import Machine
from einjit.ir.tnode import Tnode

__all__ = ["LANES", "applies", "k_loops", "k_terms", "pack", "pack_at"]

LANES = 16
"""Float lanes of one `vdpbf16ps` (a 512-bit vector): a pair panel's width is a multiple."""


def _bf16_read(sc: ll.LLScalar) -> bool:
    return isinstance(sc, ll.Get) and sc.tn.prec is ops.bf16


def applies(a_op: ll.LLScalar, b_op: ll.LLScalar, extents: tuple[int, ...], kc: int, nb: int,
            machine: Machine) -> bool:
    """Whether a contraction of `a_op * b_op` over summed loops of `extents` (outermost first),
    the outermost chunked by `kc`, in panels of `nb` columns, packs bf16 pairs: on a machine
    with the dot product, both operands plain bf16 reads (the pairs are then exact copies),
    whole vectors, and pairs that never straddle a chunk: an even innermost extent, and with
    one summed loop, even chunks."""
    if not (machine.bf16_dot and _bf16_read(a_op) and _bf16_read(b_op) and nb % LANES == 0):
        return False
    if len(extents) == 1:
        return kc % 2 == 0 and extents[0] % 2 == 0
    return extents[-1] % 2 == 0


def pack(outer: tuple[int, ...], depth: int, nb: int) -> Tnode:
    """The panel of the `outer` summed indices (the chunk and the loops between it and the
    paired one; none with one summed loop) by `depth` paired indices by `nb` columns, holding
    `depth / 2` rows of `nb` pairs for each outer index."""
    return nests.scheduler_local("pack", (*outer, depth // 2, nb, 2), ops.bf16)


def pack_at(outer: list[Symbol], kp: Symbol, b: Symbol, kl: Symbol) -> tuple[AxisIndex, ...]:
    return *(Iterator(s) for s in outer), Iterator(kp), Iterator(b), Iterator(kl)


def k_loops(outer: list[tuple[Symbol, int]], kp: Symbol, kl: Symbol, depth: int) -> list[tuple[Symbol, int]]:
    return [*outer, (kp, depth // 2), (kl, 2)]


def k_terms(kp: Symbol, kl: Symbol) -> list[tuple[int, Symbol]]:
    """The paired summed index (within a chunk, with one summed loop): pair `kp`, member `kl`."""
    return [(2, kp), (1, kl)]
