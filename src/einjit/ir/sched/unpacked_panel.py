"""Whether a weight gradient's column panels are read where they lie instead of packed.

A weight gradient `w.grad[n, k] += sum_r dy[r, n] * x[r, k]` sums over many rows (the GPT step's
1024 = batch x time), so one column panel of `x` (`kc` rows of `nb` columns) overflows the L1
and streams from the L2 for every row block, packed or not: the pack buys a sequential stream
instead of a strided one, and costs a copy of the operand that runs alone before the first
FMA, often reading its operand cold (an activation the forward wrote). Where `x`'s rows are
short (at most `MAX_ROW_BYTES` apart) the strided stream spreads over enough L1 sets for the
hardware prefetcher to run ahead of the kernel, and the copy is pure cost. On this Zen 4 (the
GPT step's nests in C alone, best of 100 calls): the attention projections' 128 x 128 over
1024 rows took 0.288-0.293 ms in place against 0.297-0.299 packed with the operands in the L3,
0.314-0.336 against 0.336-0.367 from DRAM; the MLP fc's 512 x 128 the same either way. Rows
2 KiB apart (the MLP proj's 512-wide input) map each panel's lines to a few L1 sets, whose
lines the prefetched ones evict before the kernel reads them: 128 x 512 in place took 1.52 ms
from DRAM against 1.38 packed, so those stay packed.
"""

from __future__ import annotations

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import Symbol
from einjit.ir.sched.cost_model import Machine

__all__ = ["MAX_ROW_BYTES", "reads_in_place", "step_bytes"]

MAX_ROW_BYTES = 512
"""The widest step along the summed loop at which the panel is read in place: 128 floats, rows
eight lines apart, whose lines at one column fall in 8 of a 32 KiB 8-way L1's 64 sets (2 KiB
apart: in 2 of them)."""


def step_bytes(get: ll.Get, s: Symbol) -> int:
    """How many bytes one step of the loop `s` moves the read `get` by; 0 for a read indexed at
    run time (never read in place)."""
    coeffs = ll.flat_coefficients(get.tn, get.idcs) or {}
    return abs(coeffs.get(s, 0)) * get.tn.prec.itemsize


def reads_in_place(b_op: ll.LLScalar, k: Symbol, prec: ops.Prec, panel_bytes: int, machine: Machine) -> bool:
    """Whether the panel operand `b_op` (unit-stride along the columns, stepping along the
    innermost summed loop `k`) of a weight gradient is read where it lies: a plain read in the
    block's precision (nothing to widen or compute while packing) whose rows are at most
    `MAX_ROW_BYTES` apart, a panel of `panel_bytes` that would not stay in half the L1 anyway,
    on a machine that reads the row operand in place too (`Machine.row_pack` off: its block
    steps are long enough for the prefetcher)."""
    if machine.row_pack or not isinstance(b_op, ll.Get) or b_op.tn.prec is not prec:
        return False
    return panel_bytes > machine.l1_bytes // 2 and 0 < step_bytes(b_op, k) <= MAX_ROW_BYTES
