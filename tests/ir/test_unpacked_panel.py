"""Weight gradients whose panel operand is read where it lies (`sched/unpacked_panel.py`): on
AVX-512, when the panel overflows half the L1 and the operand's rows are at most 512 bytes
apart, nothing is packed, and the results are still bit for bit those of the unscheduled code
(the interpreter and gcc, 1 and 2 threads); rows 2 KiB apart, tail panels, AVX2 (rows packed)
and panels that stay in the L1 keep the pack."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from einjit.backends.cc import toolchain as cc
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, get_symbol
from einjit.ir.sched import unpacked_panel
from einjit.ir.sched.machine import MACHINES
from einjit.ir.sched.schedule import Blocking, schedule_llc
from einjit.ir.tnode import Tnode
from test_schedule import OFF, inputs_for, it, local_nodes, run_in_c
from test_schedule_weight_grads import check_on_threads, head_weight_grad, weight_grad

SMALL_L1 = dataclasses.replace(MACHINES["avx512"], l1_bytes=8 << 10)
"""AVX-512 with an 8 KiB L1: the tests' small nests overflow half of it as the GPT step's
1024-row panels overflow half of 32 KiB."""


def packs(code) -> bool:
    return "pack" in local_nodes(code)


@pytest.mark.parametrize("shape,prec", [((4, 24, 37, 64), ops.single), ((3, 50, 16, 32), ops.single),
                                        ((2, 70, 29, 128), ops.single), ((4, 24, 37, 64), ops.double),
                                        ((3, 50, 16, 32), ops.double)], ids=str)
def test_short_rows_are_read_in_place_and_bit_identical(shape, prec):
    """64, 32 and 128 float columns, 64 and 32 double ones (rows 128-512 bytes apart), row
    tails (37 and 29 rows), on threads: no pack, the unscheduled code's bits."""
    code, x, dy, w = weight_grad(*shape, prec=prec)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, parallel_min_work=1, machine=SMALL_L1))
    assert not packs(sched), ll.to_doc(sched)[:600]
    ins = inputs_for(x, dy, seed=shape[2])
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[w]
    got = interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[w]
    np.testing.assert_array_equal(got, want)
    check_on_threads(code, sched, x, dy, w, seed=shape[2])


def test_a_head_axis_reads_its_panels_in_place_and_is_exact():
    """`w[h, r, j] += Σ_bt x[b, t, h, r] · dy[b, t, j]` (the attention projections' weight
    gradients, the head a batch loop outside the panels): no pack, bit for bit the unscheduled
    C at 1 and 2 threads."""
    code, x, dy, w = head_weight_grad(5, 40, 3, 13, 64)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, parallel_min_work=1, machine=SMALL_L1))
    assert not packs(sched), ll.to_doc(sched)[:600]
    ins = inputs_for(x, dy, seed=5)
    want = run_in_c(code, ins, name="plain").array(w).copy()
    for threads in (1, 2):
        got = run_in_c(sched, ins, name="wgrad_heads", options=cc.CcOptions(threads=threads)).array(w)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[w], want)
    ref = np.einsum("bthr,btj->hrj", ins[x].astype(np.float64), ins[dy].astype(np.float64))
    np.testing.assert_allclose(want, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("machine,shape", [(SMALL_L1, (3, 50, 16, 512)), (SMALL_L1, (3, 50, 16, 40)),
                                           (MACHINES["avx512"], (3, 20, 16, 64)),
                                           (dataclasses.replace(MACHINES["avx2"], l1_bytes=8 << 10), (3, 50, 16, 64))],
                         ids=["rows-2KiB-apart", "tail-panel", "panel-in-l1", "avx2"])
def test_the_others_keep_their_pack(machine, shape):
    """Rows 2 KiB apart (the MLP proj's 512-wide input: two L1 sets per line of a block), a
    padded tail panel, a panel that stays in half the L1, and AVX2 (`Machine.row_pack`) pack."""
    code, x, dy, w = weight_grad(*shape)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, machine=machine))
    assert packs(sched), ll.to_doc(sched)[:600]
    check_on_threads(code, sched, x, dy, w, seed=shape[3])


def test_step_bytes_counts_every_axis_the_loop_moves():
    """A row of 128 floats, 96 doubles, an affine index stepping by two rows, a loop the read
    does not use."""
    b, t, j = (get_symbol(s) for s in "btj")
    x = Tnode("x", (4, 16, 128), ops.single)
    assert unpacked_panel.step_bytes(ll.Get(x, it(b, t, j)), t) == 512
    assert unpacked_panel.step_bytes(ll.Get(x, it(b, t, j)), b) == 16 * 512
    assert unpacked_panel.step_bytes(ll.Get(Tnode("y", (9, 96), ops.double), it(t, j)), t) == 768
    two_rows = ll.Get(x, (it(b)[0], Affine(((2, t),), 1), it(j)[0]))
    assert unpacked_panel.step_bytes(two_rows, t) == 1024
    assert unpacked_panel.step_bytes(ll.Get(x, it(b, t, j)), get_symbol("k")) == 0
