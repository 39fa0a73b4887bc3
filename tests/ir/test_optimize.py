"""Virtualization decisions of `optimize_proc`, checked on programs lowered from assignments:
which nodes become virtual, the `NonVirtual` codes and provenances of the others, the debug
log, and — for every program — that the optimized code computes what the unoptimized code
computes, and what NumPy computes."""

from __future__ import annotations

import numpy as np
import pytest

from einjit.ir import assignments as asg
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, FixedIdx, Iterator, Projections, SubAxis, get_static_symbol, get_symbol
from einjit.ir.optimize import NonVirtual, VirtualizeSettings, optimize_proc
from einjit.ir.passes.cleanup import ScopeError, touched_nodes
from einjit.ir.passes.tracing import RECURRENT
from einjit.ir.sched.causal import may_be_local
from einjit.ir.tnode import MATERIALIZED, NEVER_VIRTUAL, VIRTUAL, MemoryMode, MemoryModeError, Tnode, hosted

B, U = ops.Binop, ops.Unop
TOL = {ops.double: 1e-12, ops.single: 1e-5}
PRECS = [ops.double, ops.single]


def node(label, dims, prec=ops.double, host=False):
    tn = Tnode(label, tuple(dims), prec)
    if host:
        tn.update_memory_mode(hosted(), 0)
    return tn


def accum(lhs, op, args, space, lhs_idx, rhs_idcs, *, acc=B.ARG2, init=False):
    """An assignment `lhs <acc>= op(args)` over the loops `space` ({symbol: trip count})."""
    p = asg.Lazy.of(Projections(tuple(space.values()), tuple(space), lhs.dims, tuple(a.dims for a in args),
                                tuple(lhs_idx), tuple(tuple(r) for r in rhs_idcs)))
    bufs = [asg.Node(a) for a in args]
    if isinstance(op, ops.Unop):
        return asg.AccumUnop(init, acc, op, lhs, *bufs, p)
    return asg.AccumBinop(init, acc, op, lhs, *bufs, p)


def pointwise(lhs, op, *args, acc=B.ARG2):
    syms = [get_symbol() for _ in lhs.dims]
    idx = [Iterator(s) for s in syms]
    return accum(lhs, op, args, dict(zip(syms, lhs.dims, strict=True)), idx, [idx] * len(args), acc=acc)


def fresh(inputs):
    return {tn: np.array(v, dtype=tn.prec.dtype) for tn, v in inputs.items()}


def check_program(code, inputs, expected, settings=None, static=(), bindings=None):
    """Optimize `code` (assignments or low-level); the optimized and unoptimized code must agree
    on every node that is not virtual — but for the routine's own nodes the CPU stages drop
    (`copies`, `rows`) — and match `expected` ({node: NumPy array})."""
    llc = code if isinstance(code, ll.LLStmt) else asg.to_low_level(code)
    env = {s.symbol: v for s, v in (bindings or {}).items()}
    ref = interpret.run(llc, fresh(inputs), env)
    opt = optimize_proc(llc, name="test", static_indices=static, settings=settings)
    got = interpret.run(opt.llc, fresh(inputs), env)
    for tn, want in ref.items():
        if not tn.is_virtual() and (tn in got or not may_be_local(tn)):
            np.testing.assert_allclose(got[tn], want, rtol=TOL[tn.prec], atol=TOL[tn.prec], err_msg=tn.debug_name())
    for tn, want in expected.items():
        assert not tn.is_virtual(), tn.debug_name()
        np.testing.assert_allclose(got[tn], want, rtol=TOL[tn.prec], atol=TOL[tn.prec], err_msg=tn.debug_name())
    return opt


def nodes_in(opt):
    """The nodes whose arrays the optimized code reads or writes."""
    return touched_nodes(opt.llc)


@pytest.fixture
def rng():
    return np.random.default_rng(3)


# ---------------------------------------------------------------- the common case


