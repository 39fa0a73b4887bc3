"""First writes (`sched/first_writes.py`): a zero fill whose next nest adds one term into every
cell is dropped and the nest stores its terms. The output arrays start as NaN here, so a fill
dropped where a cell is not written, or an update still reading its cell, shows up; the
results are bit for bit those of the unrewritten code, under the interpreter and gcc, at one
and two threads, for the AVX2 and the AVX-512 descriptions."""

from __future__ import annotations

import numpy as np
import pytest

from einjit.backends.cc import toolchain as cc
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import FixedIdx, Iterator, get_symbol, make_affine
from einjit.ir.optimize import STAGES, VirtualizeSettings, optimize_proc
from einjit.ir.sched.first_writes import first_writes
from einjit.ir.sched.machine import MACHINES
from einjit.ir.sched.schedule import Blocking, schedule_llc
from einjit.ir.tnode import MATERIALIZED, Tnode
from test_schedule import inputs_for, it, run_in_c

B, T, D = 3, 5, 16


def _nest(loops, body):
    for s, n in reversed(loops):
        body = ll.ForLoop(s, 0, n - 1, body)
    return body


def bias_backward(prec=ops.single):
    """The dense layer's backward through `y = x·w + b` and a GELU-like factor, as backprop
    lowers it: `g =+ dy * f(n)` into a zeroed `g`, the bias gradient `db =+ g` summed over the
    rows, and `gx =+ g` (the product's gradient) into a zeroed `gx`."""
    dy, n = Tnode("dy", (B, T, D), prec), Tnode("n", (B, T, D), prec)
    # the outputs are materialized: the tests read all three, where a routine would consume
    # `g` itself (the "copies" and "rows" stages would drop its array, as local storage does)
    g, gx, db = (Tnode(name, dims, prec, memory_mode=MATERIALIZED)
                 for name, dims in (("g", (B, T, D)), ("gx", (B, T, D)), ("db", (D,))))
    b, t, j = (get_symbol(s) for s in "btj")
    at = it(b, t, j)
    factor = ll.Binop(ops.Binop.MUL, ll.Get(n, at), ll.Get(n, at))
    code = ll.seq(
        ll.ZeroOut(db), ll.ZeroOut(gx), ll.ZeroOut(g),
        _nest([(b, B), (t, T), (j, D)], ll.Set(g, at, ll.Ternop(ops.Ternop.FMA, ll.Get(dy, at), factor, ll.Get(g, at)),
                                               "g =+ dy * f")),
        _nest([(b, B), (t, T), (j, D)], ll.Set(db, it(j), ll.Binop(ops.Binop.ADD, ll.Get(db, it(j)), ll.Get(g, at)),
                                               "db =+ g")),
        _nest([(b, B), (t, T), (j, D)], ll.Set(gx, at, ll.Binop(ops.Binop.ADD, ll.Get(g, at), ll.Get(gx, at)),
                                               "gx =+ g")))
    return code, (dy, n), (g, gx, db)


def _zeroed(code):
    return {s.tn.label[0] for s in ll.iter_stmts(code) if isinstance(s, ll.ZeroOut)}


def _with_nan_outputs(ins, outs):
    return {**ins, **{tn: np.full(tn.dims, np.nan, tn.prec.dtype) for tn in outs}}


@pytest.mark.parametrize("prec", [ops.single, ops.double], ids=["f32", "f64"])
def test_covering_updates_store_and_their_fills_go(prec):
    code, ins_tn, (g, gx, db) = bias_backward(prec)
    new = first_writes(code)
    # the bias gradient sums over rows: its fill stays; g and gx are written once per cell
    assert _zeroed(new) == {"db"}
    stores = {s.tn.label[0]: s.llsc for s in ll.iter_stmts(new) if isinstance(s, ll.Set)}
    assert not any(isinstance(x, ll.Get) and x.tn is g for x in ll.iter_scalars(stores["g"]))
    assert isinstance(stores["gx"], ll.Get) and stores["gx"].tn is g
    ins = _with_nan_outputs(inputs_for(*ins_tn, seed=1), (g, gx, db))
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})
    got = interpret.run(new, {tn: v.copy() for tn, v in ins.items()})
    for tn in (g, gx, db):
        np.testing.assert_array_equal(got[tn], want[tn])
    dy, n = (ins[tn].astype(np.float64) for tn in ins_tn)
    np.testing.assert_allclose(want[db], (dy * n * n).sum(axis=(0, 1)), rtol=1e-5)
    for threads in (1, 2):
        ctx = run_in_c(new, ins, name="first_writes", options=cc.CcOptions(threads=threads))
        for tn in (g, gx, db):
            np.testing.assert_array_equal(ctx.array(tn), want[tn])


