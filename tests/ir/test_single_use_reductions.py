"""Single-use reductions (issue 13 item 4; seed 000's `is_complex`): a reduction whose every
cell is read once, by one pointwise consumer, is inlined there — its loop runs once per cell,
as it would stored — unless it is a contraction or its innermost loop is strided. Each case is
checked optimized against unoptimized and NumPy in the interpreter, and compiled by gcc
against the interpreter."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import assignments as asg
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import FixedIdx, Iterator, get_symbol
from einjit.ir.optimize import VirtualizeSettings, optimize_proc
from einjit.ir.provenance import COMPLEX_COMPUTATION, INLINED
from einjit.ir.tnode import NEVER_VIRTUAL, VIRTUAL
from test_optimize import PRECS, accum, check_program, node, nodes_in, pointwise, sum_rows

B, U = ops.Binop, ops.Unop
OFF = VirtualizeSettings(inline_single_use_reductions=False)


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def gcc_agrees(code, inputs, outputs, name):
    """The optimized code compiled by gcc computes what the interpreter computes unoptimized."""
    llc = asg.to_low_level(code)
    want = interpret.run(llc, {tn: v.copy() for tn, v in inputs.items()})
    opt = optimize_proc(asg.to_low_level(code), name=name)
    ctx = run_once(opt, inputs, name=name, context=CcBackend().init(name))
    for tn in outputs:
        np.testing.assert_allclose(ctx.array(tn), want[tn], rtol=1e-12, atol=1e-12, err_msg=tn.debug_name())
    return cc.compile_proc(opt, name=name).source


@pytest.mark.parametrize("prec", PRECS, ids=lambda p: p.name)
def test_row_sum_read_once_by_a_pointwise_op_is_inlined(prec, rng):
    a, out = node("a", (3, 5), prec, host=True), node("out", (3,), prec, host=True)
    s = node("rowsum", (3,), prec)
    av = rng.standard_normal((3, 5))
    opt = check_program(asg.sequence(sum_rows(s, a), pointwise(out, U.EXP, s)), {a: av},
                        {out: np.exp(av.astype(prec.dtype).sum(axis=1))})
    assert opt.traced_store[s].is_complex and opt.traced_store[s].is_local_reduction
    assert s.memory_mode == VIRTUAL and s.provenance == INLINED
    assert s not in nodes_in(opt)
    (st,) = [x for x in ll.iter_stmts(opt.llc) if isinstance(x, ll.Set)]
    assert st.tn is out
    (loop,) = [x for x in ll.iter_stmts(opt.llc) if isinstance(x, ll.ForLoop) and x.to_ == 4]
    assert any(isinstance(x, ll.LocalScope) for x in ll.iter_scalars(st.llsc))
    assert loop is not None


def test_inlined_row_sum_in_c_computes_and_keeps_no_array(rng):
    a, out = node("a", (4, 6), host=True), node("out", (4,), host=True)
    s = node("rowsum", (4,))
    av = rng.standard_normal((4, 6))
    code = asg.sequence(sum_rows(s, a), pointwise(out, U.EXP, s))
    src = gcc_agrees(code, {a: av}, [out], "single_use_sum")
    assert s.is_virtual()
    code_only = re.sub(r"/\*.*?\*/", "", src[src.index("void single_use_sum("):])
    assert "double v0_ = 0;" in code_only and not re.search(r"\browsum", code_only), src


def test_stored_without_the_setting(rng):
    a, out = node("a", (4, 6), host=True), node("out", (4,), host=True)
    s = node("rowsum", (4,))
    av = rng.standard_normal((4, 6))
    opt = check_program(asg.sequence(sum_rows(s, a), pointwise(out, U.EXP, s)), {a: av},
                        {out: np.exp(av.sum(axis=1))}, settings=OFF)
    assert s.memory_mode == NEVER_VIRTUAL and s.provenance == COMPLEX_COMPUTATION and s in nodes_in(opt)


def test_row_sum_broadcast_to_its_row_stays_stored(rng):
    """`a / sum(a)` reads each cell of the sum once per row element: inlining would replay the
    sum for every element."""
    a, out = node("a", (3, 5), host=True), node("out", (3, 5), host=True)
    s = node("rowsum", (3,))
    i, j = get_symbol(), get_symbol()
    div = accum(out, B.DIV, [a, s], {i: 3, j: 5}, [Iterator(i), Iterator(j)],
                [[Iterator(i), Iterator(j)], [Iterator(i)]])
    av = rng.uniform(1.0, 2.0, (3, 5))
    opt = check_program(asg.sequence(sum_rows(s, a), div), {a: av}, {out: av / av.sum(axis=1, keepdims=True)})
    assert opt.traced_store[s].max_visits() > 1
    assert s.memory_mode == NEVER_VIRTUAL and s.provenance == COMPLEX_COMPUTATION and s in nodes_in(opt)


def test_row_sum_read_by_two_consumers_stays_stored(rng):
    a, o1, o2 = node("a", (3, 5), host=True), node("o1", (3,), host=True), node("o2", (3,), host=True)
    s = node("rowsum", (3,))
    av = rng.standard_normal((3, 5))
    code = asg.sequence(sum_rows(s, a), pointwise(o1, U.EXP, s), pointwise(o2, U.NEG, s))
    opt = check_program(code, {a: av}, {o1: np.exp(av.sum(axis=1)), o2: -av.sum(axis=1)})
    assert s.memory_mode == NEVER_VIRTUAL and s in nodes_in(opt)


def test_column_sum_is_strided_and_stays_stored(rng):
    """Summing over the first axis walks memory with a stride: inlined into its consumer, the
    loop could not be vectorized nor interchanged, so it stays a nest of its own."""
    a, out = node("a", (5, 3), host=True), node("out", (3,), host=True)
    s = node("colsum", (3,))
    i, j = get_symbol(), get_symbol()
    colsum = accum(s, U.IDENTITY, [a], {i: 5, j: 3}, [Iterator(j)], [[Iterator(i), Iterator(j)]],
                   acc=B.ADD, init=True)
    av = rng.standard_normal((5, 3))
    opt = check_program(asg.sequence(colsum, pointwise(out, U.EXP, s)), {a: av}, {out: np.exp(av.sum(axis=0))})
    assert not opt.traced_store[s].is_local_reduction
    assert s.memory_mode == NEVER_VIRTUAL and s.provenance == COMPLEX_COMPUTATION


def _total_then_neg(av):
    a, out, s = node("a", (6, 1), host=True), node("out", (1,), host=True), node("total", (1,))
    b, k = get_symbol(), get_symbol()
    total = accum(s, U.IDENTITY, [a], {b: 6}, [FixedIdx(0)], [[Iterator(b), FixedIdx(0)]], acc=B.ADD, init=True)
    return asg.sequence(total, accum(out, U.NEG, [s], {k: 1}, [FixedIdx(0)], [[FixedIdx(0)]])), a, out, s


def test_sum_over_a_trailing_axis_of_size_one_is_contiguous(rng):
    """`y[b, 0]` summed over `b`: the axis after `b` has one cell, so the loop is unit-stride."""
    av = rng.standard_normal((6, 1))
    code, a, out, s = _total_then_neg(av)
    opt = check_program(code, {a: av}, {out: [-av.sum()]})
    assert opt.traced_store[s].is_local_reduction and s.is_virtual()
    code, a, out, s = _total_then_neg(av)
    gcc_agrees(code, {a: av}, [out], "single_use_total")


def test_total_read_twice_by_one_statement_stays_stored(rng):
    a, out, s = node("a", (6, 1), host=True), node("out", (1,), host=True), node("total", (1,))
    b, k = get_symbol(), get_symbol()
    total = accum(s, U.IDENTITY, [a], {b: 6}, [FixedIdx(0)], [[Iterator(b), FixedIdx(0)]], acc=B.ADD, init=True)
    square = accum(out, B.MUL, [s, s], {k: 1}, [FixedIdx(0)], [[FixedIdx(0)], [FixedIdx(0)]])
    av = rng.standard_normal((6, 1))
    check_program(asg.sequence(total, square), {a: av}, {out: [av.sum() ** 2]})
    assert s.memory_mode == NEVER_VIRTUAL and s.provenance == COMPLEX_COMPUTATION


def test_contraction_read_once_stays_stored(rng):
    """A matrix product is scheduled as its own blocked nest; inlined into its consumer it would
    become one dot product per cell."""
    a, b, out = node("a", (4, 3), host=True), node("b", (3, 5), host=True), node("out", (4, 5), host=True)
    c = node("c", (4, 5))
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    matmul = accum(c, B.MUL, [a, b], {i: 4, k: 3, j: 5}, [Iterator(i), Iterator(j)],
                   [[Iterator(i), Iterator(k)], [Iterator(k), Iterator(j)]], acc=B.ADD, init=True)
    av, bv = rng.standard_normal((4, 3)), rng.standard_normal((3, 5))
    opt = check_program(asg.sequence(matmul, pointwise(out, U.RELU, c)), {a: av, b: bv},
                        {out: np.maximum(av @ bv, 0.0)})
    assert opt.traced_store[c].max_visits() == 1 and not opt.traced_store[c].is_local_reduction
    assert c.memory_mode == NEVER_VIRTUAL and c.provenance == COMPLEX_COMPUTATION


def _norms(av):
    a, out, s = node("a", (3, 7), host=True), node("out", (3,), host=True), node("sumsq", (3,))
    i, j = get_symbol(), get_symbol()
    sq = accum(s, B.MUL, [a, a], {i: 3, j: 7}, [Iterator(i)], [[Iterator(i), Iterator(j)]] * 2,
               acc=B.ADD, init=True)
    return asg.sequence(sq, pointwise(out, U.SQRT, s)), a, out, s


def test_sum_of_squares_of_one_tensor_is_local(rng):
    av = rng.standard_normal((3, 7))
    code, a, out, s = _norms(av)
    check_program(code, {a: av}, {out: np.sqrt((av * av).sum(axis=1))})
    assert s.is_virtual()
    code, a, out, s = _norms(av)
    gcc_agrees(code, {a: av}, [out], "single_use_norm")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 4), cols=st.integers(1, 7), acc=st.sampled_from([B.ADD, B.MAX, B.MUL]),
       consumer=st.sampled_from([U.EXP, U.NEG, U.RELU, U.IDENTITY]), seed=st.integers(0, 2**16))
def test_inlined_reductions_are_exact(rows, cols, acc, consumer, seed):
    """Inlining a single-use reduction recomputes it in the same order and precision: without
    simplification (which fuses multiply-adds) the results are bit for bit the stored ones."""
    a, out = node("a", (rows, cols), host=True), node("out", (rows,), host=True)
    s = node("red", (rows,))
    i, j = get_symbol(), get_symbol()
    red = accum(s, U.IDENTITY, [a], {i: rows, j: cols}, [Iterator(i)], [[Iterator(i), Iterator(j)]],
                acc=acc, init=True)
    code = asg.sequence(red, pointwise(out, consumer, s))
    av = np.random.default_rng(seed).uniform(-1.5, 1.5, (rows, cols))
    llc = asg.to_low_level(code)
    want = interpret.run(llc, {a: av.copy()})[out]
    opt = optimize_proc(llc, name="exact", settings=VirtualizeSettings(simplify=False))
    got = interpret.run(opt.llc, {a: av.copy()})[out]
    assert np.array_equal(got, want)
    assert s.is_virtual()