@pytest.mark.parametrize("prec", PRECS, ids=lambda p: p.name)
def test_pointwise_chain_leaves_intermediates_virtual(prec, rng):
    dims = (3, 4)
    a, b, c, d = (node(n, dims, prec, host=True) for n in "abcd")
    s, e = node("s", dims, prec), node("e", dims, prec)
    code = asg.sequence(pointwise(s, B.ADD, a, b), pointwise(e, U.EXP, s), pointwise(d, B.MUL, e, c))
    av, bv, cv = (rng.standard_normal(dims) for _ in range(3))
    cast = [x.astype(prec.dtype) for x in (av, bv, cv)]
    opt = check_program(code, {a: av, b: bv, c: cv}, {d: np.exp(cast[0] + cast[1]) * cast[2]})
    assert s.memory_mode == VIRTUAL and e.memory_mode == VIRTUAL
    assert (s.provenance, e.provenance) == (15, 15)
    assert nodes_in(opt) == {a, b, c, d}
    sets = [x for x in ll.iter_stmts(opt.llc) if isinstance(x, ll.Set)]
    assert len(sets) == 1 and sets[0].tn is d
    assert not any(isinstance(x, ll.LocalScope) for x in ll.iter_scalars(sets[0].llsc))


def test_fill_then_accumulate_is_inlined_into_one_expression(rng):
    a, b, out = node("a", (5,), host=True), node("b", (5,), host=True), node("out", (5,), host=True)
    t, two = node("t", (5,)), node("two", (1,))
    i = get_symbol()
    code = asg.sequence(pointwise(t, U.IDENTITY, a), pointwise(t, U.IDENTITY, b, acc=B.ADD),
                        asg.Fetch(two, asg.FetchConstant(2.0)),
                        accum(out, B.MUL, [t, two], {i: 5}, [Iterator(i)], [[Iterator(i)], [FixedIdx(0)]]))
    av, bv = rng.standard_normal(5), rng.standard_normal(5)
    opt = check_program(code, {a: av, b: bv}, {out: (av + bv) * 2})
    assert t.is_virtual() and two.is_virtual()
    (st,) = [x for x in ll.iter_stmts(opt.llc) if isinstance(x, ll.Set)]
    j = st.idcs[0]
    assert st.llsc == ll.Binop(B.MUL, ll.Binop(B.ADD, ll.Get(a, (j,)), ll.Get(b, (j,))), ll.Constant(2.0))


# ---------------------------------------------------------------- visits


def test_node_read_more_than_max_visits_stays_materialized(rng):
    a, b, d = node("a", (4,), host=True), node("b", (4,), host=True), node("d", (4,), host=True)
    t = node("t", (4,))
    code = asg.sequence(pointwise(t, B.ADD, a, b), pointwise(d, B.MUL, t, t))
    av, bv = rng.standard_normal(4), rng.standard_normal(4)
    opt = check_program(code, {a: av, b: bv}, {d: (av + bv) ** 2})
    assert t.memory_mode == NEVER_VIRTUAL and t.provenance == 1
    assert opt.traced_store[t].max_visits() == 2
    assert t in nodes_in(opt)


def test_max_visits_setting_allows_inlining_twice(rng):
    a, b, d = node("a", (4,), host=True), node("b", (4,), host=True), node("d", (4,), host=True)
    t = node("t", (4,))
    code = asg.sequence(pointwise(t, B.ADD, a, b), pointwise(d, B.MUL, t, t))
    av, bv = rng.standard_normal(4), rng.standard_normal(4)
    opt = check_program(code, {a: av, b: bv}, {d: (av + bv) ** 2}, settings=VirtualizeSettings(max_visits=2))
    assert t.is_virtual() and t not in nodes_in(opt)


