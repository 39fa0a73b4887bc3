"""The scope_sums stage (`ir/sched/scope_sums.py`): a sum computed inside an expression (the
softmax backward's row sum `v := v - dP * P / total`) split over lanes computes the same
values under the interpreter and gcc (bit for bit, on one and two threads), within float32
rounding of the sequential sum; clipped (causal) and whole loops give the same bits."""

from __future__ import annotations

import re

import numpy as np
import pytest

from einjit.backends.c_syntax import render_routine
from einjit.backends.cc import toolchain as cc
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol, make_affine
from einjit.ir.optimize import STAGES
from einjit.ir.sched.scope_sums import split_scope_sums
from einjit.ir.tnode import Tnode
from test_causal_clip import _clipped_as_full
from test_schedule import OFF, ON, local_nodes, run_in_c


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def row_sums(n, h, m, *, op=ops.Binop.SUB, prec=ops.single, causal=False):
    """`r[i, j] = where(g[i, j] < 1, 0, -sum over k of a[i, j, k] * b[i, j, k] / c[i, j])`, the
    sum a local scope the way lowering writes softmax's backward. With `causal`, the scope
    loop is the causal stage's: chunks of 8 kept while `8 * chunk < j + 1`, a whole loop over
    each chunk (the terms past the diagonal must then be zeros: `a` is zero there)."""
    a, b = Tnode("a", (n, h, m), prec), Tnode("b", (n, h, m), prec)
    c, g, r = Tnode("c", (n, h), prec), Tnode("g", (n, h), prec), Tnode("r", (n, h), prec)
    i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
    sid = ll.fresh_scope_id(r)

    def term(at):
        idcs = (Iterator(i), Iterator(j), at)
        return ll.Binop(ops.Binop.DIV, ll.Binop(ops.Binop.MUL, ll.Get(a, idcs), ll.Get(b, idcs)), ll.Get(c, it(i, j)))

    if causal:
        chunk, lane = get_symbol("c"), get_symbol("l")
        step = ll.SetLocal(sid, ll.Binop(op, ll.GetLocal(sid), term(make_affine(((8, chunk), (1, lane))))))
        loop = ll.ForLoop(chunk, 0, m // 8 - 1, ll.ForLoop(lane, 0, 7, step),
                          stop=ll.LoopClip(make_affine(((1, j),), 1), 8))
    else:
        loop = ll.ForLoop(k, 0, m - 1, ll.SetLocal(sid, ll.Binop(op, ll.GetLocal(sid), term(Iterator(k)))))
    value = ll.Ternop(ops.Ternop.WHERE, ll.Binop(ops.Binop.CMPLT, ll.Get(g, it(i, j)), ll.Constant(1.0)),
                      ll.Constant(0.0), ll.LocalScope(sid, loop, it(i, j)))
    code = ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, h - 1, ll.Set(r, it(i, j), value)))
    return code, (a, b, c, g), r


def inputs(nodes, seed=0, causal=False):
    rng = np.random.default_rng(seed)
    a, b, c, g = nodes
    values = {tn: rng.standard_normal(tn.dims).astype(np.float32) for tn in (a, b)}
    if causal:
        values[a] = np.where(np.arange(a.dims[2]) < np.arange(a.dims[1])[:, None] + 1, values[a], 0).astype(np.float32)
    values[c] = rng.uniform(1.0, 3.0, c.dims).astype(np.float32)
    values[g] = rng.uniform(0.5, 3.0, g.dims).astype(np.float32)
    return values


def numpy_sums(values, nodes):
    a, b, c, g = (values[tn].astype(np.float64) for tn in nodes)
    return np.where(g < 1, 0.0, -(a * b / c[..., None]).sum(axis=-1))


def run_c(code, values, out, threads=1):
    return run_in_c(code, values, options=cc.CcOptions(threads=threads)).array(out).copy()


