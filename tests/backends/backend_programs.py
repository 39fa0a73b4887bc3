"""Representative programs for backend tests, each with inputs, outputs and a NumPy answer.

Low-level ones mirror the C backend's end-to-end tests (`test_cc_numeric.py`), assignment
ones the pipeline tests (`tests/ir/test_pipeline.py`); `mlp_step` is a small training step
(forward, backprop, SGD update). Every builder makes fresh nodes, so programs never share
state between tests. The interpreter on the unoptimized code is the oracle (`reference`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

import numpy as np

from einjit.ir import assignments as asg
from einjit.ir import interpret, ops, tnode
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, FixedIdx, Iterator, Projections, StaticSymbol, get_static_symbol, get_symbol
from einjit.ir.tnode import Tnode

B, U, T = ll.Binop, ll.Unop, ll.Ternop


@dataclass
class Program:
    name: str
    code: Any
    inputs: dict[Tnode, np.ndarray]
    outputs: tuple[Tnode, ...]
    expected: dict[Tnode, np.ndarray]
    bindings: dict[StaticSymbol, int] = field(default_factory=dict)
    rtol: float = 1e-5

    @property
    def statics(self) -> tuple[StaticSymbol, ...]:
        return tuple(self.bindings)

    def low_level(self) -> ll.LLStmt:
        return asg.to_low_level(self.code) if isinstance(self.code, asg.Asgns) else self.code

    @cached_property
    def reference(self) -> dict[Tnode, np.ndarray]:
        """The interpreter's outputs on the unoptimized code (computed before the optimizer
        makes intermediate nodes virtual)."""
        arrays = {tn: np.array(v, dtype=tn.prec.dtype) for tn, v in self.inputs.items()}
        env = {s.symbol: v for s, v in self.bindings.items()}
        out = interpret.run(self.low_level(), arrays, env)
        return {tn: out[tn] for tn in self.outputs}

    def set_host_inputs(self) -> None:
        for tn, v in self.inputs.items():
            tn.host_array()[...] = v


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def hosted(label: str, dims: tuple[int, ...], prec: ops.Prec = ops.single) -> Tnode:
    tn = Tnode(label, dims, prec)
    tn.update_memory_mode(tnode.hosted(), 0)
    return tn


def proj(space: dict, lhs_dims, rhs_dims, lhs, rhs, info: str = "") -> asg.Lazy:
    return asg.Lazy.of(Projections(tuple(space.values()), tuple(space), tuple(lhs_dims),
                                   tuple(map(tuple, rhs_dims)), tuple(lhs), tuple(map(tuple, rhs)), info))


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- low-level programs


def pointwise_chain() -> Program:
    n = 300
    a, b, c, d, out = (Tnode(x, (n,)) for x in ("a", "b", "c", "d", "out"))
    vals = {t: _rng(1).standard_normal(n).astype(np.float32) + k for k, t in enumerate((a, b, c, d))}
    i = get_symbol()
    g = {t: ll.Get(t, it(i)) for t in (a, b, c, d)}
    expr = U(ops.Unop.RELU, B(ops.Binop.SUB, B(ops.Binop.MUL, B(ops.Binop.ADD, B(ops.Binop.MUL, U(
        ops.Unop.EXP, g[a]), g[b]), g[c]), ll.Constant(0.5)), g[d]))
    va, vb, vc, vd = vals.values()
    want = np.maximum((np.exp(va) * vb + vc) * 0.5 - vd, 0)
    return Program("pointwise_chain", ll.ForLoop(i, 0, n - 1, ll.Set(out, it(i), expr)), vals, (out,), {out: want})


def reduction_local_scope() -> Program:
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
    x = _rng(2).standard_normal((5, 7)).astype(np.float32)
    return Program("reduction_local_scope", code, {a: x}, (out,),
                   {out: np.stack([x.max(axis=1), 2 * x.sum(axis=1)], axis=1)})


def matmul_low_level() -> Program:
    n, m, p = 13, 7, 20
    a, b, c = Tnode("a", (n, m)), Tnode("b", (m, p)), Tnode("c", (n, p))
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    acc = ll.Set(c, it(i, j), B(ops.Binop.ADD, ll.Get(c, it(i, j)), B(ops.Binop.MUL, ll.Get(a, it(i, k)),
                                                                       ll.Get(b, it(k, j)))), "c =+ a * b")
    code = ll.seq(ll.ZeroOut(c), ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, p - 1, ll.ForLoop(k, 0, m - 1, acc))))
    x, y = _rng(3).standard_normal((n, m)).astype(np.float32), _rng(4).standard_normal((m, p)).astype(np.float32)
    return Program("matmul_low_level", code, {a: x, b: y}, (c,), {c: x @ y})


def summed_outer_loops() -> Program:
    """Parallel loops below summed ones: a weight gradient summed over the batch outermost,
    `dw[i, j] += x[b, i] * g[b, j]`, and a product with its summed loop in the middle,
    `c[i, j] += a[i, k] * w[k, j]` over `i, k, j`."""
    nb, ni, nj = 9, 6, 11
    x, g, dw = Tnode("x", (nb, ni)), Tnode("g", (nb, nj)), Tnode("dw", (ni, nj))
    a, c = Tnode("a", (ni, nb)), Tnode("c", (ni, nj))
    b, i, j = get_symbol(), get_symbol(), get_symbol()
    grad = ll.Set(dw, it(i, j), B(ops.Binop.ADD, ll.Get(dw, it(i, j)), B(ops.Binop.MUL, ll.Get(x, it(b, i)),
                                                                        ll.Get(g, it(b, j)))), "dw =+ x * g")
    i2, k, j2 = get_symbol(), get_symbol(), get_symbol()
    prod = ll.Set(c, it(i2, j2), B(ops.Binop.ADD, ll.Get(c, it(i2, j2)), B(ops.Binop.MUL, ll.Get(a, it(i2, k)),
                                                                           ll.Get(g, it(k, j2)))), "c =+ a * g")
    code = ll.seq(ll.ZeroOut(dw), ll.ForLoop(b, 0, nb - 1, ll.ForLoop(i, 0, ni - 1, ll.ForLoop(j, 0, nj - 1, grad))),
                  ll.ZeroOut(c), ll.ForLoop(i2, 0, ni - 1, ll.ForLoop(k, 0, nb - 1, ll.ForLoop(j2, 0, nj - 1, prod))))
    xv, gv, av = (_rng(seed).standard_normal(dims).astype(np.float32)
                  for seed, dims in ((20, (nb, ni)), (21, (nb, nj)), (22, (ni, nb))))
    return Program("summed_outer_loops", code, {x: xv, g: gv, a: av}, (dw, c), {dw: xv.T @ gv, c: av @ gv})


def conv_strided_padded() -> Program:
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
    code = ll.seq(ll.ZeroOut(out), ll.ForLoop(i, 0, n_out - 1, ll.ForLoop(k, 0, kw - 1, acc)))
    xv, wv = np.arange(1, n_in + 1, dtype=np.float32), np.array([1, 10, 100], dtype=np.float32)
    padded = np.concatenate([[0], xv, [0]])
    want = np.array([sum(padded[2 * o + q] * wv[q] for q in range(kw)) for o in range(n_out)])
    return Program("conv_strided_padded", code, {x: xv, w: wv}, (out,), {out: want})


def static_slice() -> Program:
    data, row = Tnode("data", (4, 5)), Tnode("row", (5,))
    s = get_static_symbol(4)
    j = get_symbol()
    code = ll.ForLoop(j, 0, 4, ll.Set(row, it(j), B(ops.Binop.ADD, ll.Get(data, (Iterator(s.symbol), Iterator(j))),
                                                     ll.EmbedIndex(Iterator(s.symbol)))))
    vals = np.arange(20, dtype=np.float32).reshape(4, 5)
    return Program("static_slice", code, {data: vals}, (row,), {row: vals[2] + 2}, {s: 2})


def uniform_hash() -> Program:
    r64 = Tnode("r64", (3, 8), ops.double)
    i = get_symbol()
    counter = B(ops.Binop.ADD, ll.ConstantBits(2**40 + 12345), ll.EmbedIndex(Iterator(i)))
    code = ll.ForLoop(i, 0, 2, ll.SetFromVec(r64, (Iterator(i), FixedIdx(0)), 8, ops.VecUnop.UNIFORM_HASH, counter))
    want = np.array([ops.uniform_hash(2**40 + 12345 + row, 8) for row in range(3)])
    return Program("uniform_hash", code, {}, (r64,), {r64: want}, rtol=0)


def local_only_node() -> Program:
    size = 64
    a, out = Tnode("a", (size,)), Tnode("out", (1,))
    h = Tnode("h", (size,), memory_mode=tnode.LOCAL)
    i, k = get_symbol(), get_symbol()
    v = ll.fresh_scope_id(out)
    code = ll.seq(
        ll.ForLoop(i, 0, size - 1, ll.Set(h, it(i), B(ops.Binop.MUL, ll.Get(a, it(i)), ll.Constant(2.0)))),
        ll.Set(out, (FixedIdx(0),), ll.LocalScope(v, ll.ForLoop(k, 0, size - 1, ll.SetLocal(v, B(
            ops.Binop.ADD, ll.GetLocal(v), ll.Get(h, it(k))))), ())))
    av = np.linspace(0, 1, size, dtype=np.float32)
    return Program("local_only_node", code, {a: av}, (out,), {out: np.array([2 * av.sum()])})


# ---------------------------------------------------------------- assignment programs


def asg_matmul() -> Program:
    a, b, c = hosted("a", (4, 6)), hosted("b", (6, 5)), hosted("c", (4, 5))
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    p = proj({i: 4, j: 5, k: 6}, (4, 5), [(4, 6), (6, 5)], it(i, j), [it(i, k), it(k, j)])
    av, bv = _rng(5).standard_normal((4, 6)), _rng(6).standard_normal((6, 5))
    return Program("asg_matmul", asg.AccumBinop(True, ops.Binop.ADD, ops.Binop.MUL, c, asg.Node(a), asg.Node(b), p),
                   {a: av, b: bv}, (c,), {c: av @ bv})


def asg_sum_reduction() -> Program:
    a, s = hosted("a", (5, 7)), hosted("s", (5,))
    i, j = get_symbol(), get_symbol()
    p = proj({i: 5, j: 7}, (5,), [(5, 7)], it(i), [it(i, j)])
    av = _rng(7).standard_normal((5, 7))
    return Program("asg_sum_reduction", asg.AccumUnop(True, ops.Binop.ADD, ops.Unop.IDENTITY, s, asg.Node(a), p),
                   {a: av}, (s,), {s: av.sum(axis=1)})


def asg_conv2d() -> Program:
    h, wd, kh, kw, s, d, pad = 9, 8, 3, 2, 2, 2, 1
    oh = (h + 2 * pad - d * (kh - 1) - 1) // s + 1
    ow = (wd + 2 * pad - d * (kw - 1) - 1) // s + 1
    x, w, y = hosted("img", (h, wd)), hosted("kern", (kh, kw)), hosted("out", (oh, ow))
    a, b, u, v = get_symbol("a"), get_symbol("b"), get_symbol("u"), get_symbol("v")
    p = proj({a: oh, b: ow, u: kh, v: kw}, (oh, ow), [(h, wd), (kh, kw)], it(a, b),
             [[Affine(((s, a), (d, u)), -pad), Affine(((s, b), (d, v)), -pad)], it(u, v)])
    xv, wv = _rng(8).standard_normal((h, wd)), _rng(9).standard_normal((kh, kw))
    padded = np.pad(xv, pad)
    want = np.zeros((oh, ow))
    for i in range(oh):
        for j in range(ow):
            want[i, j] = sum(padded[s * i + d * q, s * j + d * r] * wv[q, r] for q in range(kh) for r in range(kw))
    return Program("asg_conv2d", asg.AccumBinop(True, ops.Binop.ADD, ops.Binop.MUL, y, asg.Node(x), asg.Node(w), p),
                   {x: xv, w: wv}, (y,), {y: want})


def asg_slice() -> Program:
    data, out = hosted("data", (4, 3, 2)), hosted("batch", (3, 2))
    sym = get_static_symbol(4, "b")
    dv = _rng(10).standard_normal((4, 3, 2))
    return Program("asg_slice", asg.Fetch(out, asg.Slice(sym, data)), {data: dv}, (out,), {out: dv[3]}, {sym: 3})


def asg_pointwise_broadcast() -> Program:
    a, b, c = hosted("a", (3, 4)), hosted("b", (1, 4)), hosted("c", (3, 4))
    t = Tnode("tmp", (3, 4))
    i, j = get_symbol(), get_symbol()
    pb = proj({i: 3, j: 4}, (3, 4), [(3, 4), (1, 4)], it(i, j), [it(i, j), [FixedIdx(0), Iterator(j)]])
    pu = proj({i: 3, j: 4}, (3, 4), [(3, 4)], it(i, j), [it(i, j)])
    code = asg.sequence(asg.AccumBinop(False, ops.Binop.ARG2, ops.Binop.ADD, t, asg.Node(a), asg.Node(b), pb),
                        asg.AccumUnop(False, ops.Binop.ARG2, ops.Unop.EXP, c, asg.Node(t), pu))
    av, bv = _rng(11).standard_normal((3, 4)), _rng(12).standard_normal((1, 4))
    return Program("asg_pointwise_broadcast", code, {a: av, b: bv}, (c,), {c: np.exp(av + bv)})


def mlp_step() -> Program:
    """One SGD step of y = relu(x w1) w2 on the loss sum((y - target)^2) / 2, lr 0.1."""
    nb, ni, nh = 8, 3, 4
    x, target = hosted("x", (nb, ni)), hosted("target", (nb, 1))
    w1, w2, y = hosted("w1", (ni, nh)), hosted("w2", (nh, 1)), hosted("y", (nb, 1))
    h_pre, h, dy = Tnode("h_pre", (nb, nh)), Tnode("h", (nb, nh)), Tnode("dy", (nb, 1))
    dh_pre, dh = Tnode("dh_pre", (nb, nh)), Tnode("dh", (nb, nh))
    g1, g2, lr = Tnode("g1", (ni, nh)), Tnode("g2", (nh, 1)), Tnode("lr", (1,))
    b, o, k = get_symbol("b"), get_symbol("o"), get_symbol("k")
    add, mul = ops.Binop.ADD, ops.Binop.MUL

    def matmul(lhs, r1, r2, space, lhs_idx, r1_idx, r2_idx):
        p = proj(space, lhs.dims, [r1.dims, r2.dims], lhs_idx, [r1_idx, r2_idx])
        return asg.AccumBinop(True, add, mul, lhs, asg.Node(r1), asg.Node(r2), p)

    def pointwise(op, lhs, r1, r2):
        syms = [get_symbol() for _ in lhs.dims]
        space = dict(zip(syms, lhs.dims, strict=True))
        p = proj(space, lhs.dims, [r1.dims, r2.dims], it(*syms), [it(*syms), it(*syms)])
        return asg.AccumBinop(False, ops.Binop.ARG2, op, lhs, asg.Node(r1), asg.Node(r2), p)

    def sgd(w, g):
        syms = [get_symbol() for _ in w.dims]
        p = proj(dict(zip(syms, w.dims, strict=True)), w.dims, [w.dims, (1,)], it(*syms), [it(*syms), [FixedIdx(0)]])
        return asg.AccumBinop(False, ops.Binop.SUB, mul, w, asg.Node(g), asg.Node(lr), p)

    pu = proj({b: nb, o: nh}, (nb, nh), [(nb, nh)], it(b, o), [it(b, o)])
    code = asg.sequence(
        asg.BlockComment("forward", asg.sequence(
            matmul(h_pre, x, w1, {b: nb, o: nh, k: ni}, it(b, o), it(b, k), it(k, o)),
            asg.AccumUnop(False, ops.Binop.ARG2, ops.Unop.RELU, h, asg.Node(h_pre), pu),
            matmul(y, h, w2, {b: nb, o: 1, k: nh}, it(b, o), it(b, k), it(k, o)))),
        asg.BlockComment("backprop", asg.sequence(
            pointwise(ops.Binop.SUB, dy, y, target),
            matmul(g2, h, dy, {k: nh, o: 1, b: nb}, it(k, o), it(b, k), it(b, o)),
            matmul(dh_pre, dy, w2, {b: nb, k: nh, o: 1}, it(b, k), it(b, o), it(k, o)),
            pointwise(ops.Binop.RELU_GATE, dh, h_pre, dh_pre),
            matmul(g1, x, dh, {k: ni, o: nh, b: nb}, it(k, o), it(b, k), it(b, o)))),
        asg.BlockComment("sgd update", asg.sequence(
            asg.Fetch(lr, asg.FetchConstant(0.1)), sgd(w1, g1), sgd(w2, g2))))
    xv, tv = _rng(13).standard_normal((nb, ni)), _rng(14).standard_normal((nb, 1))
    w1v, w2v = _rng(15).standard_normal((ni, nh)), _rng(16).standard_normal((nh, 1))
    hp = xv @ w1v
    hv = np.maximum(hp, 0)
    yv = hv @ w2v
    dyv = yv - tv
    want = {y: yv, w2: w2v - 0.1 * hv.T @ dyv, w1: w1v - 0.1 * xv.T @ ((dyv @ w2v.T) * (hp > 0))}
    return Program("mlp_step", code, {x: xv, target: tv, w1: w1v, w2: w2v}, (y, w1, w2), want, rtol=1e-4)


LOW_LEVEL: dict[str, Callable[[], Program]] = {
    f.__name__: f for f in (pointwise_chain, reduction_local_scope, matmul_low_level, summed_outer_loops,
                            conv_strided_padded, static_slice, uniform_hash, local_only_node)}
ASSIGNMENTS: dict[str, Callable[[], Program]] = {
    f.__name__: f for f in (asg_matmul, asg_sum_reduction, asg_conv2d, asg_slice, asg_pointwise_broadcast,
                            mlp_step)}
ALL: dict[str, Callable[[], Program]] = {**LOW_LEVEL, **ASSIGNMENTS}


# ---------------------------------------------------------------- running on a backend


def run_on(backend: Any, contexts: list, prog: Program, *, shared: bool, devices: list = ()) -> list[dict]:
    """Compile `prog` once, run it once in each context, return each context's outputs."""
    _ = prog.reference  # force the oracle now, before compiling makes intermediate nodes virtual
    prog.set_host_inputs()
    code = backend.compile(prog.statics, prog.code, shared=shared, name=prog.name)
    for ctx in contexts:
        for tn in prog.inputs:
            backend.from_host(ctx, tn)
        routine = backend.link(ctx, code)
        for s, v in prog.bindings.items():
            routine.bindings[s].value = v
        routine()
    for device in devices:
        backend.await_(device)
    results = []
    for ctx in contexts:
        out = {}
        for tn in prog.outputs:
            backend.to_host(ctx, tn)
            out[tn] = tn.host_array().copy()
        results.append(out)
    return results


def check_outputs(prog: Program, got: dict, how: str) -> None:
    """Against the interpreter and NumPy, with the program's tolerance."""
    ref = prog.reference
    for tn in prog.outputs:
        tol = dict(rtol=prog.rtol, atol=prog.rtol)
        np.testing.assert_allclose(got[tn], ref[tn], **tol, err_msg=f"{how}: {tn.debug_name()} vs interpreter")
        np.testing.assert_allclose(got[tn], prog.expected[tn], **tol, err_msg=f"{how}: {tn.debug_name()} vs NumPy")