@pytest.mark.parametrize("inline_simple", [True, False])
def test_simple_computation_is_inlined_however_often_read(inline_simple, rng):
    a, d = node("a", (4,), host=True), node("d", (4,), host=True)
    t = node("t", (4,))
    code = asg.sequence(pointwise(t, U.IDENTITY, a), pointwise(d, B.MUL, t, t))
    av = rng.standard_normal(4)
    opt = check_program(code, {a: av}, {d: av * av},
                        settings=VirtualizeSettings(inline_simple_computations=inline_simple))
    assert opt.traced_store[t].is_simple
    assert t.is_virtual() == inline_simple
    if not inline_simple:
        assert t.provenance == 1


@pytest.mark.parametrize("flags", [(True, True), (True, False), (False, True), (False, False)])
def test_scalar_constant_is_inlined_into_a_broadcast(flags, rng):
    constexprs, simple = flags
    a, d = node("a", (3, 4), host=True), node("d", (3, 4), host=True)
    c = node("c", (1,))
    i, j = get_symbol(), get_symbol()
    code = asg.sequence(asg.Fetch(c, asg.FetchConstant(3.0)),
                        accum(d, B.MUL, [a, c], {i: 3, j: 4}, [Iterator(i), Iterator(j)],
                              [[Iterator(i), Iterator(j)], [FixedIdx(0)]]))
    av = rng.standard_normal((3, 4))
    opt = check_program(code, {a: av}, {d: av * 3.0}, settings=VirtualizeSettings(
        inline_scalar_constexprs=constexprs, inline_simple_computations=simple))
    assert opt.traced_store[c].is_scalar_constexpr
    assert opt.traced_store[c].max_visits() == 12
    assert c.is_virtual() == (constexprs or simple)
    if c.is_virtual():
        (st,) = [x for x in ll.iter_stmts(opt.llc) if isinstance(x, ll.Set)]
        assert st.llsc == ll.Binop(B.MUL, ll.Get(a, st.idcs), ll.Constant(3.0))


# ---------------------------------------------------------------- reductions


def sum_rows(s, a):
    i, j = get_symbol(), get_symbol()
    return accum(s, U.IDENTITY, [a], {i: a.dims[0], j: a.dims[1]}, [Iterator(i)], [[Iterator(i), Iterator(j)]],
                 acc=B.ADD, init=True)


@pytest.mark.parametrize("prec", PRECS, ids=lambda p: p.name)
def test_reduction_is_complex_and_stays_materialized(prec, rng):
    a, out = node("a", (3, 5), prec, host=True), node("out", (3,), prec, host=True)
    s = node("s", (3,), prec)
    av = rng.standard_normal((3, 5))
    opt = check_program(asg.sequence(sum_rows(s, a), pointwise(out, U.EXP, s)), {a: av},
                        {out: np.exp(av.astype(prec.dtype).sum(axis=1))},
                        settings=VirtualizeSettings(inline_single_use_reductions=False))
    assert opt.traced_store[s].is_complex and opt.traced_store[s].is_accessing
    assert s.memory_mode == NEVER_VIRTUAL and s.provenance == 2
    assert s in nodes_in(opt)


def test_reduction_inlined_with_inline_complex_computations(rng):
    a, out = node("a", (3, 5), host=True), node("out", (3,), host=True)
    s = node("s", (3,))
    code = asg.sequence(sum_rows(s, a), pointwise(out, U.EXP, s))
    llc = asg.to_low_level(code)
    original_symbols = {x.index for x in ll.iter_stmts(llc) if isinstance(x, ll.ForLoop)}
    av = rng.standard_normal((3, 5))
    opt = check_program(llc, {a: av}, {out: np.exp(av.sum(axis=1))},
                        settings=VirtualizeSettings(inline_complex_computations=True))
    assert s.is_virtual() and s not in nodes_in(opt)
    (st,) = [x for x in ll.iter_stmts(opt.llc) if isinstance(x, ll.Set)]
    (scope,) = [x for x in ll.iter_scalars(st.llsc) if isinstance(x, ll.LocalScope)]
    (loop,) = ll.flatten(scope.body)
    assert isinstance(loop, ll.ForLoop) and (loop.from_, loop.to_) == (0, 4)
    assert loop.index not in original_symbols
    assert loop.body == ll.SetLocal(scope.id, ll.Binop(B.ADD, ll.GetLocal(scope.id),
                                                       ll.Get(a, (st.idcs[0], Iterator(loop.index)))))


