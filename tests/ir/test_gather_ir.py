"""Run-time indices through the compiler core: a gather and its scatter-add (`GatherIdx`),
and an indexed write at a static-symbol position, four ways (interpreter and gcc, unoptimized
and optimized) against NumPy, with repeated and out-of-range ids (clamped); what tracing and
virtualization decide for the nodes involved; and what the renderers print."""

from __future__ import annotations

import re

import numpy as np
import pytest

from einjit.backends.c_syntax import render_program
from einjit.backends.gpu.cuda_syntax import render_program as render_cuda
from einjit.backends.parallel_loops import is_parallel
from einjit.ir import assignments as asg
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, FixedIdx, GatherIdx, Iterator, get_static_symbol, get_symbol, subst_index
from einjit.ir.optimize import optimize_proc
from einjit.ir.provenance import RUN_TIME_INDEX
from test_pipeline import node, proj, run_four_ways

V, D, N = 6, 4, 9


def gather_code(prec, ids, table, out, grad_out, grad_table):
    """`out[n, d] = table[ids[n], d]` and `grad_table[ids[n], d] += grad_out[n, d]`."""
    n, d = get_symbol("n"), get_symbol("d")
    g = GatherIdx(ids, (Iterator(n),), V)
    fwd = proj({n: N, d: D}, (N, D), [(V, D)], [Iterator(n), Iterator(d)], [[g, Iterator(d)]])
    bwd = proj({n: N, d: D}, (V, D), [(N, D)], [g, Iterator(d)], [[Iterator(n), Iterator(d)]])
    return asg.sequence(
        asg.AccumUnop(True, ops.Binop.ARG2, ops.Unop.IDENTITY, out, asg.Node(table), fwd),
        asg.Fetch(grad_table, asg.FetchConstant(0.0)),
        asg.AccumUnop(False, ops.Binop.ADD, ops.Unop.IDENTITY, grad_table, asg.Node(grad_out), bwd))


@pytest.mark.parametrize("prec", [ops.double, ops.single], ids=lambda p: p.name)
@pytest.mark.parametrize("id_prec", [ops.int32, ops.int64], ids=lambda p: p.name)
def test_gather_and_scatter_add_four_ways(prec, id_prec):
    rng = np.random.default_rng(3)
    ids, table = node("ids", (N,), id_prec), node("table", (V, D), prec)
    out, grad_out, grad_table = node("out", (N, D), prec), node("gout", (N, D), prec), node("gtable", (V, D), prec)
    idv = np.array([2, 5, 2, 0, 2, -3, 9, 5, 1])  # repeated ids, and two out of range
    tv, gv = rng.standard_normal((V, D)), rng.standard_normal((N, D))
    clamped = np.clip(idv, 0, V - 1)
    want_grad = np.zeros((V, D))
    np.add.at(want_grad, clamped, gv.astype(prec.dtype))
    run_four_ways(gather_code(prec, ids, table, out, grad_out, grad_table),
                  {ids: idv, table: tv, grad_out: gv},
                  {out: tv.astype(prec.dtype)[clamped], grad_table: want_grad})


@pytest.mark.parametrize("prec", [ops.double, ops.single], ids=lambda p: p.name)
def test_indexed_write_at_a_static_position_four_ways(prec):
    """`cache[b, pos + i, e] := new[b, i, e]` (what `write_at` lowers to), then the cache read
    whole: the written rows and the untouched ones."""
    rng = np.random.default_rng(5)
    cache, new, total = node("cache", (2, 7, 3), prec), node("new", (2, 2, 3), prec), node("total", (2,), prec)
    pos = get_static_symbol(6)
    b, i, e = get_symbol(), get_symbol(), get_symbol()
    at_pos = Affine(((1, i), (1, pos.symbol)))
    write = proj({b: 2, i: 2, e: 3}, (2, 7, 3), [(2, 2, 3)], [Iterator(b), at_pos, Iterator(e)],
                 [[Iterator(b), Iterator(i), Iterator(e)]])
    read = proj({b: 2, i: 7, e: 3}, (2,), [(2, 7, 3)], [Iterator(b)], [[Iterator(b), Iterator(i), Iterator(e)]])
    code = asg.sequence(asg.AccumUnop(False, ops.Binop.ARG2, ops.Unop.IDENTITY, cache, asg.Node(new), write),
                        asg.AccumUnop(True, ops.Binop.ADD, ops.Unop.IDENTITY, total, asg.Node(cache), read))
    start, nv = rng.standard_normal((2, 7, 3)), rng.standard_normal((2, 2, 3))
    for at in (0, 3, 5):
        want = start.astype(prec.dtype).copy()
        want[:, at:at + 2] = nv.astype(prec.dtype)
        run_four_ways(code, {cache: start, new: nv}, {cache: want, total: want.sum(axis=(1, 2))}, bindings={pos: at})


