"""Weight gradients `w.grad[i, j] += Σ_bt x[b, t, i] · dy[b, t, j]` (`xᵀ·dy`): the row operand
steps along the summed loops by a whole row, so on AVX2 the scheduler packs its rows too
(`apack`, `Machine.row_pack`) and cuts the summed loop into chunks that keep the panel in L1 and
the packed rows in L2; on AVX-512 the rows are read where they lie and the chunks keep only the
panels in L2. Nothing is reassociated: the scheduled code gives, bit for bit, what the
unscheduled code gives, under the interpreter and gcc, for the AVX2 and the AVX-512
descriptions, with tails everywhere."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from einjit.backends.cc import toolchain as cc
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import get_symbol
from einjit.ir.sched import cost_model
from einjit.ir.sched.cost_model import Shape, Tile
from einjit.ir.sched.machine import MACHINES
from einjit.ir.sched.schedule import Blocking, schedule_llc
from einjit.ir.tnode import Tnode
from test_schedule import OFF, inputs_for, it, local_nodes, run_in_c


def weight_grad(batch, time, rows, cols, prec=ops.single):
    """`w =+ x * dy` summed over `batch, time`, in the order lowering emits (i, j, b, t)."""
    x, dy = Tnode("x", (batch, time, rows), prec), Tnode("dy", (batch, time, cols), prec)
    w = Tnode("w", (rows, cols), prec)
    b, t, i, j = (get_symbol(s) for s in "btij")
    body: ll.LLStmt = ll.Set(w, it(i, j), ll.Ternop(ops.Ternop.FMA, ll.Get(x, it(b, t, i)), ll.Get(dy, it(b, t, j)),
                                                    ll.Get(w, it(i, j))), "w =+ x * dy")
    for s, n in reversed([(i, rows), (j, cols), (b, batch), (t, time)]):
        body = ll.ForLoop(s, 0, n - 1, body)
    return ll.seq(ll.ZeroOut(w), body), x, dy, w


def head_weight_grad(batch, time, heads, rows, cols):
    """`w[h, r, j] =+ x[b, t, h, r] * dy[b, t, j]` summed over `batch, time`: an attention
    projection's weight gradient, split by heads (lowering's order h, r, j, b, t)."""
    x, dy = Tnode("x", (batch, time, heads, rows), ops.single), Tnode("dy", (batch, time, cols), ops.single)
    w = Tnode("w", (heads, rows, cols), ops.single)
    b, t, h, r, j = (get_symbol(s) for s in "bthrj")
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(x, it(b, t, h, r)), ll.Get(dy, it(b, t, j)), ll.Get(w, it(h, r, j)))
    body: ll.LLStmt = ll.Set(w, it(h, r, j), fma, "w =+ x * dy")
    for s, n in reversed([(h, heads), (r, rows), (j, cols), (b, batch), (t, time)]):
        body = ll.ForLoop(s, 0, n - 1, body)
    return ll.seq(ll.ZeroOut(w), body), x, dy, w


def reference(ins, x, dy):
    xs, dys = (ins[tn].astype(np.float64).reshape(-1, tn.dims[-1]) for tn in (x, dy))
    return xs.T @ dys


def chunking(machine):
    """The machine's description, AVX-512's with a 128 KiB L2: it chunks the summed loop only
    for the panels' room in the L2, which the tests' small nests would not fill."""
    return MACHINES[machine] if machine == "avx2" else dataclasses.replace(MACHINES[machine], l2_bytes=128 << 10)


def check_on_threads(code, sched, x, dy, w, seed):
    """The scheduled nest at 1 and 2 threads gives the unscheduled C's bits, and those are
    the float64 sums."""
    ins = inputs_for(x, dy, seed=seed)
    want = run_in_c(code, ins, name="plain").array(w).copy()
    for threads in (1, 2):
        got = run_in_c(sched, ins, name="wgrad", options=cc.CcOptions(threads=threads)).array(w)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(want, reference(ins, x, dy), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
@pytest.mark.parametrize("prec", [ops.single, ops.double], ids=["f32", "f64"])
@pytest.mark.parametrize("shape,tile", [((2, 5, 13, 40), Tile(6, 16, 1)), ((3, 4, 7, 33), Tile(5, 8, 2)),
                                        ((1, 9, 20, 17), Tile(4, 16, 1)), ((5, 3, 6, 64), Tile(1, 32, 3))])
def test_packed_rows_are_bit_identical_under_the_interpreter_and_gcc(machine, prec, shape, tile):
    code, x, dy, w = weight_grad(*shape, prec=prec)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, min_unroll_work=1, machine=MACHINES[machine], tile=tile))
    assert ("apack" in local_nodes(sched)) == MACHINES[machine].row_pack
    ins = inputs_for(x, dy, seed=sum(shape))
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[w]
    got = interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[w]
    np.testing.assert_array_equal(got, want)
    for threads in (1, 2):
        in_c = run_in_c(sched, ins, name="wgrad", options=cc.CcOptions(threads=threads)).array(w)
        if prec is ops.double:
            # the interpreter rounds a double multiply-add twice, gcc's fma once
            np.testing.assert_allclose(in_c, want, rtol=1e-14, atol=1e-14)
        else:
            np.testing.assert_array_equal(in_c, want)
    np.testing.assert_allclose(want, reference(ins, x, dy), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
@pytest.mark.parametrize("shape", [(18, 64, 96, 72), (3, 345, 37, 50)])
def test_long_reductions_chunk_and_match_the_unscheduled_c(machine, shape):
    """A 1152- and a 1035-long reduction, as the cost model tiles them for the machine: chunks
    of the summed loop (the last one shorter), a tail panel and tail rows, the larger one on
    two threads (each packing its own panels, all reading the rows packed before them); bit
    for bit what the unscheduled C computes. AVX-512 chunks only for the panels' room in the
    L2: its description gets a 128 KiB one, for these nests to chunk as larger ones do."""
    code, x, dy, w = weight_grad(*shape)
    blocking = Blocking(machine=chunking(machine))
    sched = schedule_llc(code, OFF, blocking)
    doc = ll.to_doc(sched)
    assert ("apack" in local_nodes(sched)) == blocking.machine.row_pack and "-step k chunks" in doc, doc[:400]
    check_on_threads(code, sched, x, dy, w, seed=shape[0])


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
def test_a_weight_gradient_with_a_head_axis_is_chunked_and_exact(machine):
    """`w[h, r, j] += Σ_bt x[b, t, h, r] · dy[b, t, j]` (an attention projection's weight split
    by heads): the head is a batch loop, so the rows are not packed, but the 1088-long summed
    loop still comes in chunks (AVX2: 0.50-0.57 ms before, 0.43 ms after, for 16 x 64 x 4 x 32
    x 128 on the shared znver3; AVX-512 where the panels would not fit in half its L2, the
    smaller one of `chunking`); bit for bit the unscheduled C."""
    code, x, dy, w = head_weight_grad(17, 64, 3, 13, 40)
    sched = schedule_llc(code, OFF, Blocking(machine=chunking(machine)))
    assert "-step k chunks" in ll.to_doc(sched) and "apack" not in local_nodes(sched)
    ins = inputs_for(x, dy, seed=3)
    want = run_in_c(code, ins, name="plain").array(w).copy()
    np.testing.assert_array_equal(run_in_c(sched, ins, name="wgrad").array(w), want)
    ref = np.einsum("bthr,btj->hrj", ins[x].astype(np.float64), ins[dy].astype(np.float64))
    np.testing.assert_allclose(want, ref, rtol=1e-4, atol=1e-4)


def test_chunks_keep_a_panel_in_l1_and_all_the_panels_in_l2():
    """The GPT benchmark's MLP weight gradients (16 x 64 rows summed) on AVX2 (32 KiB L1,
    512 KiB L2): 128 columns take 256-step chunks (a 16-wide panel's 16 KiB in half the L1),
    512 columns 128-step ones (the chunk's panels' 256 KiB in half the L2), whatever the
    rows; without strided rows the panel alone decides (the whole loop)."""
    avx2 = MACHINES["avx2"]
    assert cost_model.k_chunk(Shape(512, 128, 1024, 16, 4, True), 16, avx2) == 4
    assert cost_model.k_chunk(Shape(4096, 128, 1024, 16, 4, True), 16, avx2) == 4
    assert cost_model.k_chunk(Shape(128, 512, 1024, 16, 4, True), 16, avx2) == 2
    assert cost_model.k_chunk(Shape(128, 512, 1024, 16, 4), 16, avx2) == 16


def test_unpacked_rows_chunk_for_the_panels_in_l2_alone():
    """AVX-512 (1 MiB L2) reads the rows where they lie (`Machine.row_pack` off): no panel kept in
    half the L1, so the GPT MLP's 512 x 128 and the 128 x 128 weight gradients take the whole
    summed loop (16 x 64 rows, 512 KiB of 32-wide panels), the 128 x 512 one 4-step chunks (its
    512 columns' 256-step panels fill half the L2), however many steps there are."""
    avx512 = MACHINES["avx512"]
    assert not avx512.row_pack and MACHINES["avx2"].row_pack
    assert cost_model.k_chunk(Shape(512, 128, 1024, 16, 4, True), 32, avx512) == 16
    assert cost_model.k_chunk(Shape(128, 128, 1024, 16, 4, True), 32, avx512) == 16
    assert cost_model.k_chunk(Shape(128, 512, 1024, 16, 4, True), 32, avx512) == 4
    assert cost_model.k_chunk(Shape(128, 512, 4096, 64, 4, True), 32, avx512) == 4


def test_one_panel_reads_its_rows_once_and_packs_none():
    """With a single column panel every row of A is read once anyway: no row packing."""
    code, x, dy, w = weight_grad(2, 8, 12, 16)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, machine=MACHINES["avx2"], tile=Tile(6, 16, 2)))
    assert local_nodes(sched) == {"pack", "acc"}
    ins = inputs_for(x, dy)
    np.testing.assert_array_equal(run_in_c(sched, ins, name="wgrad").array(w), run_in_c(code, ins).array(w))


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
@pytest.mark.parametrize("shape", [(4, 300, 37, 100), (2, 10, 13, 40), (3, 40, 50, 20)])
def test_row_blocks_go_outside_the_panels(machine, shape):
    """B's chunk packed whole (`pack` holds every panel, each a row longer than the chunk's
    steps), then each row block — on AVX2 packing its own rows first (`apack` holds one block)
    — runs against every panel, with more rows than columns too — the 4.4M-multiply-add nest
    with its row blocks on threads, each thread packing its own block. Tail rows, a tail panel,
    chunks of the summed loop; bit for bit the unscheduled C at 1 and 2 threads."""
    code, x, dy, w = weight_grad(*shape)
    blocking = Blocking(machine=MACHINES[machine], min_work=1)
    sched = schedule_llc(code, OFF, blocking)
    packs = {tn.label[0]: tn.dims for tn in ll.nodes_of(sched) if tn.is_local() and tn.label[0] in ("pack", "apack")}
    rows, cols = shape[2:]
    tile = next(iter(cost_model.candidates(Shape(rows, cols, shape[0] * shape[1], shape[0], 4, True),
                                           blocking.nb_choices, blocking.mb_max, blocking.machine)))
    assert packs["pack"] == (-(-cols // tile.nb), tile.kc * shape[1] + 1, tile.nb), packs
    assert packs.get("apack", (0,))[0] == (1 if blocking.machine.row_pack else 0), packs
    check_on_threads(code, sched, x, dy, w, seed=shape[1])


def test_row_blocks_are_as_few_and_as_even_as_the_block_allows():
    """`cost_model.row_blocks`: ceil(rows / mb) blocks whose heights differ by one at most and
    add up to the rows; the GPT step's 128-row weight gradients in 6-row blocks are 18 of 6 and
    4 of 5 (the 2-row tail ran at a third of the FMA rate, in an `omp single` on threads)."""
    assert cost_model.row_blocks(128, 6) == (6, 18, 4)
    assert cost_model.row_blocks(512, 6) == (6, 82, 4)
    assert cost_model.row_blocks(11, 4) == (4, 2, 1)
    assert cost_model.row_blocks(12, 8) == (6, 2, 0)
    for mb in range(1, 10):
        for rows in range(1, 70):
            height, full, short = cost_model.row_blocks(rows, mb)
            assert full * height + short * (height - 1) == rows, (rows, mb)
            assert 1 <= height <= mb and full >= 1 and short >= 0 and full + short == -(-rows // mb), (rows, mb)


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
@pytest.mark.parametrize("shape,tile", [((2, 9, 22, 40), Tile(6, 16, 1)), ((3, 7, 23, 33), Tile(5, 8, 2)),
                                        ((2, 5, 38, 20), Tile(8, 8, 5))])
def test_short_row_blocks_share_out_on_threads_and_are_exact(machine, shape, tile):
    """Rows the block does not divide run as blocks one row shorter, a threaded loop of them
    after the full ones (22 rows: 2 x 6 + 2 x 5; 23: 3 x 5 + 2 x 4; 38: 3 x 8 + 2 x 7), not a
    tail in an `omp single` while the other thread waits: bit for bit the unscheduled C at 1
    and 2 threads, and the interpreter, with and without chunks of the summed loop."""
    code, x, dy, w = weight_grad(*shape)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, min_unroll_work=1, parallel_min_work=1,
                                             machine=MACHINES[machine], tile=tile))
    height, full, short = cost_model.row_blocks(shape[2], tile.mb)
    assert height == tile.mb and full >= 2 and short == 2
    rows = f"the last {short * (height - 1)} of {shape[2]} rows, in {short} blocks of {height - 1}"
    assert f"register-blocked {height}x" in ll.to_doc(sched) and rows in ll.to_doc(sched)
    src = cc.compile_proc(sched, name="short_rows", options=cc.CcOptions(threads=2)).source
    assert re.search(rf"{rows} \*/\n\s*#pragma omp (parallel|for)", src), src
    ins = inputs_for(x, dy, seed=shape[2])
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[w]
    np.testing.assert_array_equal(interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[w], want)
    check_on_threads(code, sched, x, dy, w, seed=shape[2])