def test_total_sum_into_a_fixed_index_is_inlined_with_its_loops(rng):
    a, out = node("a", (2, 3), host=True), node("out", (1,), host=True)
    s = node("s", (1,))
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    code = asg.sequence(accum(s, U.IDENTITY, [a], {i: 2, j: 3}, [FixedIdx(0)], [[Iterator(i), Iterator(j)]],
                              acc=B.ADD, init=True),
                        accum(out, U.EXP, [s], {k: 1}, [FixedIdx(0)], [[FixedIdx(0)]]))
    av = rng.standard_normal((2, 3))
    check_program(code, {a: av}, {out: [np.exp(av.sum())]},
                  settings=VirtualizeSettings(inline_complex_computations=True))
    assert s.is_virtual()


def test_reduction_loop_outside_the_written_index_loop(rng):
    a, out = node("a", (3, 4), host=True), node("out", (3,), host=True)
    s = node("s", (3,))
    j, i = get_symbol(), get_symbol()
    code = asg.sequence(accum(s, U.IDENTITY, [a], {j: 4, i: 3}, [Iterator(i)], [[Iterator(i), Iterator(j)]],
                              acc=B.ADD, init=True),
                        pointwise(out, U.NEG, s))
    llc = asg.to_low_level(code)
    # The neutral initialization is the node's Zero_out (as OCANNL lowers `=:+`), then the nests.
    assert isinstance(next(iter(ll.flatten(llc))), ll.ZeroOut)
    assert [x.to_ - x.from_ + 1 for x in ll.flatten(llc) if isinstance(x, ll.ForLoop)] == [4, 3]
    av = rng.standard_normal((3, 4))
    opt = check_program(llc, {a: av}, {out: -av.sum(axis=1)},
                        settings=VirtualizeSettings(inline_complex_computations=True))
    assert s.is_virtual()
    (st,) = [x for x in ll.iter_stmts(opt.llc) if isinstance(x, ll.Set)]
    (scope,) = [x for x in ll.iter_scalars(st.llsc) if isinstance(x, ll.LocalScope)]
    assert [x.to_ for x in ll.iter_stmts(scope.body) if isinstance(x, ll.ForLoop)] == [3]


# ---------------------------------------------------------------- NonVirtual codes through the pipeline


def test_transposed_self_read_gives_code_4(rng, monkeypatch, capsys):
    monkeypatch.setenv("EINJIT_DEBUG", "4")
    a, out = node("a", (3, 3), host=True), node("out", (3, 3), host=True)
    t = node("t", (3, 3))
    i, j = get_symbol(), get_symbol()
    code = asg.sequence(pointwise(t, U.IDENTITY, a),
                        accum(t, U.IDENTITY, [t], {i: 3, j: 3}, [Iterator(i), Iterator(j)],
                              [[Iterator(j), Iterator(i)]], acc=B.ADD),
                        pointwise(out, B.ADD, t, a))
    av = rng.standard_normal((3, 3))
    want = av.copy()
    for p in range(3):
        for q in range(3):
            want[p, q] += want[q, p]
    check_program(code, {a: av}, {out: want + av}, settings=VirtualizeSettings(max_visits=2))
    assert t.memory_mode == NEVER_VIRTUAL and t.provenance == 4
    assert f"{t.debug_name()} is not virtual: NonVirtual(4)" in capsys.readouterr().err


