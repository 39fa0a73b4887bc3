"""Nodes recomputed at every read (`ir/passes/recompute.py`): a pointwise `+ - *` of one
full-size operand and broadcast ones, read streaming, however often — LayerNorm's `x - mean`
and `(x - mean) * rsqrt`. Which nodes qualify, on hand-built code; and that the optimized code,
with them inlined, computes what the unoptimized code computes, in the interpreter and by gcc."""

from __future__ import annotations

import numpy as np
import pytest

from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.optimize import VirtualizeSettings, optimize_proc
from einjit.ir.passes.recompute import MAX_READS, recomputable
from einjit.ir.tnode import Tnode, hosted

B = ops.Binop
R, C = 6, 16


def _node(label, dims, host=False):
    tn = Tnode(label, dims, ops.single)
    if host:
        tn.update_memory_mode(hosted(), 0)
    return tn


def _rows(body):
    """`body(i, j)` over the rows `i` and columns `j`."""
    i, j = get_symbol(), get_symbol()
    return ll.ForLoop(i, 0, R - 1, ll.ForLoop(j, 0, C - 1, body(Iterator(i), Iterator(j))))


def _row_loop(body):
    i = get_symbol()
    return ll.ForLoop(i, 0, R - 1, body(Iterator(i)))


def _get(tn, *idcs):
    return ll.Get(tn, tuple(idcs))


def _centre(x, mean, out, centred):
    """`mean[i] = sum_j x[i, j] / C; centred = x - mean[i]` and `reads` statements reading
    `centred` into `out`."""
    return [
        ll.ZeroOut(mean),
        _rows(lambda i, j: ll.Set(mean, (i,), ll.Ternop(ops.Ternop.FMA, _get(x, i, j), ll.Constant(1 / C),
                                                         _get(mean, i)))),
        _rows(lambda i, j: ll.Set(centred, (i, j), ll.Binop(B.SUB, _get(x, i, j), _get(mean, i)))),
    ]


def _reads(src, out, n):
    """`out[i, j] += src[i, j] * (k + 2)`, `n` reads of `src` in all, each as a factor."""
    stmts = []
    for k in range(n):
        stmts.append(_rows(lambda i, j, k=k: ll.Set(out, (i, j), ll.Binop(
            B.ADD, _get(out, i, j), ll.Binop(B.MUL, _get(src, i, j), ll.Constant(k + 2.0))))))
    return stmts


def _add_row_values(out, v):
    """`out[i, j] += v[i]`: a read of `v` per column, as a broadcast operand is read."""
    return _rows(lambda i, j: ll.Set(out, (i, j), ll.Binop(B.ADD, _get(out, i, j), _get(v, i))))


def _nodes():
    return (_node("x", (R, C), host=True), _node("mean", (R,)), _node("out", (R, C), host=True),
            _node("centred", (R, C)))


def test_a_broadcast_difference_read_several_times_is_recomputable():
    x, mean, out, centred = _nodes()
    code = ll.seq(ll.ZeroOut(out), *_centre(x, mean, out, centred), *_reads(centred, out, 3))
    assert recomputable(code) == {centred}


def test_more_reads_than_the_bound_are_not():
    x, mean, out, centred = _nodes()
    code = ll.seq(ll.ZeroOut(out), *_centre(x, mean, out, centred), *_reads(centred, out, MAX_READS + 1))
    assert centred not in recomputable(code)


def test_two_full_size_operands_are_not():
    """`x + y` recomputed reads two streams where the stored node is one."""
    x, y, out, s = _node("x", (R, C), True), _node("y", (R, C), True), _node("out", (R, C), True), _node("s", (R, C))
    code = ll.seq(ll.ZeroOut(out), _rows(lambda i, j: ll.Set(s, (i, j), ll.Binop(B.ADD, _get(x, i, j), _get(y, i, j)))),
                  *_reads(s, out, 2))
    assert recomputable(code) == set()


def test_a_node_read_by_a_loop_that_does_not_index_it_is_not():
    """A contraction operand: each cell read once per output column, where a recomputation
    would sit in the innermost loop."""
    x, mean, out, centred = _nodes()
    w, y = _node("w", (C, C), True), _node("y", (R, C), True)
    k = get_symbol()
    matmul = _rows(lambda i, j: ll.ForLoop(k, 0, C - 1, ll.Set(y, (i, j), ll.Ternop(
        ops.Ternop.FMA, _get(centred, i, Iterator(k)), _get(w, Iterator(k), j), _get(y, i, j)))))
    code = ll.seq(ll.ZeroOut(out), ll.ZeroOut(y), *_centre(x, mean, out, centred), *_reads(centred, out, 1), matmul)
    assert recomputable(code) == set()