def test_the_stage_runs_after_causal_and_before_fusion():
    names = [s.name for s in STAGES]
    assert names.index("causal") < names.index("first_writes") < names.index("fuse")


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
def test_the_optimized_backward_is_bit_identical_in_c(machine, monkeypatch):
    """Through every stage (the bias gradient's sum, the fused nests): gcc's results equal the
    interpreter's on the unoptimized code, at one and two threads."""
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    code, ins_tn, outs = bias_backward()
    opt = optimize_proc(code, name="bias_backward", settings=VirtualizeSettings(reassociate=False)).llc
    assert _zeroed(opt) == {"db"}
    ins = _with_nan_outputs(inputs_for(*ins_tn, seed=2), outs)
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})
    for threads in (1, 2):
        ctx = run_in_c(opt, ins, name="bias_backward", options=cc.CcOptions(threads=threads))
        for tn in outs:
            np.testing.assert_array_equal(ctx.array(tn), want[tn])


def _update(g, idcs, e):
    return ll.Set(g, idcs, ll.Binop(ops.Binop.ADD, ll.Get(g, idcs), e))


def test_fills_stay_where_a_cell_could_keep_its_zero_or_be_read_first():
    x, g = Tnode("x", (B, D)), Tnode("g", (B, D))
    i, j = get_symbol("i"), get_symbol("j")
    at = it(i, j)
    whole = _nest([(i, B), (j, D)], _update(g, at, ll.Get(x, at)))
    half = ll.ForLoop(i, 0, B - 1, ll.ForLoop(j, 0, D // 2 - 1, _update(g, at, ll.Get(x, at))))
    diagonal = ll.ForLoop(i, 0, B - 1, _update(g, (FixedIdx(0), Iterator(i)), ll.Get(x, it(i, i))))
    twice = _nest([(i, B), (j, D)], ll.seq(_update(g, at, ll.Get(x, at)), _update(g, at, ll.Get(x, at))))
    reads_other = _nest([(i, B), (j, D)], _update(g, at, ll.Get(g, (FixedIdx(0), Iterator(j)))))
    read_first = _nest([(i, B), (j, D)], ll.Set(x, at, ll.Get(g, at)))
    summed = _nest([(i, B), (j, D)], _update(g, (FixedIdx(0), Iterator(j)), ll.Get(x, at)))
    for nest in (half, diagonal, twice, reads_other, summed):
        assert _zeroed(first_writes(ll.seq(ll.ZeroOut(g), nest))) == {"g"}, ll.to_doc(nest)
    assert _zeroed(first_writes(ll.seq(ll.ZeroOut(g), read_first, whole))) == {"g"}
    # a statement between the fill and the nest that leaves the node alone does not matter
    other = _nest([(i, B), (j, D)], ll.Set(x, at, ll.Constant(1.0)))
    assert _zeroed(first_writes(ll.seq(ll.ZeroOut(g), other, whole))) == set()
    # a fill inside a loop, followed in the same body by a covering nest
    k = get_symbol("k")
    inner = ll.ForLoop(k, 0, 3, ll.seq(ll.ZeroOut(g), whole))
    assert _zeroed(first_writes(inner)) == set()


def test_a_clipped_sum_inside_the_stores_leaves_them_an_overwrite():
    """`y[i] := Σ_{k ≤ i} x[i, k]` through an accumulator (a register block of the causal
    `P v`): the sum's loop is clipped, yet each cell of `y` is stored once, so the fill goes,
    and the values are those of the code with it; a clip on the loop around the stores (a
    row block the causal stage skips) keeps the fill."""
    x, y, acc = Tnode("x", (B, D)), Tnode("y", (B,), memory_mode=MATERIALIZED), Tnode("acc", (1,))
    i, k = get_symbol("i"), get_symbol("k")
    one = (FixedIdx(0),)
    diagonal = ll.LoopClip(make_affine([(1, i)], 1))  # k < i + 1
    row = ll.seq(ll.Set(acc, one, ll.Constant(0.0)),
                 ll.ForLoop(k, 0, D - 1, _update(acc, one, ll.Get(x, it(i, k))), stop=diagonal),
                 ll.Set(y, it(i), ll.Get(acc, one)))
    code = ll.seq(ll.ZeroOut(y), ll.ForLoop(i, 0, B - 1, row))
    new = first_writes(code)
    assert _zeroed(new) == set()
    ins = _with_nan_outputs(inputs_for(x, seed=2), (y, acc))
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[y]
    np.testing.assert_array_equal(interpret.run(new, {tn: v.copy() for tn, v in ins.items()})[y], want)
    np.testing.assert_allclose(want, [ins[x][r, :r + 1].astype(np.float64).sum() for r in range(B)], rtol=1e-6)
    skipped = ll.seq(ll.ZeroOut(y), ll.ForLoop(i, 0, B - 1, row, start=ll.LoopClip(FixedIdx(1))))
    assert _zeroed(first_writes(skipped)) == {"y"}


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
@pytest.mark.parametrize("shape", [(2, 24, 64, 40), (3, 19, 40, 33)])
def test_a_contraction_into_a_fresh_node_starts_at_zero_and_drops_the_fill(machine, shape, monkeypatch):
    """`y[b, t, j] = Σ_k x[b, t, k] · w[j, k]` (the dense layer's `x·wᵀ`, a dx nest) into a
    zeroed node: the register blocks start at zero, nothing reads `y`, its stores cover it, so
    the fill goes — with tail rows, a tail panel through the edge buffer, one and two threads;
    bit for bit the unoptimized code under the interpreter."""
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    bb, tt, kk, jj = shape
    x, w, y = Tnode("x", (bb, tt, kk)), Tnode("w", (jj, kk)), Tnode("y", (bb, tt, jj))
    b, t, j, k = (get_symbol(s) for s in "btjk")
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(x, it(b, t, k)), ll.Get(w, it(j, k)), ll.Get(y, it(b, t, j)))
    code = ll.seq(ll.ZeroOut(y), _nest([(b, bb), (t, tt), (j, jj), (k, kk)], ll.Set(y, it(b, t, j), fma, "y =+ x * w")))
    opt = optimize_proc(code, name="dense_dx", settings=VirtualizeSettings(reassociate=False)).llc
    assert "contraction into y" in ll.to_doc(opt) and _zeroed(opt) == set()
    assert not any(isinstance(s, ll.Set) and any(isinstance(g, ll.Get) and g.tn is y for g in ll.iter_scalars(s.llsc))
                   for s in ll.iter_stmts(opt))
    ins = _with_nan_outputs(inputs_for(x, w, seed=sum(shape)), (y,))
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[y]
    np.testing.assert_array_equal(interpret.run(opt, {tn: v.copy() for tn, v in ins.items()})[y], want)
    for threads in (1, 2):
        got = run_in_c(opt, ins, name="dense_dx", options=cc.CcOptions(threads=threads)).array(y)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(want, np.einsum("btk,jk->btj", ins[x].astype(np.float64), ins[w].astype(np.float64)),
                               rtol=1e-5, atol=1e-5)


def test_a_chunked_weight_gradient_keeps_its_fill_and_loads():
    """Chunks after the first add into what the first stored: the blocks load, the fill stays.
    (160 columns: their panels over 18 x 64 rows overfill half an AVX-512 L2, so it chunks
    there too.)"""
    from test_schedule_weight_grads import weight_grad

    code, x, dy, w = weight_grad(18, 64, 96, 160)
    opt = optimize_proc(code, name="wgrad", settings=VirtualizeSettings(reassociate=False)).llc
    assert "-step k chunks" in ll.to_doc(opt) and _zeroed(opt) == {"w"}


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
@pytest.mark.parametrize("batched", [False, True], ids=["rows", "batch"])
def test_a_threaded_contraction_into_a_fresh_node_is_bit_identical(machine, batched):
    """The scheduler's blocks on threads (`parallel_min_work=1`: the batch loop, or the row
    blocks of each panel), started at zero; the fill dropped; gcc at one and two threads gives
    the interpreter's values on the unscheduled code."""
    bb, tt, kk, jj = (3, 13, 20, 37) if batched else (1, 29, 20, 37)
    x, w, y = Tnode("x", (bb, tt, kk)), Tnode("w", (jj, kk)), Tnode("y", (bb, tt, jj))
    b, t, j, k = (get_symbol(s) for s in "btjk")
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(x, it(b, t, k)), ll.Get(w, it(j, k)), ll.Get(y, it(b, t, j)))
    code = ll.seq(ll.ZeroOut(y), _nest([(b, bb), (t, tt), (j, jj), (k, kk)], ll.Set(y, it(b, t, j), fma, "y =+ x * w")))
    blocking = Blocking(min_work=1, parallel_min_work=1, machine=MACHINES[machine])
    sched = first_writes(schedule_llc(code, VirtualizeSettings(reassociate=False), blocking))
    assert _zeroed(sched) == set() and any(isinstance(s, ll.ForLoop) and s.parallel for s in ll.iter_stmts(sched))
    ins = _with_nan_outputs(inputs_for(x, w, seed=bb + tt), (y,))
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[y]
    np.testing.assert_array_equal(interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[y], want)
    for threads in (1, 2):
        got = run_in_c(sched, ins, name="threaded_dx", options=cc.CcOptions(threads=threads)).array(y)
        np.testing.assert_array_equal(got, want)