def test_convolution_backprop_write_gives_code_51(rng, monkeypatch, capsys):
    monkeypatch.setenv("EINJIT_DEBUG", "4")
    n_out, kw = 6, 3
    w, dy, out = node("w", (kw,), host=True), node("dy", (n_out,), host=True), node("out", (n_out + kw - 1,), host=True)
    g = node("g", (n_out + kw - 1,))
    o, k = get_symbol("o"), get_symbol("k")
    code = asg.sequence(accum(g, B.MUL, [w, dy], {o: n_out, k: kw}, [Affine(((1, o), (1, k)), 0)],
                              [[Iterator(k)], [Iterator(o)]], acc=B.ADD, init=True),
                        pointwise(out, B.MUL, g, g))
    wv, dyv = rng.standard_normal(kw), rng.standard_normal(n_out)
    full = np.convolve(dyv, wv)
    check_program(code, {w: wv, dy: dyv}, {out: full * full}, settings=VirtualizeSettings(max_visits=2))
    assert g.memory_mode == NEVER_VIRTUAL and g.provenance == 51
    err = capsys.readouterr().err
    assert f"{g.debug_name()} is not virtual: NonVirtual(51)" in err and "affine" in err


def test_untraced_loop_gives_code_6(rng):
    a, out = node("a", (4,), host=True), node("out", (4,), host=True)
    t = node("t", (4,))
    i, j = get_symbol(), get_symbol()
    llc = ll.seq(ll.ForLoop(i, 0, 3, ll.Set(t, (Iterator(i),), ll.Unop(U.EXP, ll.Get(a, (Iterator(i),)))), False),
                 ll.ForLoop(j, 0, 3, ll.Set(out, (Iterator(j),), ll.Get(t, (Iterator(j),)))))
    av = rng.standard_normal(4)
    check_program(llc, {a: av}, {out: np.exp(av)})
    assert t.memory_mode == NEVER_VIRTUAL and t.provenance == 6


def test_constant_fill_read_by_a_loop_gives_code_13(rng):
    a, out, first = node("a", (3,), host=True), node("out", (3,), host=True), node("first", (1,), host=True)
    f = node("f", (3,))
    i = get_symbol()
    code = asg.sequence(asg.Fetch(f, asg.ConstantFill((1.0, 2.0, 3.0))), pointwise(out, B.MUL, f, a),
                        accum(first, U.IDENTITY, [f], {i: 1}, [FixedIdx(0)], [[FixedIdx(2)]]))
    av = rng.standard_normal(3)
    check_program(code, {a: av}, {out: av * [1, 2, 3], first: [3.0]})
    assert f.memory_mode == NEVER_VIRTUAL and f.provenance == 13


def test_constant_fill_read_at_fixed_indices_is_inlined():
    out = node("out", (1,), host=True)
    f = node("f", (3,))
    i = get_symbol()
    code = asg.sequence(asg.Fetch(f, asg.ConstantFill((1.0, 2.0, 5.0))),
                        accum(out, B.ADD, [f, f], {i: 1}, [FixedIdx(0)], [[FixedIdx(0)], [FixedIdx(2)]]))
    opt = check_program(code, {}, {out: [6.0]}, settings=VirtualizeSettings(max_visits=2))
    assert f.is_virtual()
    assert [x for x in ll.iter_stmts(opt.llc) if isinstance(x, ll.Set)] == [
        ll.Set(out, (FixedIdx(0),), ll.Constant(6.0))]


def test_vector_assignment_gives_code_140():
    src, out = node("src", (2,), host=True), node("out", (2, 4), host=True)
    r = node("r", (2, 4))
    i = get_symbol()
    p = asg.Lazy.of(Projections((2,), (i,), (2, 4), ((2,),), (Iterator(i), SubAxis()), ((Iterator(i),),)))
    code = asg.sequence(asg.SetVecUnop(ops.VecUnop.UNIFORM_HASH, r, asg.Node(src), p), pointwise(out, U.NEG, r))
    ref_llc = asg.to_low_level(code)
    ref = interpret.run(ref_llc, {src: np.array([3.0, 7.0])})
    want = -np.array([ops.uniform_hash(3, 4), ops.uniform_hash(7, 4)])
    np.testing.assert_allclose(ref[out], want)
    check_program(code, {src: [3.0, 7.0]}, {out: want})
    assert r.memory_mode == NEVER_VIRTUAL and r.provenance == 140