def test_gathered_nodes_stay_stored_and_the_gather_result_can_be_inlined():
    """The table, the ids and the scatter target are accessed at data-dependent cells, so
    tracing marks them and virtualization keeps them (code 16); the gathered rows themselves
    are an ordinary computation that a consumer may inline."""
    prec = ops.double
    ids, table = node("ids", (N,), ops.int32), node("table", (V, D), prec)
    out = node("rows", (N, D), prec, host=False)
    total = node("total", (N,), prec)
    grad_out, grad_table = node("gout", (N, D), prec), node("gtable", (V, D), prec, host=False)
    n, d = get_symbol(), get_symbol()
    reduce = proj({n: N, d: D}, (N,), [(N, D)], [Iterator(n)], [[Iterator(n), Iterator(d)]])
    use = proj({n: V, d: D}, (V, D), [(V, D)], [Iterator(n), Iterator(d)], [[Iterator(n), Iterator(d)]])
    keep = node("kept", (V, D), prec)
    code = asg.sequence(gather_code(prec, ids, table, out, grad_out, grad_table),
                        asg.AccumUnop(True, ops.Binop.ADD, ops.Unop.IDENTITY, total, asg.Node(out), reduce),
                        asg.AccumUnop(True, ops.Binop.ARG2, ops.Unop.IDENTITY, keep, asg.Node(grad_table), use))
    opt = optimize_proc(asg.to_low_level(code), name="gathered")
    assert out.is_virtual()
    assert not grad_table.is_virtual() and grad_table.provenance == RUN_TIME_INDEX
    assert opt.traced_store[ids].run_time_indexed and opt.traced_store[table].run_time_indexed
    idv = np.array([1, 1, 0, 5, 3, 2, 2, 4, 1])
    tv, gv = np.arange(V * D, dtype=float).reshape(V, D), np.ones((N, D))
    got = interpret.run(opt.llc, {ids: idv.astype(np.int32), table: tv.copy(), grad_out: gv})
    np.testing.assert_array_equal(got[total], tv[idv].sum(axis=1))
    np.testing.assert_array_equal(got[keep], np.bincount(idv, minlength=V)[:, None] * np.ones((V, D)))


def test_a_scatter_loop_is_not_parallel_over_the_ids_but_is_over_the_row():
    prec = ops.single
    ids, table = node("ids", (N,), ops.int32), node("table", (V, D), prec)
    code = gather_code(prec, ids, table, node("out", (N, D), prec), node("gout", (N, D), prec),
                       node("gtable", (V, D), prec))
    scatter = list(ll.flatten(asg.to_low_level(code)))[-1]
    assert isinstance(scatter, ll.ForLoop) and isinstance(scatter.body, ll.ForLoop)
    assert not is_parallel(scatter, set())
    assert is_parallel(scatter.body, set())


def test_substitution_reaches_inside_a_run_time_index():
    ids = node("ids", (3, 2), ops.int32)
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    g = GatherIdx(ids, (Iterator(i), FixedIdx(1)), 7)
    assert subst_index({i: Iterator(k), j: FixedIdx(0)}, g) == GatherIdx(ids, (Iterator(k), FixedIdx(1)), 7)


def test_rendered_c_and_cuda_read_the_ids_through_the_clamping_helper():
    prec = ops.single
    ids, table = node("ids", (N,), ops.int32), node("table", (V, D), prec)
    code = gather_code(prec, ids, table, node("out", (N, D), prec), node("gout", (N, D), prec),
                       node("gtable", (V, D), prec))
    llc = asg.to_low_level(code)
    src = render_program([("gather", llc)]).source
    assert "const int *restrict ids" in src
    assert f"out[n0 * {D} + d0] = table[einjit_clamp_index(ids[n0], {V}) * {D} + d0];" in src
    assert f"gtable[einjit_clamp_index(ids[n1], {V}) * {D} + d1] = (gtable[einjit_clamp_index(ids[n1], {V})" in src
    assert src.count("long long einjit_clamp_index(long long i, long long n)") == 1
    cuda = render_cuda([("gather", llc)]).source
    assert "__device__ inline long long einjit_clamp_index" in cuda
    assert "einjit_clamp_index(ids[" in cuda


def test_cuda_renders_the_indexed_write_and_the_causal_mask():
    prec = ops.single
    cache, new, out = node("cache", (2, 7, 3), prec), node("knew", (2, 1, 3), prec), node("masked", (4, 7), prec)
    pos = get_static_symbol(7, name="pos")
    b, i, e = get_symbol(), get_symbol(), get_symbol()
    at_pos = Affine(((1, i), (1, pos.symbol)))
    write = proj({b: 2, i: 1, e: 3}, (2, 7, 3), [(2, 1, 3)], [Iterator(b), at_pos, Iterator(e)],
                 [[Iterator(b), Iterator(i), Iterator(e)]])
    code = asg.sequence(asg.AccumUnop(False, ops.Binop.ARG2, ops.Unop.IDENTITY, cache, asg.Node(new), write),
                        asg.Fetch(out, asg.CausalMask(0, 1, 0, pos)))
    llc = asg.to_low_level(code)
    cuda = render_cuda([("decode", llc)], bindings=[pos]).source
    assert "int pos" in cuda
    assert re.search(r"cache\[\w+ \* 21 \+ \(\w+ \+ pos\w*\) \* 3 \+ \w+\] = knew\[", cuda)
    assert re.search(r"masked\[\w+ \* 7 \+ \w+\] = \(\(\(float\)\w+\) < \(\(float\)\(\w+ \+ pos\w* \+ 1\)\)\);", cuda)
    arrays = interpret.run(llc, {new: np.ones((2, 1, 3), np.float32)}, {pos.symbol: 2})
    np.testing.assert_array_equal(arrays[out], (np.arange(7)[None, :] <= np.arange(4)[:, None] + 2).astype(np.float32))
    np.testing.assert_array_equal(arrays[cache][:, 2], 1.0)
