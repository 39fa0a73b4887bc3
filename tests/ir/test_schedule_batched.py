"""Batched contractions (`ir/sched/schedule_batched.py`): a packed operand that does not depend
on a batch loop is packed once per panel, the batch loop running inside; results stay bit for
bit those of the unscheduled nest, under the interpreter and under gcc on one and two threads."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from einjit.backends.cc import toolchain as cc
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.optimize import VirtualizeSettings
from einjit.ir.sched.cost_model import Tile
from einjit.ir.sched.machine import MACHINES
from einjit.ir.sched.schedule import Blocking, schedule_llc
from einjit.ir.tnode import Tnode
from test_schedule import inputs_for, run_in_c

ON = VirtualizeSettings()


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def batched_dense(batch, rows, depth, cols, *, shared_weight=True):
    """`c[b, t, j] = sum_k w[(b,) j, k] * x[b, t, k]`: the dense layer's `w @ x` over
    `batch, time` (one weight for the batch), or with a weight per batch cell (as `q kᵀ` has
    keys per sequence)."""
    x = Tnode("x", (batch, rows, depth))
    w = Tnode("w", (cols, depth) if shared_weight else (batch, cols, depth))
    c = Tnode("c", (batch, rows, cols))
    b, t, j, k = (get_symbol(s) for s in "btjk")
    w_at = it(j, k) if shared_weight else it(b, j, k)
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(w, w_at), ll.Get(x, it(b, t, k)), ll.Get(c, it(b, t, j)))
    body = ll.Set(c, it(b, t, j), fma)
    for s, n in reversed([(b, batch), (t, rows), (j, cols), (k, depth)]):
        body = ll.ForLoop(s, 0, n - 1, body)
    return ll.seq(ll.ZeroOut(c), body), x, w, c, b


def loops_around_packing(code, pack_label="pack"):
    """The loop symbols enclosing each assignment that fills a packed panel."""
    found: list[list] = []

    def walk(stmt, enclosing):
        for s in ll.flatten(stmt):
            match s:
                case ll.ForLoop():
                    walk(s.body, [*enclosing, s.index])
                case ll.Set(tn, _, _, _) if tn.label[0] == pack_label:
                    found.append(enclosing)
    walk(code, [])
    return found


def check_bit_identical(code, sched, ins, out):
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[out]
    np.testing.assert_array_equal(interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[out], want)
    for threads in (1, 2):
        got = run_in_c(sched, ins, name="batched", options=cc.CcOptions(threads=threads)).array(out)
        np.testing.assert_array_equal(got, want)
    return want


TINY_L1 = dataclasses.replace(MACHINES["avx512"], l1_bytes=256)
"""A machine whose L1 holds no 8-deep panel: the batch loop goes inside each panel."""


@pytest.mark.parametrize("tile", [None, Tile(4, 8, 3)], ids=["model", "k-chunks"])
@pytest.mark.parametrize("threaded", [False, True])
def test_a_weight_shared_by_the_batch_is_packed_once_per_panel(tile, threaded):
    """13 rows and 40 columns leave tail rows and a padded tail panel; `Tile(4, 8, 3)` also
    chunks the 8-deep sum. The batch loop runs inside every panel (on threads when the nest
    is large enough), and no packing runs inside it."""
    code, x, w, c, b = batched_dense(3, 13, 8, 40)
    blocking = Blocking(min_work=1, min_unroll_work=1, tile=tile, parallel_min_work=1 if threaded else 1 << 40,
                        machine=TINY_L1)
    sched = schedule_llc(code, ON, blocking)
    around = loops_around_packing(sched)
    assert around and all(b not in enclosing for enclosing in around)
    batch_loops = [s for s in ll.iter_stmts(sched) if isinstance(s, ll.ForLoop) and s.index == b]
    assert len(batch_loops) >= 2  # one per panel (and per k chunk)
    # on threads: a loop of several panels (each thread packing its own), or the batch loop
    # of a lone panel; never one inside another
    parallel = [s for s in ll.iter_stmts(sched) if isinstance(s, ll.ForLoop) and s.parallel]
    assert bool(parallel) == threaded
    assert all((lp.index == b) != bool(loops_around_packing(lp.body)) for lp in parallel)
    assert not any(inner.parallel for lp in parallel for inner in ll.iter_stmts(lp.body)
                   if isinstance(inner, ll.ForLoop))
    ins = inputs_for(x, w)
    want = check_bit_identical(code, sched, ins, c)
    ref = np.einsum("jk,btk->btj", ins[w].astype(np.float64), ins[x].astype(np.float64))
    np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-5)


def test_a_packed_operand_that_depends_on_the_batch_keeps_the_batch_loop_outside():
    """`q kᵀ` has keys per sequence: each batch cell packs its own panel, as before."""
    code, x, w, c, b = batched_dense(3, 13, 8, 40, shared_weight=False)
    sched = schedule_llc(code, ON, Blocking(min_work=1, min_unroll_work=1))
    around = loops_around_packing(sched)
    assert around and all(enclosing[0] == b for enclosing in around)
    check_bit_identical(code, sched, inputs_for(x, w), c)


def test_the_generated_c_packs_before_the_batch_loop():
    code, *_ = batched_dense(2, 12, 16, 32)
    src = cc.compile_proc(schedule_llc(code, ON, Blocking(min_work=1, machine=TINY_L1)), name="packed_once").source
    body = src[src.index("void packed_once("):]
    assert body.index("pack a panel") < body.index("for (int b")
    assert body.count("pack a panel") == 1


@pytest.mark.parametrize(("machine", "tile", "threaded"),
                         [("avx512", None, False), ("avx2", None, True), ("avx512", Tile(4, 8, 3), True),
                          ("avx2", Tile(4, 8, 3), False)],
                         ids=["avx512-model", "avx2-model-threads", "avx512-k-chunks-threads", "avx2-k-chunks"])
def test_small_panels_are_all_packed_before_the_batch_loop(machine, tile, threaded):
    """Panels that all fit the L2 (each one half the L1) are packed before the batch loop,
    which runs once around every panel's row blocks (once per k chunk): each batch cell's rows
    are read once, not once per panel. 13 rows and 40 columns leave tail rows and a padded
    tail panel (its zero columns packed too); `Tile(4, 8, 3)` chunks the 8-deep sum."""
    code, x, w, c, b = batched_dense(3, 13, 8, 40)
    blocking = Blocking(min_work=1, min_unroll_work=1, tile=tile, parallel_min_work=1 if threaded else 1 << 40,
                        machine=MACHINES[machine])
    sched = schedule_llc(code, ON, blocking)
    around = loops_around_packing(sched)
    assert around and all(b not in enclosing for enclosing in around)
    batch_loops = [s for s in ll.iter_stmts(sched) if isinstance(s, ll.ForLoop) and s.index == b]
    assert len(batch_loops) == (1 if tile is None else 2)  # the 3-step chunks' loop and the 2-step tail chunk
    assert not any(loops_around_packing(lp.body) for lp in batch_loops)
    assert [lp.parallel for lp in batch_loops] == [threaded] * len(batch_loops)
    packs = {tn for tn in ll.nodes_of(sched) if tn.label[0] == "pack"}
    n_panels = math.ceil(40 / (tile.nb if tile else (32 if machine == "avx512" else 16)))
    assert [tn.dims[0] for tn in packs] == [n_panels]
    ins = inputs_for(x, w)
    want = check_bit_identical(code, sched, ins, c)
    ref = np.einsum("jk,btk->btj", ins[w].astype(np.float64), ins[x].astype(np.float64))
    np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-5)


def test_a_panel_that_fills_the_l1_keeps_the_batch_loop_inside_it():
    """512 steps of 16 columns are the whole 32 KiB L1 of an AVX2 core: the panel-by-panel order
    keeps it there while the batches stream past; the weight packed per panel."""
    code, *_ = batched_dense(2, 12, 512, 32)
    sched = schedule_llc(code, ON, Blocking(min_work=1, machine=MACHINES["avx2"]))
    packs = [tn for tn in ll.nodes_of(sched) if tn.label[0] == "pack"]
    assert [tn.dims for tn in packs] == [(512, 16)]


@pytest.mark.parametrize("machine", [TINY_L1, MACHINES["avx2"]], ids=["per-panel", "all-panels"])
def test_the_k_chunks_of_a_lone_panel_stay_serial_on_threads(machine):
    """One 8-column panel in 3-step chunks, on threads: only the batch loop takes them, never
    the chunk loop, whose steps add into the same cells in turn."""
    code, x, w, c, b = batched_dense(3, 13, 8, 8)
    blocking = Blocking(min_work=1, min_unroll_work=1, tile=Tile(4, 8, 3), parallel_min_work=1, machine=machine)
    sched = schedule_llc(code, ON, blocking)
    assert {lp.index for lp in ll.iter_stmts(sched) if isinstance(lp, ll.ForLoop) and lp.parallel} == {b}
    check_bit_identical(code, sched, inputs_for(x, w), c)