def test_overwritten_input_gives_code_131(rng):
    n = 5
    x = node("x", (n,), host=True)
    t = node("t", (n,))
    i = get_symbol()
    code = asg.sequence(pointwise(t, B.ADD, x, x),
                        accum(x, U.IDENTITY, [t], {i: n}, [Iterator(i)], [[Affine(((-1, i),), n - 1)]]))
    xv = rng.standard_normal(n)
    check_program(code, {x: xv}, {x: 2 * xv[::-1]})
    assert t.memory_mode == NEVER_VIRTUAL and t.provenance == 131


def test_update_reading_its_own_cell_through_a_virtual_node(rng):
    p, g = node("p", (2, 3), host=True), node("g", (2, 3), host=True)
    delta, lr = node("delta", (2, 3)), node("lr", (1,))
    i, j = get_symbol(), get_symbol()
    code = asg.sequence(asg.Fetch(lr, asg.FetchConstant(0.1)),
                        accum(delta, B.MUL, [g, lr], {i: 2, j: 3}, [Iterator(i), Iterator(j)],
                              [[Iterator(i), Iterator(j)], [FixedIdx(0)]]),
                        pointwise(delta, B.MUL, p, p, acc=B.ADD),
                        pointwise(p, U.IDENTITY, delta, acc=B.SUB))
    pv, gv = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    opt = check_program(code, {p: pv, g: gv}, {p: pv - (0.1 * gv + pv * pv)})
    assert delta.is_virtual() and lr.is_virtual()
    assert touched_nodes(opt.llc) == {p, g}


def test_input_overwritten_between_computation_and_read(rng):
    x, out = node("x", (4,), host=True), node("out", (4,), host=True)
    t = node("t", (4,))
    code = asg.sequence(pointwise(t, U.EXP, x), pointwise(x, U.NEG, x), pointwise(out, B.ADD, t, x))
    xv = rng.standard_normal(4)
    check_program(code, {x: xv}, {out: np.exp(xv) - xv, x: -xv})
    assert t.provenance == 131


def test_node_read_inside_its_loop_by_a_kept_sibling_is_stored(rng):
    a, u = node("a", (4,), host=True), node("u", (4,), host=True)
    t = node("t", (4,))
    i = get_symbol()
    ai, ti = ll.Get(a, (Iterator(i),)), ll.Get(t, (Iterator(i),))
    llc = ll.ForLoop(i, 0, 3, ll.seq(ll.Set(t, (Iterator(i),), ll.Unop(U.EXP, ai)),
                                     ll.Set(u, (Iterator(i),), ll.Binop(B.MUL, ti, ai))))
    av = rng.standard_normal(4)
    check_program(llc, {a: av}, {u: np.exp(av) * av})
    assert t.memory_mode == NEVER_VIRTUAL


def test_write_repeated_by_another_nodes_loop_gives_code_132(rng):
    a, b, out = node("a", (3,), host=True), node("b", (3,), host=True), node("out", (1,), host=True)
    t, u = node("t", (3,)), node("u", (1,))
    i = get_symbol()
    zero = (FixedIdx(0),)
    llc = ll.seq(
        ll.Set(u, zero, ll.Constant(0.0)),
        ll.ForLoop(i, 0, 2, ll.seq(ll.Set(t, (Iterator(i),), ll.Get(a, (Iterator(i),))),
                                   ll.Set(u, zero, ll.Binop(B.ADD, ll.Get(u, zero), ll.Get(t, (Iterator(i),)))))),
        asg.to_low_level(pointwise(b, U.NEG, t)),
        ll.Set(out, zero, ll.Get(u, zero)))
    av = rng.standard_normal(3)
    check_program(llc, {a: av}, {out: [av.sum()], b: -av},
                  settings=VirtualizeSettings(inline_complex_computations=True))
    assert u.memory_mode == NEVER_VIRTUAL and u.provenance == 132
    assert t.memory_mode == NEVER_VIRTUAL