def test_an_operand_inlined_as_a_single_use_is_not_read_through():
    """`s = x + y` read once, by `t = s * scale[i]`: `s` is inlined into `t`, so recomputing `t`
    would read both `x` and `y` at every read of `t`."""
    x, y, out = _node("x", (R, C), True), _node("y", (R, C), True), _node("out", (R, C), True)
    s, t, scale = _node("s", (R, C)), _node("t", (R, C)), _node("scale", (R,), True)
    code = ll.seq(ll.ZeroOut(out),
                  _rows(lambda i, j: ll.Set(s, (i, j), ll.Binop(B.ADD, _get(x, i, j), _get(y, i, j)))),
                  _rows(lambda i, j: ll.Set(t, (i, j), ll.Binop(B.MUL, _get(s, i, j), _get(scale, i)))),
                  *_reads(t, out, 3))
    assert recomputable(code) == set()


def _inverse(mean, inv):
    """`inv[i] = 1 / (1 + mean[i] * mean[i])`: no arithmetic of a full-size operand."""
    return _row_loop(lambda i: ll.Set(inv, (i,), ll.Unop(ops.Unop.RECIP, ll.Binop(
        B.ADD, ll.Constant(1.0), ll.Binop(B.MUL, _get(mean, i), _get(mean, i))))))


def test_a_chain_of_broadcast_operations_is_recomputable():
    """`(x - mean) * inv`: the product reads the difference, recomputable itself, and `inv`,
    read twice, so stored."""
    x, mean, out, centred = _nodes()
    inv, normed = _node("inv", (R,)), _node("normed", (R, C))
    code = ll.seq(ll.ZeroOut(out), *_centre(x, mean, out, centred), _inverse(mean, inv),
                  _rows(lambda i, j: ll.Set(normed, (i, j), ll.Binop(B.MUL, _get(centred, i, j), _get(inv, i)))),
                  *_reads(centred, out, 2), *_reads(normed, out, 2), _add_row_values(out, inv))
    assert recomputable(code) == {centred, normed}


@pytest.mark.parametrize("added", [True, False])
def test_a_broadcast_product_added_to_something_is_not(added):
    """`t = x * s[i]` read in `out + t` (or `out + t * 1`): inlined, the simplifier would
    contract the product and the addition into one FMA, rounded once where the stored product
    was rounded twice. Read as a factor (`out + t * 2` is `fma(t, 2, out)` either way), it is
    recomputed."""
    x, out, t, s = _node("x", (R, C), True), _node("out", (R, C), True), _node("t", (R, C)), _node("s", (R,), True)
    product = _rows(lambda i, j: ll.Set(t, (i, j), ll.Binop(B.MUL, _get(x, i, j), _get(s, i))))
    if added:
        reads = [_rows(lambda i, j: ll.Set(out, (i, j), ll.Binop(B.ADD, _get(out, i, j), _get(t, i, j)))),
                 _rows(lambda i, j: ll.Set(out, (i, j), ll.Binop(B.ADD, _get(out, i, j), ll.Binop(
                     B.MUL, ll.Constant(1.0), _get(t, i, j)))))]
    else:
        reads = _reads(t, out, 3)
    code = ll.seq(ll.ZeroOut(out), product, *reads)
    assert recomputable(code) == (set() if added else {t})


def test_a_reduction_or_a_division_is_not():
    x, mean, out, centred = _nodes()
    q = _node("q", (R, C))
    code = ll.seq(ll.ZeroOut(out), *_centre(x, mean, out, centred),
                  _rows(lambda i, j: ll.Set(q, (i, j), ll.Binop(B.DIV, _get(x, i, j), _get(mean, i)))),
                  *_reads(centred, out, 2), *_reads(q, out, 2))
    assert recomputable(code) == {centred}


@pytest.mark.parametrize("on", [True, False])
def test_recomputed_nodes_compute_what_the_unoptimized_code_computes(on):
    """The interpreter on the optimized code against the unoptimized code (within float32
    rounding: inlined, `out + normed` contracts into an FMA of the product, as any inlined node
    does) and gcc against the interpreter on the optimized code, bit for bit."""
    x, mean, out, centred = _nodes()
    inv, normed = _node("inv", (R,)), _node("normed", (R, C))
    code = ll.seq(ll.ZeroOut(out), *_centre(x, mean, out, centred), _inverse(mean, inv),
                  _rows(lambda i, j: ll.Set(normed, (i, j), ll.Binop(B.MUL, _get(centred, i, j), _get(inv, i)))),
                  *_reads(centred, out, 3), *_reads(normed, out, 2),
                  _add_row_values(out, inv))
    xv = np.random.default_rng(5).standard_normal((R, C)).astype(np.float32)
    want = interpret.run(code, {x: xv.copy(), out: np.zeros((R, C), np.float32)})[out]
    name = f"recompute{int(on)}"
    opt = optimize_proc(code, name=name, settings=VirtualizeSettings(inline_broadcast_arithmetic=on))
    assert (centred.is_virtual() and normed.is_virtual()) == on
    assert not inv.is_virtual() and not mean.is_virtual()
    got = interpret.run(opt.llc, {x: xv.copy(), out: np.zeros((R, C), np.float32)})[out]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    ctx = run_once(opt, {x: xv.copy(), out: np.zeros((R, C), np.float32)}, name=name, context=CcBackend().init(name))
    np.testing.assert_array_equal(ctx.array(out), got)