def test_split_scope_sums_are_the_same_bits_in_c_and_the_interpreter():
    code, nodes, r = row_sums(16, 8, 64)
    split = split_scope_sums(code, ON)
    assert local_nodes(split) == {"lanes"}
    c_code = render_routine("scope_sums", split).code
    assert re.search(r"float lanes_\d+\[8\]", c_code)
    assert re.search(r"8 partial sums into r\w* \(reassociated\)", c_code)
    values = inputs(nodes)
    want = interpret.run(split, {tn: v.copy() for tn, v in values.items()})[r]
    np.testing.assert_array_equal(run_c(split, values, r), want)
    sequential = interpret.run(code, {tn: v.copy() for tn, v in values.items()})[r]
    np.testing.assert_allclose(want, sequential, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(want, numpy_sums(values, nodes), rtol=1e-5, atol=1e-5)
    assert (want == 0).sum() == (values[nodes[3]] < 1).sum()  # the where's other branch is kept


def test_an_added_sum_is_split_too():
    code, nodes, r = row_sums(16, 8, 64, op=ops.Binop.ADD)
    split = split_scope_sums(code, ON)
    assert split != code
    values = inputs(nodes, seed=3)
    want = interpret.run(split, {tn: v.copy() for tn, v in values.items()})[r]
    np.testing.assert_array_equal(run_c(split, values, r), want)
    np.testing.assert_allclose(want, -numpy_sums(values, nodes), rtol=1e-5, atol=1e-5)


def test_a_clipped_scope_keeps_its_chunks_as_lanes_and_equals_the_whole_loop():
    """The causal stage's chunk loop keeps its clip around the lanes; the whole loop's split
    adds the same terms into the same lanes plus zeros: the same bits."""
    clipped, nodes, r = row_sums(8, 64, 64, causal=True)
    whole, whole_nodes, whole_r = row_sums(8, 64, 64)
    split = split_scope_sums(clipped, ON)
    assert "lanes" in local_nodes(split)
    assert "stop 8*" in ll.to_doc(split)
    values = inputs(nodes, seed=5, causal=True)
    got = run_c(split, values, r)
    np.testing.assert_array_equal(got, interpret.run(split, {tn: v.copy() for tn, v in values.items()})[r])
    whole_values = {w: values[c] for w, c in zip(whole_nodes, nodes, strict=True)}
    np.testing.assert_array_equal(run_c(split_scope_sums(whole, ON), whole_values, whole_r), got)


def test_two_threads_give_each_thread_its_own_lanes():
    code, nodes, r = row_sums(64, 64, 64)
    split = split_scope_sums(code, ON)
    values = inputs(nodes, seed=7)
    one = run_c(split, values, r)
    np.testing.assert_array_equal(run_c(split, values, r, threads=2), one)
    np.testing.assert_allclose(one, numpy_sums(values, nodes), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,h,m", [(1, 4, 64), (16, 8, 37), (16, 64, 2)])
def test_small_or_uneven_sums_are_left_alone(n, h, m):
    code, *_ = row_sums(n, h, m)
    assert split_scope_sums(code, ON) == code


def test_sums_stay_sequential_without_reassociation_and_in_integers():
    code, *_ = row_sums(16, 8, 64)
    assert split_scope_sums(code, OFF) == code
    code, *_ = row_sums(16, 8, 64, prec=ops.int32)
    assert split_scope_sums(code, ON) == code


def test_the_stage_runs_after_the_causal_stage():
    names = [s.name for s in STAGES]
    assert names.index("causal") < names.index("scope_sums") < names.index("first_writes")


def test_causal_attention_step_splits_its_softmax_backward_sum(tmp_path, monkeypatch):
    """At T=64 the softmax backward's scope sum is split (clipped, in the causal layer) and the
    training step on two threads is bit-identical to the full loops' (whole, split the same
    way, on a machine of 16-float vectors)."""
    monkeypatch.setenv("EINJIT_MACHINE", "avx512")
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(tmp_path))
    _clipped_as_full("sums", 2, shape=(1, 64, 16))
    for variant in ("clipped", "full"):
        assert "8 partial sums into" in (tmp_path / f"sums_{variant}.scope_sums.ll").read_text()