# ---------------------------------------------------------------- memory modes


def test_user_modes_are_never_overridden(rng):
    dims = (2, 3)
    a, d = node("a", dims, host=True), node("d", dims, host=True)
    s, e, f = node("s", dims, host=True), node("e", dims), node("f", dims)
    e.update_memory_mode(MATERIALIZED, 99)
    code = asg.sequence(pointwise(s, U.EXP, a), pointwise(e, U.NEG, s), pointwise(f, U.TANH, e),
                        pointwise(d, U.IDENTITY, f))
    av = rng.standard_normal(dims)
    opt = check_program(code, {a: av}, {s: np.exp(av), e: -np.exp(av), d: np.tanh(-np.exp(av))})
    assert s.memory_mode == hosted() and s.provenance == 0
    assert e.memory_mode == MATERIALIZED and e.provenance == 99
    assert f.is_virtual()
    assert nodes_in(opt) == {a, s, e, d}


def test_requested_virtual_node_that_cannot_be_virtual_is_an_error():
    a, out = node("a", (4,), host=True), node("out", (4,), host=True)
    t = node("t", (4,))
    t.update_memory_mode(VIRTUAL, 5)
    i = get_symbol()
    llc = ll.seq(ll.ForLoop(i, 0, 3, ll.Set(t, (Iterator(i),), ll.Get(a, (Iterator(i),))), False),
                 asg.to_low_level(pointwise(out, U.NEG, t)))
    with pytest.raises(MemoryModeError, match=r"t#\d+.*provenance 5.*NonVirtual\(6\)"):
        optimize_proc(llc)


def test_read_only_and_recurrent_nodes_are_materialized(rng):
    a, acc = node("a", (3,)), node("acc", (3,))
    code = pointwise(acc, U.IDENTITY, a, acc=B.ADD)
    av = rng.standard_normal(3)
    opt = check_program(code, {a: av, acc: np.ones(3)}, {acc: av + 1})
    ta, tacc = opt.traced_store[a], opt.traced_store[acc]
    assert ta.read_only and a.memory_mode == MATERIALIZED and a.provenance == 37
    assert tacc.read_before_write and not tacc.read_only
    assert acc.memory_mode == MATERIALIZED and acc.provenance == 36
    assert set(tacc.accesses.values()) == {RECURRENT}


def test_without_device_only_stored_nodes_are_hosted(rng):
    a, out = node("a", (3, 4), host=True), node("out", (3,), host=True)
    s = node("s", (3,))
    av = rng.standard_normal((3, 4))
    check_program(asg.sequence(sum_rows(s, a), pointwise(out, U.NEG, s)), {a: av}, {out: -av.sum(axis=1)},
                  settings=VirtualizeSettings(enable_device_only=False, inline_single_use_reductions=False))
    assert s.memory_mode.mode is MemoryMode.HOSTED and s.provenance == 38


def test_switching_virtualization_and_simplification_off(rng):
    a, b = node("a", (4,), host=True), node("b", (4,), host=True)
    t = node("t", (4,))
    code = asg.sequence(pointwise(t, U.EXP, a), pointwise(b, B.ADD, t, t))
    llc = asg.to_low_level(code)
    av = rng.standard_normal(4)
    opt = check_program(llc, {a: av}, {b: 2 * np.exp(av)},
                        settings=VirtualizeSettings(virtualize=False, simplify=False, fuse=False, max_visits=5))
    assert opt.llc == llc
    assert t.memory_mode == NEVER_VIRTUAL
    fused = check_program(llc, {a: av}, {b: 2 * np.exp(av)},
                          settings=VirtualizeSettings(virtualize=False, simplify=False, max_visits=5))
    assert isinstance(fused.llc, ll.ForLoop)  # the two loops, plain arithmetic and exp, fuse


# ---------------------------------------------------------------- static indices, merge buffers, scoping


