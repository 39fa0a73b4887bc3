"""Code produced by lowering assignments, compiled and compared with the interpreter bit for bit."""

from __future__ import annotations

import numpy as np

from einjit.backends.cc.backend import run_once
from einjit.ir import assignments as asg
from einjit.ir import interpret, ops
from einjit.ir.indexing import Affine, Iterator, Projections, SubAxis, get_static_symbol, get_symbol
from einjit.ir.tnode import Tnode


def run_both(code, inputs, bindings=(), values=None):
    """The compiled routine's arrays and the interpreter's, from the same inputs."""
    ctx = run_once(code, inputs, bindings=bindings, values=values, name="lowered")
    ref = interpret.run(code, {tn: np.array(v, dtype=tn.prec.dtype) for tn, v in inputs.items()},
                        {s.symbol: v for s, v in (values or {}).items()})
    return ctx, ref


def test_lowered_matmul():
    n, m, p = 9, 7, 12
    a, b, c = Tnode("a", (n, m)), Tnode("b", (m, p)), Tnode("c", (n, p))
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    proj = Projections((n, p, m), (i, j, k), (n, p), ((n, m), (m, p)), (Iterator(i), Iterator(j)),
                       ((Iterator(i), Iterator(k)), (Iterator(k), Iterator(j))), "matmul")
    code = asg.to_low_level(asg.AccumBinop(True, ops.Binop.ADD, ops.Binop.MUL, c, asg.Node(a), asg.Node(b),
                                           asg.Lazy.of(proj)))
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((n, m)).astype(np.float32), rng.standard_normal((m, p)).astype(np.float32)
    ctx, ref = run_both(code, {a: x, b: y})
    np.testing.assert_array_equal(ctx.array(c), ref[c])
    np.testing.assert_allclose(ctx.array(c), x @ y, rtol=1e-5, atol=1e-5)


def test_lowered_padded_strided_convolution():
    n_in, kw, n_out = 10, 3, 5
    x, w, out = Tnode("x", (n_in,)), Tnode("w", (kw,)), Tnode("out", (n_out,))
    o, q = get_symbol(), get_symbol()
    proj = Projections((n_out, kw), (o, q), (n_out,), ((n_in,), (kw,)), (Iterator(o),),
                       ((Affine(((2, o), (1, q)), -1),), (Iterator(q),)), "conv")
    code = asg.to_low_level(asg.AccumBinop(True, ops.Binop.ADD, ops.Binop.MUL, out, asg.Node(x), asg.Node(w),
                                           asg.Lazy.of(proj)))
    xv, wv = np.arange(1, n_in + 1, dtype=np.float32), np.array([1, 10, 100], dtype=np.float32)
    ctx, ref = run_both(code, {x: xv, w: wv})
    padded = np.concatenate([[0], xv, [0]])
    np.testing.assert_array_equal(ctx.array(out), ref[out])
    np.testing.assert_array_equal(ctx.array(out), [padded[2 * i:2 * i + 3] @ wv for i in range(n_out)])


def test_lowered_fetches_and_uniform_hash():
    s = get_static_symbol(3)
    data, row, offs = Tnode("data", (3, 4)), Tnode("row", (4,)), Tnode("offs", (2, 3))
    rnd, counter = Tnode("rnd", (2, 8), ops.double), Tnode("counter", (2,), ops.double)
    i = get_symbol()
    vec_proj = Projections((2,), (i,), (2, 8), ((2,),), (Iterator(i), SubAxis()), ((Iterator(i),),), "rand")
    code = asg.to_low_level(asg.sequence(
        asg.Fetch(row, asg.Slice(s, data)),
        asg.Fetch(offs, asg.RangeOverOffsets()),
        asg.SetVecUnop(ops.VecUnop.UNIFORM_HASH, rnd, asg.Node(counter), asg.Lazy.of(vec_proj))))
    dv = np.arange(12, dtype=np.float32).reshape(3, 4)
    ctx, ref = run_both(code, {data: dv, counter: np.array([3.0, 11.0])}, bindings=(s,), values={s: 2})
    for tn in (row, offs, rnd):
        np.testing.assert_array_equal(ctx.array(tn), ref[tn])
    np.testing.assert_array_equal(ctx.array(row), dv[2])
    np.testing.assert_array_equal(ctx.array(rnd)[1], ops.uniform_hash(11, 8))
