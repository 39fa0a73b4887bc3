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
compiler targets AVX512_BF16 (`backends.bf16_dot`). Only even extents of one summed loop take
the layout (a pair never straddles a chunk, and there is no odd tail), and only panels of whole
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


def applies(a_op: ll.LLScalar, b_op: ll.LLScalar, n_summed: int, kc: int, depth: int, nb: int,
            machine: Machine) -> bool:
    """Whether a contraction of `a_op * b_op` over `n_summed` loops, chunked by `kc` of the
    outermost one's `depth`, in panels of `nb` columns, packs bf16 pairs: on a machine with the
    dot product, both operands plain bf16 reads (the pairs are then exact copies), one summed
    loop, even chunks, whole vectors."""
    return (machine.bf16_dot and _bf16_read(a_op) and _bf16_read(b_op) and n_summed == 1
            and kc % 2 == 0 and depth % 2 == 0 and nb % LANES == 0)


def pack(kc: int, nb: int) -> Tnode:
    """The panel of `kc` summed indices by `nb` columns, as `kc / 2` rows of `nb` pairs."""
    return nests.scheduler_local("pack", (kc // 2, nb, 2), ops.bf16)


def pack_at(kp: Symbol, b: Symbol, kl: Symbol) -> tuple[AxisIndex, ...]:
    return Iterator(kp), Iterator(b), Iterator(kl)


def k_loops(kp: Symbol, kl: Symbol, depth: int) -> list[tuple[Symbol, int]]:
    return [(kp, depth // 2), (kl, 2)]


def k_terms(kp: Symbol, kl: Symbol) -> list[tuple[int, Symbol]]:
    """The summed index within a chunk: pair `kp`, member `kl`."""
    return [(2, kp), (1, kl)]