def test_static_index_slice_is_inlined(rng):
    data, out = node("data", (4, 3), host=True), node("out", (3,), host=True)
    batch = node("batch", (3,))
    b = get_static_symbol(4, "b")
    code = asg.sequence(asg.Fetch(batch, asg.Slice(b, data)), pointwise(out, U.EXP, batch))
    dv = rng.standard_normal((4, 3))
    opt = check_program(code, {data: dv}, {out: np.exp(dv[2])}, static=[b], bindings={b: 2})
    assert batch.is_virtual()
    (st,) = [x for x in ll.iter_stmts(opt.llc) if isinstance(x, ll.Set)]
    assert st.llsc == ll.Unop(U.EXP, ll.Get(data, (Iterator(b.symbol), st.idcs[0])))


def test_undeclared_static_symbol_is_a_scope_error():
    data, out = node("data", (4, 3), host=True), node("out", (3,), host=True)
    b = get_static_symbol(4, "b")
    llc = asg.to_low_level(asg.Fetch(out, asg.Slice(b, data)))
    with pytest.raises(ScopeError, match=rf"symbol {b.symbol!r}"):
        optimize_proc(llc)


def test_merge_buffer_node_is_reported(rng):
    a = node("a", (3,), host=True)
    i = get_symbol()
    llc = ll.ForLoop(i, 0, 2, ll.Set(a, (Iterator(i),), ll.Binop(B.ADD, ll.Get(a, (Iterator(i),)),
                                                                  ll.GetMergeBuffer(a, (Iterator(i),)))))
    opt = optimize_proc(llc)
    assert opt.merge_node is a
    av, mv = rng.standard_normal(3), rng.standard_normal(3)
    got = interpret.run(opt.llc, {a: av.copy()}, merge_buffers={a: mv})
    np.testing.assert_allclose(got[a], av + mv)
    other = node("o", (3,), host=True)
    two = ll.seq(llc, ll.Set(a, (FixedIdx(0),), ll.GetMergeBuffer(other, (FixedIdx(0),))))
    with pytest.raises(ValueError, match="only one merge buffer"):
        optimize_proc(two)


# ---------------------------------------------------------------- debug output


def test_debug_levels(monkeypatch, capsys, tmp_path):
    def program():
        a, d = node("a", (2,), host=True), node("d", (2,), host=True)
        t, u = node("t", (2,)), node("u", (2,))
        llc = asg.to_low_level(asg.sequence(pointwise(t, U.EXP, a), pointwise(u, B.MUL, t, t),
                                            pointwise(d, U.NEG, u)))
        return llc, t, u

    llc, t, u = program()
    monkeypatch.setenv("EINJIT_DEBUG", "4")
    optimize_proc(llc, name="step")
    err = capsys.readouterr().err
    assert "unoptimized low-level code of step" in err and "optimized low-level code of step" in err
    assert f"{t.debug_name()} is not virtual: a cell is read 2 times, max_visits=1 (provenance 1)" in err
    assert f"{u.debug_name()} is virtual: computation inlined at 1 read (provenance 15)" in err

    llc, t, u = program()
    monkeypatch.setenv("EINJIT_DEBUG", "2")
    optimize_proc(llc, name="step")
    err = capsys.readouterr().err
    assert "optimized low-level code of step" in err and "unoptimized" not in err and "virtual" not in err

    llc, t, u = program()
    log = tmp_path / "debug.log"
    monkeypatch.setenv("EINJIT_DEBUG", "4")
    monkeypatch.setenv("EINJIT_DEBUG_FILE", str(log))
    optimize_proc(llc, name="step")
    assert capsys.readouterr().err == ""
    assert f"{u.debug_name()} is virtual" in log.read_text()


def test_non_virtual_describes_its_code():
    assert str(NonVirtual(51, "2*i+k")) == (
        "NonVirtual(51): an affine index of it has several loop symbols (e.g. a convolution); "
        "not supported yet (2*i+k)")
