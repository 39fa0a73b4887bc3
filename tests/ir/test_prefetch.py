"""The prefetch stage (`ir/sched/prefetch.py`): a weight gradient's sweep, reading its operands in
place, requests the lines its next block reads at the same row, one per line, and a product's
tile loop the lines its next tile stores, for writing; the requests change no value (the
unscheduled C's bits at 1 and 2 threads, the interpreter's), reach past the array's end at the
last block without harm, and are left out by a syntax without them. Reads the hardware follows
(a row operand stepping one cell, a packed panel) and the reads of short sweeps get none."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from einjit.backends import c_syntax
from einjit.backends.cc import toolchain as cc
from einjit.ir import interpret
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, FixedIdx, Iterator
from einjit.ir.sched.prefetch import LINE_BYTES, prefetch_kernels
from einjit.ir.sched.schedule import Blocking, schedule_llc
from test_schedule import OFF, check_exact, inputs_for, matmul, run_in_c
from test_schedule_weight_grads import check_on_threads, head_weight_grad, weight_grad
from test_unpacked_panel import SMALL_L1


def requests(code) -> list[tuple[ll.ForLoop, ll.Prefetch]]:
    return [(s, p) for s in ll.iter_stmts(code) if isinstance(s, ll.ForLoop) for p in s.prefetch]


def in_place(code):
    return schedule_llc(code, OFF, Blocking(min_work=1, parallel_min_work=1, machine=SMALL_L1))


def flat(p: ll.Prefetch, at: dict) -> int:
    """The cell a request asks for, its loop symbols at the values `at`."""
    total = 0
    for stride, idx in zip(ll.row_major_strides(p.tn.dims), p.idcs, strict=True):
        match idx:
            case FixedIdx(i):
                total += stride * i
            case Iterator(s):
                total += stride * at[s]
            case Affine(terms, offset):
                total += stride * (offset + sum(c * at[s] for c, s in terms))
    return total + p.ahead


def test_a_weight_gradient_requests_its_next_blocks_lines():
    """`w[i, j] += Σ_bt x[b, t, i] dy[b, t, j]`, 64 rows of `x` and 128 columns of `dy`:
    each sweep reads a strip of 8 cells of `x` (32 bytes of a 256-byte row) and 32 of `dy`
    (128 of 512), and asks for the next strip's lines at the same row: one of `x` two blocks on
    (the next line), two of `dy` one block on."""
    code, x, dy, w = weight_grad(4, 64, 64, 128)
    sched = in_place(code)
    got = [(loop, p) for loop, p in requests(prefetch_kernels(sched)) if not p.write]
    by_node = {tn: sorted(p.ahead for _, p in got if p.tn is tn) for tn in (x, dy)}
    assert by_node == {x: [16], dy: [32, 32]}, ll.to_doc(prefetch_kernels(sched))[:1500]
    sweep = {loop for loop, _ in got}
    assert len(sweep) == 1 and not next(iter(sweep)).unroll
    for _, p in got:
        assert p.ahead * p.tn.prec.itemsize >= LINE_BYTES


def test_requests_change_no_value_on_threads_and_in_the_interpreter():
    """Bit for bit the unscheduled C at 1 and 2 threads, and the interpreter's values with and
    without the requests; the C asks once per request, and the last block's requests point past
    the end of their array."""
    code, x, dy, w = weight_grad(3, 50, 64, 64)
    sched = in_place(code)
    with_requests = prefetch_kernels(sched)
    got = requests(with_requests)
    assert got
    check_on_threads(code, with_requests, x, dy, w, seed=3)
    ins = inputs_for(x, dy, seed=4)
    plain = interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[w]
    asked = interpret.run(with_requests, {tn: v.copy() for tn, v in ins.items()})[w]
    np.testing.assert_array_equal(asked, plain)
    source = c_syntax.render_program([("wgrad_prefetch", with_requests)]).source
    assert source.count("__builtin_prefetch(") == len(got)
    assert source.count(", 1);") == sum(p.write for _, p in got) > 0
    last = {s.index: s.to_ for s in ll.iter_stmts(with_requests) if isinstance(s, ll.ForLoop)}
    assert any(flat(p, last) >= math.prod(p.tn.dims) for _, p in got)


def test_a_head_axis_weight_gradient_is_exact_with_requests():
    """The attention projections' weight gradients (a head loop outside the panels): requests on
    both operands and the stores, bit for bit the unscheduled C at 1 and 2 threads."""
    code, x, dy, w = head_weight_grad(4, 40, 2, 16, 64)
    with_requests = prefetch_kernels(in_place(code))
    assert {(p.tn, p.write) for _, p in requests(with_requests)} == {(x, False), (dy, False), (w, True)}
    ins = inputs_for(x, dy, seed=6)
    want = run_in_c(code, ins, name="plain").array(w).copy()
    for threads in (1, 2):
        got = run_in_c(with_requests, ins, name="wgrad_heads", options=cc.CcOptions(threads=threads)).array(w)
        np.testing.assert_array_equal(got, want)
    ref = np.einsum("bthr,btj->hrj", ins[x].astype(np.float64), ins[dy].astype(np.float64))
    np.testing.assert_allclose(want, ref, rtol=1e-4, atol=1e-4)


def test_a_weight_gradients_tiles_ask_for_their_next_stores():
    """The 64 x 128 result in 8 x 32 tiles: each tile asks, for writing, for the 16 lines of the
    next tile along the columns (32 cells on)."""
    code, x, dy, w = weight_grad(4, 64, 64, 128)
    got = [(loop, p) for loop, p in requests(prefetch_kernels(in_place(code))) if p.write]
    assert {p.tn for _, p in got} == {w} and {p.ahead for _, p in got} == {32} and len(got) == 16
    (tile,) = {loop for loop, _ in got}
    assert any(isinstance(s, ll.ForLoop) and s.prefetch and not s.prefetch[0].write for s in ll.iter_stmts(tile.body))


def test_a_forward_product_asks_only_for_its_stores():
    """`w @ x`: the row operand steps one cell per iteration and the packed panel is read line
    after line (the hardware follows both), so the only requests are the tiles' stores; the
    values are the unscheduled code's at 1 and 2 threads, under the interpreter and gcc."""
    code, a, b, c = matmul(64, 128, 96, transposed=True)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, parallel_min_work=1))
    with_requests = prefetch_kernels(sched)
    got = requests(with_requests)
    assert got and all(p.write and p.tn is c for _, p in got)
    ins = inputs_for(a, b, seed=2)
    for threads in (1, 2):
        check_exact(code, with_requests, ins, c, threads=threads, name="stores_prefetched")


def test_a_short_sweep_asks_only_for_its_stores():
    """Summing 64 rows (attention's keys, a head's features): the operands stay in the L1 or
    L2, and read requests would only add instructions; the tiles still ask for their stores.
    Summing 8, nothing is asked at all."""
    code, x, dy, w = weight_grad(2, 32, 64, 128)
    got = requests(prefetch_kernels(in_place(code)))
    assert got and all(p.write and p.tn is w for _, p in got)
    product, *_ = matmul(64, 8, 96, transposed=True)
    sched = schedule_llc(product, OFF, Blocking(min_work=1))
    assert ll.to_doc(prefetch_kernels(sched)) == ll.to_doc(sched)


def test_a_syntax_without_prefetch_leaves_the_requests_out():
    code, *_ = weight_grad(2, 64, 64, 64)
    with_requests = prefetch_kernels(in_place(code))
    assert requests(with_requests)
    quiet = dataclasses.replace(c_syntax.C_SYNTAX, prefetch=False)
    assert "__builtin_prefetch" not in c_syntax.render_program([("quiet", with_requests)], syntax=quiet).source
    assert "prefetch" in ll.to_doc(with_requests)
