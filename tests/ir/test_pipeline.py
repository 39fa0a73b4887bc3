"""Hand-built assignments through the whole compiler core, four ways: the interpreter on
unoptimized and optimized code, gcc on unoptimized and optimized code — all equal to NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import assignments as asg
from einjit.ir import interpret, ops
from einjit.ir.indexing import Affine, FixedIdx, Iterator, Projections, get_static_symbol, get_symbol
from einjit.ir.optimize import optimize_proc
from einjit.ir.tnode import Tnode, hosted

TOL = {ops.double: 1e-12, ops.single: 1e-5}


def node(label, dims, prec, host=True):
    tn = Tnode(label, tuple(dims), prec)
    if host:
        tn.update_memory_mode(hosted(), 0)
    return tn


def run_four_ways(asgns, inputs: dict, outputs: dict, bindings=None):
    """inputs: {tn: array}; outputs: {tn: expected array}. Returns nothing; asserts."""
    bindings = bindings or {}
    static_syms = tuple(bindings)
    env = {s.symbol: v for s, v in bindings.items()}
    prec = next(iter(outputs)).prec
    tol = TOL[prec]

    def check(arrays, how):
        for tn, want in outputs.items():
            np.testing.assert_allclose(arrays[tn], want, rtol=tol, atol=tol, err_msg=f"{how}: {tn.debug_name()}")

    def fresh_inputs():
        return {tn: np.array(v, dtype=tn.prec.dtype) for tn, v in inputs.items()}

    def via_gcc(code, name):
        ctx = run_once(code, fresh_inputs(), bindings=static_syms, values=bindings, name=name,
                       context=CcBackend().init(name))
        return {tn: ctx.array(tn) for tn in outputs}

    llc = asg.to_low_level(asgns)
    check(interpret.run(llc, fresh_inputs(), env), "interpreter, unoptimized")
    check(via_gcc(llc, "unoptimized"), "gcc, unoptimized")
    opt = optimize_proc(llc, name="optimized", static_indices=frozenset(s.symbol for s in static_syms))
    check(interpret.run(opt.llc, fresh_inputs(), env), "interpreter, optimized")
    check(via_gcc(opt, "optimized"), "gcc, optimized")


def proj(space, lhs_dims, rhs_dims, lhs, rhs, info=""):
    syms = tuple(space.keys())
    return asg.Lazy.of(Projections(tuple(space.values()), syms, tuple(lhs_dims), tuple(map(tuple, rhs_dims)),
                                   tuple(lhs), tuple(map(tuple, rhs)), info))


PRECS = [ops.double, ops.single]


@pytest.fixture
def rng():
    return np.random.default_rng(7)


@pytest.mark.parametrize("prec", PRECS, ids=lambda p: p.name)
def test_pointwise_with_broadcasting(prec, rng):
    a, b = node("a", (3, 4), prec), node("b", (1, 4), prec)
    t, c = node("tmp", (3, 4), prec, False), node("c", (3, 4), prec)
    i, j = get_symbol(), get_symbol()
    pb = proj({i: 3, j: 4}, (3, 4), [(3, 4), (1, 4)], [Iterator(i), Iterator(j)],
              [[Iterator(i), Iterator(j)], [FixedIdx(0), Iterator(j)]])
    pu = proj({i: 3, j: 4}, (3, 4), [(3, 4)], [Iterator(i), Iterator(j)], [[Iterator(i), Iterator(j)]])
    code = asg.sequence(asg.AccumBinop(False, ops.Binop.ARG2, ops.Binop.ADD, t, asg.Node(a), asg.Node(b), pb),
                        asg.AccumUnop(False, ops.Binop.ARG2, ops.Unop.EXP, c, asg.Node(t), pu))
    av, bv = rng.standard_normal((3, 4)), rng.standard_normal((1, 4))
    run_four_ways(code, {a: av, b: bv}, {c: np.exp(av.astype(prec.dtype) + bv.astype(prec.dtype))})


@pytest.mark.parametrize("prec", PRECS, ids=lambda p: p.name)
def test_sum_reduction(prec, rng):
    a, s = node("a", (5, 7), prec), node("s", (5,), prec)
    i, j = get_symbol(), get_symbol()
    p = proj({i: 5, j: 7}, (5,), [(5, 7)], [Iterator(i)], [[Iterator(i), Iterator(j)]])
    av = rng.standard_normal((5, 7))
    run_four_ways(asg.AccumUnop(True, ops.Binop.ADD, ops.Unop.IDENTITY, s, asg.Node(a), p), {a: av},
                  {s: av.sum(axis=1)})


@pytest.mark.parametrize("prec", PRECS, ids=lambda p: p.name)
def test_matmul(prec, rng):
    a, b, c = node("a", (4, 6), prec), node("b", (6, 5), prec), node("c", (4, 5), prec)
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    p = proj({i: 4, j: 5, k: 6}, (4, 5), [(4, 6), (6, 5)], [Iterator(i), Iterator(j)],
             [[Iterator(i), Iterator(k)], [Iterator(k), Iterator(j)]])
    av, bv = rng.standard_normal((4, 6)), rng.standard_normal((6, 5))
    run_four_ways(asg.AccumBinop(True, ops.Binop.ADD, ops.Binop.MUL, c, asg.Node(a), asg.Node(b), p),
                  {a: av, b: bv}, {c: av @ bv})


@pytest.mark.parametrize("prec", PRECS, ids=lambda p: p.name)
def test_transposition(prec, rng):
    a, t = node("a", (3, 5), prec), node("t", (5, 3), prec)
    i, j = get_symbol(), get_symbol()
    p = proj({i: 3, j: 5}, (5, 3), [(3, 5)], [Iterator(j), Iterator(i)], [[Iterator(i), Iterator(j)]])
    av = rng.standard_normal((3, 5))
    run_four_ways(asg.AccumUnop(False, ops.Binop.ARG2, ops.Unop.IDENTITY, t, asg.Node(a), p), {a: av}, {t: av.T})


def conv1d_reference(x, w, stride, dilation, padding, n_out):
    out = np.zeros(n_out)
    for o in range(n_out):
        for k in range(len(w)):
            pos = stride * o + dilation * k - padding
            if 0 <= pos < len(x):
                out[o] += x[pos] * w[k]
    return out


@pytest.mark.parametrize("prec", PRECS, ids=lambda p: p.name)
@pytest.mark.parametrize("stride,dilation,padding", [(1, 1, 0), (2, 1, 1), (2, 2, 1), (1, 3, 2)])
def test_conv1d(prec, stride, dilation, padding, rng):
    n, kw = 11, 3
    n_out = (n + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
    x, w, y = node("x", (n,), prec), node("w", (kw,), prec), node("y", (n_out,), prec)
    o, k = get_symbol("o"), get_symbol("k")
    p = proj({o: n_out, k: kw}, (n_out,), [(n,), (kw,)], [Iterator(o)],
             [[Affine(((stride, o), (dilation, k)), -padding)], [Iterator(k)]])
    xv, wv = rng.standard_normal(n), rng.standard_normal(kw)
    run_four_ways(asg.AccumBinop(True, ops.Binop.ADD, ops.Binop.MUL, y, asg.Node(x), asg.Node(w), p),
                  {x: xv, w: wv}, {y: conv1d_reference(xv, wv, stride, dilation, padding, n_out)})


@pytest.mark.parametrize("prec", PRECS, ids=lambda p: p.name)
def test_conv2d_strided_dilated_padded(prec, rng):
    h, wd, kh, kw, s, d, pad = 9, 8, 3, 2, 2, 2, 1
    oh = (h + 2 * pad - d * (kh - 1) - 1) // s + 1
    ow = (wd + 2 * pad - d * (kw - 1) - 1) // s + 1
    x, w, y = node("img", (h, wd), prec), node("kern", (kh, kw), prec), node("out", (oh, ow), prec)
    a, b, u, v = get_symbol("a"), get_symbol("b"), get_symbol("u"), get_symbol("v")
    p = proj({a: oh, b: ow, u: kh, v: kw}, (oh, ow), [(h, wd), (kh, kw)], [Iterator(a), Iterator(b)],
             [[Affine(((s, a), (d, u)), -pad), Affine(((s, b), (d, v)), -pad)], [Iterator(u), Iterator(v)]])
    xv, wv = rng.standard_normal((h, wd)), rng.standard_normal((kh, kw))
    want = np.zeros((oh, ow))
    padded = np.pad(xv, pad)
    for i in range(oh):
        for j in range(ow):
            for p_ in range(kh):
                for q in range(kw):
                    want[i, j] += padded[s * i + d * p_, s * j + d * q] * wv[p_, q]
    run_four_ways(asg.AccumBinop(True, ops.Binop.ADD, ops.Binop.MUL, y, asg.Node(x), asg.Node(w), p),
                  {x: xv, w: wv}, {y: want})


@pytest.mark.parametrize("prec", PRECS, ids=lambda p: p.name)
def test_slice_by_static_symbol(prec, rng):
    data, out = node("data", (4, 3, 2), prec), node("batch", (3, 2), prec)
    sym = get_static_symbol(4, "b")
    dv = rng.standard_normal((4, 3, 2))
    for b in (0, 3):
        run_four_ways(asg.Fetch(out, asg.Slice(sym, data)), {data: dv}, {out: dv[b]}, bindings={sym: b})


def test_fixed_index_out_of_range_is_a_clear_error():
    a, s = node("a", (3,), ops.double), node("s", (1,), ops.double)
    i = get_symbol()
    p = proj({i: 1}, (1,), [(3,)], [FixedIdx(0)], [[FixedIdx(5)]])
    with pytest.raises(asg.LoweringError, match=r"fixed index 5 out of range for axis 0 of argument a#"):
        asg.to_low_level(asg.AccumUnop(False, ops.Binop.ARG2, ops.Unop.IDENTITY, s, asg.Node(a), p))
    ok = proj({i: 1}, (1,), [(3,)], [FixedIdx(0)], [[FixedIdx(2)]])
    llc = asg.to_low_level(asg.AccumUnop(False, ops.Binop.ARG2, ops.Unop.IDENTITY, s, asg.Node(a), ok))
    arrays = interpret.run(llc, {a: np.array([1.0, 2.0, 3.0])})
    assert arrays[s][0] == 3.0


def test_printers_show_the_loops_in_both_styles():
    a, s = node("a", (2, 3), ops.double), node("s", (2,), ops.double)
    i, j = get_symbol("i"), get_symbol("j")
    p = proj({i: 2, j: 3}, (2,), [(2, 3)], [Iterator(i)], [[Iterator(i), Iterator(j)]])
    llc = asg.to_low_level(asg.AccumUnop(True, ops.Binop.ADD, ops.Unop.IDENTITY, s, asg.Node(a), p))
    from einjit.ir import low_level as ll
    cd_style, c_style = ll.to_doc(llc), ll.to_doc_cstyle(llc)
    assert "for i" in cd_style and " to 2 {" in cd_style and f"{s.name}[" in cd_style and ":= (" in cd_style
    assert "for (int i" in c_style and "<= 2; ++j" in c_style and f"{s.name}[" in c_style and " = (" in c_style
