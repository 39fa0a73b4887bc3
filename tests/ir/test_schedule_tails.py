"""Contractions whose extents the tile does not divide (tail panels and rows), k chunks, the
cost model's choices, and threads over column panels with per-thread heap panels: the
scheduled code computes what the unscheduled code computes, bit for bit (nothing here is
reassociated), under the interpreter and under gcc."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from einjit.backends.cc import toolchain as cc
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.sched import cost_model
from einjit.ir.sched.cost_model import Machine, Shape, Tile
from einjit.ir.sched.machine import MACHINES
from einjit.ir.sched.schedule import Blocking, schedule_llc
from test_schedule import OFF, check_exact, contraction_nest, inputs_for, local_nodes, matmul

ANY_SIZE = Blocking(min_work=1, min_unroll_work=1)


AWKWARD = [(2, 7, 40), (9, 1, 33), (13, 17, 31), (7, 5, 63), (17, 3, 65), (31, 11, 97), (33, 29, 10),
           (40, 8, 4), (8, 16, 36)]
"""(rows, summed, columns): 1, primes, and sizes just below and above multiples of 8 and 32."""


@pytest.mark.parametrize("transposed", [False, True], ids=["a@b", "a@b.T"])
@pytest.mark.parametrize("n,m,p", AWKWARD)
def test_awkward_extents_take_the_scheduled_path_exactly(n, m, p, transposed):
    code, a, b, c = matmul(n, m, p, transposed)
    sched = schedule_llc(code, OFF, ANY_SIZE)
    # a padded tail panel's block of vectors is loaded and stored through an edge buffer
    assert local_nodes(sched) - {"edge"} == {"pack", "acc"}
    ins = inputs_for(a, b)
    want = check_exact(code, sched, ins, c)
    ref = ins[a].astype(np.float64) @ (ins[b].T if transposed else ins[b]).astype(np.float64)
    np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-5)


AVX2 = Blocking(min_work=1, min_unroll_work=1, machine=MACHINES["avx2"])


@pytest.mark.parametrize("prec", [ops.single, ops.double], ids=["f32", "f64"])
@pytest.mark.parametrize("transposed", [False, True], ids=["a@b", "a@b.T"])
@pytest.mark.parametrize("n,m,p", [(13, 17, 31), (17, 3, 65), (31, 11, 97), (40, 8, 4), (25, 9, 50)])
def test_avx2_blocks_with_tails_are_exact(n, m, p, transposed, prec):
    """The AVX2 description's 6x16 float (6x8 double) blocks, with tail rows and padded tail
    panels, compute what the unscheduled code computes, under the interpreter and gcc."""
    code, a, b, c = matmul(n, m, p, transposed, prec=prec)
    sched = schedule_llc(code, OFF, AVX2)
    mb, nb = map(int, re.search(r"register-blocked (\d+)x(\d+)", ll.to_doc(sched)).groups())
    assert nb == min(16 if prec is ops.single else 8, 1 << (p.bit_length() - 1))
    vectors = -(-nb // (32 // prec.itemsize))
    assert mb * vectors + vectors + 1 <= 16
    ins = inputs_for(a, b, seed=7)
    want = check_exact(code, sched, ins, c)
    ref = ins[a].astype(np.float64) @ (ins[b].T if transposed else ins[b]).astype(np.float64)
    np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-5)


def _unrolled_loops(stmt: ll.LLStmt) -> int:
    count = 0
    for s in ll.flatten(stmt):
        if isinstance(s, ll.ForLoop):
            count += s.unroll + _unrolled_loops(s.body)
    return count


def test_small_contractions_keep_their_blocks_without_unrolled_rows():
    """Below `min_unroll_work` multiply-adds, with tails, the block rows are not unrolled (gcc's
    time goes into unrolled blocks, which tails repeat); the blocked code and its results stay
    the same."""
    code, a, b, c = matmul(13, 17, 40, True)  # 8840 multiply-adds
    small = schedule_llc(code, OFF, Blocking(min_work=1, min_unroll_work=8841))
    large = schedule_llc(code, OFF, Blocking(min_work=1, min_unroll_work=8840))
    assert _unrolled_loops(small) == 0 and _unrolled_loops(large) > 0
    assert local_nodes(small) == local_nodes(large) == {"pack", "acc", "edge"}

    def loops(code: ll.LLStmt) -> list[str]:
        text = re.sub(r"(?<=[a-z])_?\d+\b", "", ll.to_doc(code).replace(" (unrolled)", ""))  # symbols are numbered
        return [line for line in text.splitlines() if "contraction" not in line]

    assert loops(small) == loops(large)
    ins = inputs_for(a, b)
    np.testing.assert_array_equal(check_exact(code, small, ins, c), check_exact(code, large, ins, c))
    assert "#pragma GCC unroll" not in cc.compile_proc(small, name="small").source


def test_small_contractions_without_tails_stay_unrolled():
    code, a, b, c = matmul(16, 17, 32, True)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, min_unroll_work=1 << 30, tile=Tile(8, 32, 17)))
    assert _unrolled_loops(sched) > 0
    check_exact(code, sched, inputs_for(a, b), c)


def test_a_single_row_is_not_packed():
    """A vector-matrix product would read its packed panel once: it is left to interchange."""
    code, a, b, c = matmul(1, 7, 40, True)
    sched = schedule_llc(code, OFF, ANY_SIZE)
    assert "pack" not in local_nodes(sched)
    check_exact(code, sched, inputs_for(a, b), c)


@pytest.mark.parametrize("tile", [Tile(3, 8, 4), Tile(5, 16, 7), Tile(1, 4, 1), Tile(8, 32, 3)])
def test_k_chunks_with_a_tail_chunk_are_exact(tile):
    """Chunks of the summed loop, the last one shorter: every cell still sums in order."""
    code, a, b, c = matmul(19, 23, 45, True)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, tile=tile))
    ins = inputs_for(a, b, seed=1)
    check_exact(code, sched, ins, c)
    # 19 rows in blocks as even as `tile.mb` allows (`cost_model.row_blocks`): 8x32 runs 7 + 6 + 6
    height = cost_model.row_blocks(19, tile.mb)[0]
    assert f"{height}x{tile.nb}, {tile.kc}-step k chunks" in ll.to_doc(sched)


def test_k_chunks_come_from_the_l2_budget():
    """A panel over half the (here tiny) L2 is cut into chunks that fit."""
    machine = Machine(l2_bytes=2 * 40 * 32 * 4)
    code, a, b, c = matmul(16, 100, 64, False)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, machine=machine))
    assert "8x32, 40-step k chunks" in ll.to_doc(sched)
    check_exact(code, sched, inputs_for(a, b, seed=2), c)


def test_column_tails_run_a_padded_full_width_panel():
    """45 columns: one 32-wide panel, then 13 columns in a panel padded to 32, whose padding
    columns are zero in the pack and the accumulators and never stored."""
    code, a, b, c = matmul(11, 9, 45, True)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, tile=Tile(4, 32, 9)))
    doc = ll.to_doc(sched)
    assert "the last 13 of 45 columns, padded to 32" in doc and "the last 3 of 11 rows" in doc
    check_exact(code, sched, inputs_for(a, b, seed=5), c, threads=2)


@pytest.mark.parametrize("n,want", [(1024, Tile(8, 32, 1024)), (1000, Tile(8, 32, 1000)),
                                    (1023, Tile(8, 32, 1023)), (784, Tile(8, 32, 784)), (10, Tile(7, 8, 10)),
                                    (13, Tile(7, 8, 13))])
def test_cost_model_choices_for_float32(n, want):
    blocking = Blocking()
    assert cost_model.choose(Shape(n, n, n, n, 4), blocking.nb_choices, blocking.mb_max, blocking.machine) == want


def test_cost_model_respects_registers_and_precision():
    blocking = Blocking()
    tile = cost_model.choose(Shape(512, 512, 512, 512, 8), blocking.nb_choices, blocking.mb_max, blocking.machine)
    assert tile == Tile(8, 16, 512)
    for t in cost_model.candidates(Shape(64, 64, 64, 64, 4), blocking.nb_choices, 16, blocking.machine):
        vectors = -(-t.nb // 16)
        assert t.mb * vectors + vectors + 1 <= 32
    # a full 8x32 block beats a tail-free but latency-bound 2x8 one
    shape = Shape(64, 40, 64, 64, 4)
    assert cost_model.cycles(shape, Tile(8, 32, 64), blocking.machine) < cost_model.cycles(
        shape, Tile(2, 8, 64), blocking.machine)


def test_threads_share_column_panels_with_private_heap_panels():
    """Enough panels for two threads: the panel loop runs on threads, each packing its own
    panel, here too large for the stack, into its own heap copy."""
    code, a, b, c = matmul(8, 1100, 20, False)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, tile=Tile(2, 4, 1100), parallel_min_work=1,
                                             min_panels_per_thread=2))
    src = cc.compile_proc(sched, name="tails", options=cc.CcOptions(threads=2)).source
    # no shared panel: it would go unused; the accumulators start at zero, and the fill is left for
    # the first_writes stage (not run here) to drop
    assert re.search(r"void tails\(const float \*restrict a, float \*restrict c, const float \*restrict b\) \{\n"
                     r"  memset\(c, 0, sizeof\(float\) \* 160\);\n"
                     r"  /\* register-blocked 2x4 contraction into c\w*, from zero \*/\n", src)
    assert ("from zero */\n  #pragma omp parallel num_threads(2)\n  {\n"
            "    float *restrict pack = (float *)malloc(4400 * sizeof(float));\n    if (!pack) abort();\n"
            "    einjit_f32x4 acc[2];\n    #pragma omp for schedule(dynamic)\n") in src
    assert "    free(pack);\n  }\n}\n" in src
    serial = cc.compile_proc(sched, name="tails", options=cc.CcOptions(threads=1)).source
    assert "float *restrict pack)" in serial and "omp" not in serial
    ins = inputs_for(a, b, seed=3)
    want = check_exact(code, sched, ins, c, threads=2)
    np.testing.assert_allclose(want, ins[a] @ ins[b], rtol=1e-4, atol=1e-4)


def test_a_tail_panel_outside_the_threads_keeps_the_routines_panel():
    """22 columns: five panels on threads, then the last 2 columns in a panel of their own
    after the parallel loop (its row blocks on threads), which packs into the routine's panel;
    each thread of the panel loop packs into its own heap copy, under the same name."""
    code, a, b, c = matmul(8, 1100, 22, False)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, tile=Tile(2, 4, 1100), parallel_min_work=1,
                                             min_panels_per_thread=2))
    src = cc.compile_proc(sched, name="tails", options=cc.CcOptions(threads=2)).source
    assert "const float *restrict b, float *restrict pack) {\n  memset(c, 0, sizeof(float) * 176);\n  /* blocked" in src
    assert ("  #pragma omp parallel num_threads(2)\n  {\n"
            "    float *restrict pack = (float *)malloc(4400 * sizeof(float));\n    if (!pack) abort();\n"
            "    einjit_f32x4 acc[2];\n") in src
    ins = inputs_for(a, b, seed=5)
    want = check_exact(code, sched, ins, c, threads=2)
    np.testing.assert_allclose(want, ins[a] @ ins[b], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
def test_k_chunks_on_threads_run_in_one_region(machine):
    """A chunked contraction with its panels on threads: one parallel region around the k
    chunks (not a fork-join per chunk), the panels an `omp for` inside it whose barrier orders
    each chunk after the one before, the padded tail panel packed by one thread (`omp single`)
    and its row blocks shared out, all of them: 20 rows are 4 blocks of 5 (`cost_model.row_blocks`),
    not 3 of 6 and a 2-row tail that one thread ran while the other waited; bit-identical to the
    interpreter at 1 and 2 threads."""
    nb = 32 if machine == "avx512" else 16
    code, a, b, c = matmul(20, 48, 4 * nb + 5, False)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, tile=Tile(6, nb, 16), parallel_min_work=1,
                                             machine=MACHINES[machine]))
    src = cc.compile_proc(sched, name="tails", options=cc.CcOptions(threads=2)).source
    assert src.count("#pragma omp parallel") == 1
    region = re.search(r"\n  #pragma omp parallel num_threads\(2\)\n  \{\n(.*?)\n  \}\n", src, re.S)
    assert region is not None
    pragmas = [re.sub(r"dynamic, \d+", "dynamic", line.strip()) for line in region.group(1).splitlines()
               if "#pragma omp" in line or "int kt0" in line]
    # the panel is each thread's own in the panel loop, the tail panel's pack (one thread) the
    # routine's; the accumulators, used in threaded loops only, each thread's from the region's start
    assert pragmas == ["for (int kt0 = 0; kt0 < 3; ++kt0) {", "#pragma omp for schedule(dynamic) private(pack)",
                       "#pragma omp single", "#pragma omp for schedule(dynamic)"]
    assert f"5x{nb}, 16-step k chunks" in src and "rows */" not in src
    ins = inputs_for(a, b, seed=7)
    for threads in (1, 2):
        want = check_exact(code, sched, ins, c, threads=threads)
    np.testing.assert_allclose(want, ins[a] @ ins[b], rtol=1e-4, atol=1e-4)


def test_double_precision_tails_are_exact():
    code, a, b, c = matmul(11, 9, 21, True, prec=ops.double)
    sched = schedule_llc(code, OFF, ANY_SIZE)
    assert local_nodes(sched) == {"pack", "acc", "edge"}
    check_exact(code, sched, inputs_for(a, b, seed=4), c)


AWKWARD_SIZES = st.sampled_from([1, 2, 3, 5, 7, 8, 9, 13, 15, 16, 17, 31, 32, 33, 40])


@st.composite
def awkward_contractions(draw):
    """`c[(n,) i, j] += A * B` with awkward extents, either layout of each operand, any loop
    order, and the cost model's tiles for each machine description or random ones (with k
    chunks)."""
    ni, nj, nk = draw(AWKWARD_SIZES), draw(AWKWARD_SIZES), draw(AWKWARD_SIZES)
    code, a, b, c = contraction_nest(draw, ni, nj, nk, draw(st.integers(1, 3)))
    tile = draw(st.none() | st.builds(Tile, st.integers(1, 8), st.sampled_from([4, 8, 16, 32]), st.integers(1, 40)))
    blocking = Blocking(min_work=1, tile=tile, parallel_min_work=draw(st.sampled_from([1, 1 << 30])),
                        min_unroll_work=draw(st.sampled_from([1, 1 << 30])), min_panels_per_thread=1,
                        machine=draw(st.sampled_from(list(MACHINES.values()))))
    return code, a, b, c, blocking


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=awkward_contractions(), threads=st.sampled_from([1, 2]))
def test_random_awkward_contractions_are_scheduled_exactly(case, threads):
    code, a, b, c, blocking = case
    sched = schedule_llc(code, OFF, blocking)
    check_exact(code, sched, inputs_for(a, b), c, threads=threads)
