"""Compiled routines against NumPy and the reference interpreter, with real values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from einjit.backends.c_syntax import CSyntax, ParamKind
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import interpret, ops, tnode
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, FixedIdx, IntRef, Iterator, get_static_symbol, get_symbol
from einjit.ir.tnode import Tnode

B, U, T = ll.Binop, ll.Unop, ll.Ternop
NO_INTERCHANGE = cc.CcOptions(syntax=CSyntax(interchange_loops=False))
INTERCHANGE = cc.CcOptions(syntax=CSyntax(interchange_loops=True))


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def loop1(n, make):
    i = get_symbol()
    return ll.ForLoop(i, 0, n - 1, make(i))


def interpreted(code, inputs, bindings=None, merge_buffers=None):
    arrays = {tn: np.array(v, dtype=tn.prec.dtype) for tn, v in inputs.items()}
    return interpret.run(code, arrays, bindings or {}, merge_buffers or {})


def test_pointwise_chain(run_c):
    n = 1000
    a, b, c, d, out = (Tnode(x, (n,)) for x in "abcdo")
    rng = np.random.default_rng(1)
    vals = {t: rng.standard_normal(n).astype(np.float32) for t in (a, b, c, d)}
    i = get_symbol()
    g = {t: ll.Get(t, it(i)) for t in (a, b, c, d)}
    expr = U(ops.Unop.RELU, B(ops.Binop.SUB, B(ops.Binop.MUL, B(ops.Binop.ADD, B(ops.Binop.MUL, U(
        ops.Unop.EXP, g[a]), g[b]), g[c]), ll.Constant(0.5)), g[d]))
    code = ll.ForLoop(i, 0, n - 1, ll.Set(out, it(i), expr))
    ctx = run_c(code, vals)
    va, vb, vc, vd = vals.values()
    np.testing.assert_allclose(ctx.array(out), np.maximum((np.exp(va) * vb + vc) * 0.5 - vd, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ctx.array(out), interpreted(code, vals)[out], rtol=1e-5, atol=1e-6)


def test_reduction_with_local_scope(run_c):
    a, out = Tnode("a", (5, 7)), Tnode("out", (5, 2))
    i, k, k2 = get_symbol(), get_symbol(), get_symbol()
    vmax, vsum = ll.fresh_scope_id(out), ll.fresh_scope_id(out)
    row_max = ll.LocalScope(vmax, ll.seq(
        ll.SetLocal(vmax, ll.Constant(-np.inf)),
        ll.ForLoop(k, 0, 6, ll.SetLocal(vmax, B(ops.Binop.MAX, ll.GetLocal(vmax), ll.Get(a, it(i, k)))))), it(i))
    row_sum = ll.LocalScope(vsum, ll.ForLoop(k2, 0, 6, ll.SetLocal(vsum, B(
        ops.Binop.ADD, ll.GetLocal(vsum), ll.Get(a, it(i, k2))))), it(i))
    code = ll.ForLoop(i, 0, 4, ll.seq(
        ll.Set(out, (Iterator(i), FixedIdx(0)), row_max),
        ll.Set(out, (Iterator(i), FixedIdx(1)), B(ops.Binop.MUL, row_sum, ll.Constant(2.0)))))
    x = np.random.default_rng(2).standard_normal((5, 7)).astype(np.float32)
    got = run_c(code, {a: x}).array(out)
    np.testing.assert_allclose(got[:, 0], x.max(axis=1))
    np.testing.assert_allclose(got[:, 1], 2 * x.sum(axis=1), rtol=1e-6)
    np.testing.assert_array_equal(got, interpreted(code, {a: x})[out])


def matmul_code(n, m, p):
    a, b, c = Tnode("a", (n, m)), Tnode("b", (m, p)), Tnode("c", (n, p))
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    acc = ll.Set(c, it(i, j), B(ops.Binop.ADD, ll.Get(c, it(i, j)), B(ops.Binop.MUL, ll.Get(a, it(i, k)),
                                                                       ll.Get(b, it(k, j)))), "c =+ a * b")
    code = ll.seq(ll.ZeroOut(c), ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, p - 1, ll.ForLoop(k, 0, m - 1, acc))))
    return code, a, b, c


def test_matmul_and_interchange_is_bit_identical(run_c):
    code, a, b, c = matmul_code(33, 17, 40)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((33, 17)).astype(np.float32), rng.standard_normal((17, 40)).astype(np.float32)
    fast = run_c(code, {a: x, b: y}, options=INTERCHANGE).array(c)
    plain = run_c(code, {a: x, b: y}, options=NO_INTERCHANGE).array(c)
    np.testing.assert_allclose(fast, x @ y, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(fast, plain)
    src = cc.compile_proc(code, name="routine", options=INTERCHANGE).source
    inner = [line.strip() for line in src.splitlines() if line.strip().startswith("for")][-1]
    assert "< 40;" in inner, "the unit-stride lhs loop should be innermost"


def test_transposition(run_c):
    a, t = Tnode("a", (6, 9)), Tnode("t", (9, 6))
    i, j = get_symbol(), get_symbol()
    x = np.arange(54, dtype=np.float32).reshape(6, 9)
    code = ll.ForLoop(i, 0, 5, ll.ForLoop(j, 0, 8, ll.Set(t, it(j, i), ll.Get(a, it(i, j)))))
    np.testing.assert_array_equal(run_c(code, {a: x}).array(t), x.T)


def test_strided_padded_convolution(run_c):
    """out[i] = sum_k x[2i + k - 1] * w[k], reads outside x guarded as lowering does."""
    n_in, kw = 11, 3
    n_out = (n_in + 2 - kw) // 2 + 1
    x, w, out = Tnode("x", (n_in,)), Tnode("w", (kw,)), Tnode("out", (n_out,))
    i, k = get_symbol(), get_symbol()
    idx = Affine(((2, i), (1, k)), -1)
    guard = B(ops.Binop.AND, B(ops.Binop.CMPLT, ll.Constant(-1.0), ll.EmbedIndex(idx)),
              B(ops.Binop.CMPLT, ll.EmbedIndex(idx), ll.Constant(float(n_in))))
    read = T(ops.Ternop.WHERE, guard, ll.Get(x, (idx,)), ll.Constant(0.0))
    acc = ll.Set(out, it(i), B(ops.Binop.ADD, ll.Get(out, it(i)), B(ops.Binop.MUL, read, ll.Get(w, it(k)))))
    code = ll.ForLoop(i, 0, n_out - 1, ll.ForLoop(k, 0, kw - 1, acc))
    xv, wv = np.arange(1, n_in + 1, dtype=np.float32), np.array([1, 10, 100], dtype=np.float32)
    padded = np.concatenate([[0], xv, [0]])
    expected = [sum(padded[2 * o + q] * wv[q] for q in range(kw)) for o in range(n_out)]
    got = run_c(code, {x: xv, w: wv}).array(out)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, interpreted(code, {x: xv, w: wv})[out])


def test_static_symbol_slice():
    data, row = Tnode("data", (4, 5)), Tnode("row", (5,))
    s = get_static_symbol(4)
    j = get_symbol()
    code = ll.ForLoop(j, 0, 4, ll.Set(row, it(j), B(ops.Binop.ADD, ll.Get(data, (Iterator(s.symbol), Iterator(j))),
                                                     ll.EmbedIndex(Iterator(s.symbol)))))
    backend = CcBackend()
    compiled = backend.compile((s,), code, shared=True, name="slice")
    ctx = backend.init("slice", share_host_arrays=True)
    vals = np.arange(20, dtype=np.float32).reshape(4, 5)
    ctx.array(data)[...] = vals
    ref = IntRef(2)
    routine = backend.link(ctx, compiled, {s: ref})
    routine()
    np.testing.assert_array_equal(ctx.array(row), vals[2] + 2)
    ref.value = 3
    routine()
    np.testing.assert_array_equal(ctx.array(row), vals[3] + 3)
    ref.value = 4
    with pytest.raises(IndexError, match=r"outside its range \[0, 4\)"):
        routine()
    fresh = backend.link(ctx, compiled)
    assert fresh.bindings[s].value == 0
    fresh()
    np.testing.assert_array_equal(ctx.array(row), vals[0])


UNOPS = list(ops.Unop)
BINOPS = list(ops.Binop)
TERNOPS = list(ops.Ternop)
POSITIVE_ONLY = {ops.Unop.LOG, ops.Unop.LOG2, ops.Unop.SQRT, ops.Unop.RECIP_SQRT, ops.Unop.RECIP}


@pytest.mark.parametrize("prec", [ops.single, ops.double], ids=lambda p: p.name)
def test_every_operation_against_ops_semantics(run_c, prec):
    """One routine computing every unary, binary and ternary op; compared with the
    interpreter (which applies `ops` NumPy semantics) and directly with the ops table.
    Operations without a math-library call must match the interpreter bit for bit."""
    n = 48
    rng = np.random.default_rng(4)
    pos = rng.uniform(0.1, 2.0, n)
    sig = rng.uniform(-2.0, 2.0, n)
    sig[1::6] = 0.0
    sig[2::6] = 0.5
    other = np.where(np.arange(n) % 3 == 0, sig, pos)
    other[5::6] = 1.0
    a, b, c = (Tnode(x, (n,), prec) for x in ("pos", "sig", "other"))
    inputs = {a: pos, b: sig, c: other}
    outs, stmts, expected = {}, [], {}
    i = get_symbol()
    ga, gb, gc = (ll.Get(t, it(i)) for t in (a, b, c))
    for op in UNOPS:
        arg, val = (ga, pos) if op in POSITIVE_ONLY else (gb, sig)
        outs[op] = Tnode(op.name.lower(), (n,), prec)
        stmts.append(ll.Set(outs[op], it(i), U(op, arg)))
        expected[op] = ops.apply_unop(op, val.astype(prec.dtype))
    for op in BINOPS:
        (x, xv), (y, yv) = ((ga, pos), (gb, sig)) if op is ops.Binop.TO_POW_OF else ((gb, sig), (gc, other))
        outs[op] = Tnode(op.name.lower(), (n,), prec)
        stmts.append(ll.Set(outs[op], it(i), B(op, x, y)))
        expected[op] = ops.apply_binop(op, xv.astype(prec.dtype), yv.astype(prec.dtype))
    for op in TERNOPS:
        outs[op] = Tnode(op.name.lower(), (n,), prec)
        stmts.append(ll.Set(outs[op], it(i), T(op, gb, ga, gc)))
        expected[op] = ops.apply_ternop(op, *(v.astype(prec.dtype) for v in (sig, pos, other)))
    code = ll.ForLoop(i, 0, n - 1, ll.seq(*stmts))
    ctx = run_c(code, inputs)
    ref = interpreted(code, inputs)
    tol = dict(rtol=2e-6, atol=1e-7) if prec is ops.single else dict(rtol=1e-13, atol=1e-15)
    for op, tn in outs.items():
        got = ctx.array(tn)
        if "{f}" in op.c_template:
            np.testing.assert_allclose(got, ref[tn], **tol, err_msg=f"{op} vs interpreter")
        else:
            np.testing.assert_array_equal(got, ref[tn], err_msg=f"{op}: IEEE arithmetic is exact")
        np.testing.assert_allclose(got, np.asarray(expected[op]).astype(prec.dtype), **tol, err_msg=f"{op} vs ops")


def test_uniform_hash_is_bit_exact(run_c):
    r64, r32 = Tnode("r64", (3, 8), ops.double), Tnode("r32", (3, 8), ops.single)
    one = Tnode("one", (5,), ops.double)
    i = get_symbol()
    counter = B(ops.Binop.ADD, ll.ConstantBits(2**40 + 12345), ll.EmbedIndex(Iterator(i)))
    code = ll.seq(
        ll.ForLoop(i, 0, 2, ll.seq(
            ll.SetFromVec(r64, (Iterator(i), FixedIdx(0)), 8, ops.VecUnop.UNIFORM_HASH, counter),
            ll.SetFromVec(r32, (Iterator(i), FixedIdx(0)), 8, ops.VecUnop.UNIFORM_HASH, counter))),
        ll.SetFromVec(one, (FixedIdx(0),), 5, ops.VecUnop.UNIFORM_HASH, ll.Constant(-5.0)))
    ctx = run_c(code, {})
    expected = np.array([ops.uniform_hash(2**40 + 12345 + row, 8) for row in range(3)])
    np.testing.assert_array_equal(ctx.array(r64), expected)
    np.testing.assert_array_equal(ctx.array(r32), expected.astype(np.float32))
    np.testing.assert_array_equal(ctx.array(one), ops.uniform_hash(-5, 5))
    np.testing.assert_array_equal(ctx.array(r64), interpreted(code, {})[r64])


@pytest.mark.parametrize("prec", [ops.byte, ops.int32, ops.int64], ids=lambda p: p.name)
def test_integer_precisions(run_c, prec):
    n = 20
    x, y = Tnode("x", (n,), prec), Tnode("y", (n,), prec)
    f = Tnode("f", (n,), ops.single)
    xv = np.arange(1, n + 1)
    yv = (np.arange(n) % 7) + 1
    fv = np.linspace(-0.5, 9.75, n).astype(np.float32) if prec is not ops.byte else np.linspace(0, 9.75, n)
    i = get_symbol()
    gx, gy = ll.Get(x, it(i)), ll.Get(y, it(i))
    exprs = {
        "add": B(ops.Binop.ADD, gx, gy), "sub": B(ops.Binop.SUB, B(ops.Binop.MUL, gx, ll.Constant(3.0)), gy),
        "div": B(ops.Binop.DIV, gx, gy), "mod": B(ops.Binop.MOD, gx, gy), "max": B(ops.Binop.MAX, gx, gy),
        "min": B(ops.Binop.MIN, gx, gy), "lt": B(ops.Binop.CMPLT, gy, ll.Constant(4.0)),
        "relu": U(ops.Unop.RELU, B(ops.Binop.SUB, gy, ll.Constant(3.0))),
        "fma": T(ops.Ternop.FMA, gx, gy, ll.EmbedIndex(Iterator(i))), "trunc": ll.Get(f, it(i)),
        "exp": U(ops.Unop.EXP, B(ops.Binop.DIV, gy, ll.Constant(2.0))),
    }
    outs = {k: Tnode(k, (n,), prec) for k in exprs}
    code = ll.ForLoop(i, 0, n - 1, ll.seq(*(ll.Set(outs[k], it(i), e) for k, e in exprs.items())))
    inputs = {x: xv, y: yv, f: fv}
    ctx, ref = run_c(code, inputs), interpreted(code, inputs)
    for k, tn in outs.items():
        np.testing.assert_array_equal(ctx.array(tn), ref[tn], err_msg=k)
    np.testing.assert_array_equal(ctx.array(outs["mod"]), xv % yv)


def test_int64_beyond_float_precision(run_c):
    out = Tnode("out", (4,), ops.int64)
    code = loop1(4, lambda i: ll.Set(out, it(i), B(ops.Binop.ADD, ll.ConstantBits(2**60 + 1), ll.EmbedIndex(
        Iterator(i)))))
    np.testing.assert_array_equal(run_c(code, {}).array(out), 2**60 + 1 + np.arange(4))


def test_half_precision(run_c):
    n = 32
    h, s = Tnode("h", (n,), ops.half), Tnode("s", (n,), ops.single)
    prod, ex = Tnode("prod", (n,), ops.half), Tnode("ex", (n,), ops.half)
    hv = np.linspace(-3, 3, n).astype(np.float16)
    sv = np.linspace(0.1, 1.7, n).astype(np.float32)
    i = get_symbol()
    gh, gs = ll.Get(h, it(i)), ll.Get(s, it(i))
    code = ll.ForLoop(i, 0, n - 1, ll.seq(
        ll.Set(prod, it(i), B(ops.Binop.ADD, B(ops.Binop.MUL, gh, gs), ll.Constant(0.1))),
        ll.Set(ex, it(i), U(ops.Unop.EXP, gh))))
    ctx, ref = run_c(code, {h: hv, s: sv}), interpreted(code, {h: hv, s: sv})
    np.testing.assert_array_equal(ctx.array(prod), ref[prod])
    np.testing.assert_allclose(ctx.array(ex).astype(np.float32), ref[ex].astype(np.float32), rtol=1e-3)


def test_mixed_precision_reads(run_c):
    d, f, out = Tnode("d", (3,), ops.double), Tnode("f", (3,), ops.single), Tnode("out", (3,), ops.double)
    dv = np.array([1 + 2**-40, 2.0, 3.0])
    fv = np.array([0.1, 0.2, 0.3], dtype=np.float32)
    code = loop1(3, lambda i: ll.Set(out, it(i), B(ops.Binop.ADD, ll.Get(d, it(i)), ll.Get(f, it(i)))))
    np.testing.assert_array_equal(run_c(code, {d: dv, f: fv}).array(out), dv + fv.astype(np.float64))


def test_merge_buffer_read():
    a = Tnode("a", (4,))
    code = loop1(4, lambda i: ll.Set(a, it(i), B(ops.Binop.ADD, ll.Get(a, it(i)), ll.GetMergeBuffer(a, it(i)))))
    backend = CcBackend()
    ctx = backend.init("merge", share_host_arrays=True)
    ctx.array(a)[...] = [1, 2, 3, 4]
    ctx.merge_buffer(a)[...] = [10, 20, 30, 40]
    backend.link(ctx, backend.compile((), code, shared=True, name="merge"))()
    np.testing.assert_array_equal(ctx.array(a), [11, 22, 33, 44])


@pytest.mark.parametrize("size", [16, 8192])
def test_local_only_node(run_c, size):
    a, out = Tnode("a", (size,)), Tnode("out", (1,))
    h = Tnode("h", (size,), memory_mode=tnode.LOCAL)
    i, k = get_symbol(), get_symbol()
    v = ll.fresh_scope_id(out)
    code = ll.seq(
        ll.ForLoop(i, 0, size - 1, ll.Set(h, it(i), B(ops.Binop.MUL, ll.Get(a, it(i)), ll.Constant(2.0)))),
        ll.Set(out, (FixedIdx(0),), ll.LocalScope(v, ll.ForLoop(k, 0, size - 1, ll.SetLocal(v, B(
            ops.Binop.ADD, ll.GetLocal(v), ll.Get(h, it(k))))), ())))
    proc = cc.compile_proc(code, name="local")
    assert proc.mem_class(h) is None   # not a context array
    scratch = [p.tn for p in proc.params if p.kind is ParamKind.SCRATCH]
    assert scratch == ([h] if size * 4 > 16 * 1024 else [])   # over the stack limit: allocated once per link
    av = np.ones(size, dtype=np.float32)
    assert run_c(code, {a: av}).array(out)[0] == 2 * size


def test_hosted_arrays_are_shared_with_the_host():
    w = Tnode("w", (3,), memory_mode=tnode.hosted(tnode.MemoryType.CONSTANT))
    y = Tnode("y", (3,), memory_mode=tnode.hosted())
    code = loop1(3, lambda i: ll.Set(y, it(i), B(ops.Binop.MUL, ll.Get(w, it(i)), ll.Constant(2.0))))
    proc = cc.compile_proc(code, name="hosted")
    assert proc.mem_class(w) is cc.MemClass.CONSTANT_FROM_HOST and proc.mem_class(y) is cc.MemClass.FROM_CONTEXT
    w.host_array()[...] = [1, 2, 3]
    backend = CcBackend()
    routine = backend.link(backend.init("hosted", share_host_arrays=True), backend.compile((), code, shared=True,
                                                                                             name="hosted"))
    routine()
    np.testing.assert_array_equal(y.host_array(), [2, 4, 6])
    w.host_array()[...] = [5, 6, 7]
    routine()
    np.testing.assert_array_equal(y.host_array(), [10, 12, 14])


def test_private_context_copies_hosted_nodes():
    y = Tnode("y", (2,), memory_mode=tnode.hosted())
    code = loop1(2, lambda i: ll.Set(y, it(i), B(ops.Binop.ADD, ll.Get(y, it(i)), ll.Constant(1.0))))
    y.host_array()[...] = [5, 6]
    backend = CcBackend()
    ctx = backend.init("cpu1")
    ctx.from_host(y)
    backend.link(ctx, backend.compile((), code, shared=True, name="bump"))()
    np.testing.assert_array_equal(y.host_array(), [5, 6])
    ctx.to_host(y)
    np.testing.assert_array_equal(y.host_array(), [6, 7])


@settings(max_examples=15, deadline=None)
@given(dims=st.lists(st.integers(1, 5), min_size=3, max_size=3), perm=st.permutations([0, 1, 2]),
       n_lhs=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_interchange_preserves_results(dims, perm, n_lhs, seed):
    """Random accumulation nests: interchange on and off and the interpreter agree bit for bit."""
    syms = [get_symbol() for _ in dims]
    lhs_axes = perm[:n_lhs]
    out = Tnode("out", tuple(dims[a] for a in lhs_axes))
    x = Tnode("x", tuple(dims[a] for a in reversed(perm)))
    y = Tnode("y", (dims[perm[-1]], dims[perm[0]]))
    lhs = tuple(Iterator(syms[a]) for a in lhs_axes)
    rhs = B(ops.Binop.MUL, ll.Get(x, tuple(Iterator(syms[a]) for a in reversed(perm))),
            ll.Get(y, (Iterator(syms[perm[-1]]), Iterator(syms[perm[0]]))))
    body = ll.Set(out, lhs, B(ops.Binop.ADD, ll.Get(out, lhs), rhs))
    for s, d in reversed(list(zip(syms, dims, strict=True))):
        body = ll.ForLoop(s, 0, d - 1, body)
    rng = np.random.default_rng(seed)
    inputs = {x: rng.standard_normal(x.dims).astype(np.float32), y: rng.standard_normal(y.dims).astype(np.float32)}
    runs = []
    for options in (INTERCHANGE, NO_INTERCHANGE):
        runs.append(run_once(body, inputs, options=options, name="nest").array(out).copy())
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_array_equal(runs[0], interpreted(body, inputs)[out])
