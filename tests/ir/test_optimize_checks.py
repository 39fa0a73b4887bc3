"""The optimizer's parts on hand-built low-level code: the facts tracing records, every
`NonVirtual` code of `check_computation` / `inline_computation`, substitution of affine
indices when inlining, and the scope check of cleanup."""

from __future__ import annotations

import pytest

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import Affine, FixedIdx, Iterator, SubAxis, get_symbol
from einjit.ir.optimize import optimize_proc
from einjit.ir.passes.cleanup import ScopeError
from einjit.ir.passes.tracing import RECURRENT, VirtualizeSettings, lookup, visit_llc
from einjit.ir.passes.virtualize import (
    NonVirtual,
    VirtualState,
    check_and_store_virtual,
    check_computation,
    inline_computation,
)
from einjit.ir.tnode import Tnode, hosted

B, U = ops.Binop, ops.Unop
C = ll.Constant


def node(label, dims=(3,), host=False):
    tn = Tnode(label, dims, ops.double)
    if host:
        tn.update_memory_mode(hosted(), 0)
    return tn


def it(s):
    return Iterator(s)


def trace(llc, **kw):
    return visit_llc(llc, settings=VirtualizeSettings(**kw))


# ---------------------------------------------------------------- tracing


def test_lookup_of_every_index_kind():
    i, j, s = get_symbol(), get_symbol(), get_symbol("s")
    idcs = (FixedIdx(1), it(i), Affine(((2, i), (1, j)), -1), SubAxis(), it(s))
    assert lookup({i: 2, j: 3}, idcs) == (1, 2, 6, 0, 0)


def test_assignments_accesses_and_reverse_node_map():
    a, t, out = node("a", (2, 3)), node("t", (2,)), node("out", (2,))
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    llc = ll.seq(
        ll.ForLoop(i, 0, 1, ll.Set(t, (it(i),), C(0.0))),
        ll.ForLoop(j, 0, 1, ll.ForLoop(k, 0, 2, ll.Set(t, (it(j),), ll.Binop(
            B.ADD, ll.Get(t, (it(j),)), ll.Get(a, (it(j), it(k))))))),
        ll.ForLoop(i2 := get_symbol(), 0, 1, ll.Set(out, (it(i2),), ll.Binop(
            B.MUL, ll.Get(t, (it(i2),)), ll.Get(t, (FixedIdx(0),))))))
    tr = trace(llc)
    tt, ta, tout = tr.traced_store[t], tr.traced_store[a], tr.traced_store[out]
    assert tt.assignments == {(0,), (1,)}
    assert tt.accesses == {(0,): 3, (1,): 1}
    assert tt.max_visits() == 3
    assert tt.is_complex and tt.is_accessing and not tt.is_simple and not tt.read_only
    assert ta.read_only and ta.read_before_write
    assert ta.accesses == {(r, c): RECURRENT for r in range(2) for c in range(3)}
    assert tout.assignments == {(0,), (1,)} and not tout.accesses
    assert tr.reverse_node_map == {i: t, j: t, k: t, i2: out}
    assert tr.merge_node is None


def test_tracing_unrolls_a_prefix_and_remembers_the_rest_is_written():
    t, u = node("t", (8,)), node("u", (1,))
    i = get_symbol()
    llc = ll.seq(ll.ForLoop(i, 0, 7, ll.Set(t, (it(i),), ll.EmbedIndex(it(i)))),
                 ll.Set(u, (FixedIdx(0),), ll.Get(t, (FixedIdx(7),))))
    tt = trace(llc, max_tracing_dim=5).traced_store[t]
    assert tt.assignments == {(p,) for p in range(5)}
    assert tt.written_boxes == {((0, 7),)}
    assert tt.accesses == {(7,): 1} and not tt.read_before_write
    assert trace(llc, max_tracing_dim=8).traced_store[t].written_boxes == set()


def test_untraced_loop_runs_once_in_the_trace():
    t = node("t", (4, 2))
    i, j = get_symbol(), get_symbol()
    llc = ll.ForLoop(i, 0, 3, ll.ForLoop(j, 0, 1, ll.Set(t, (it(i), it(j)), C(1.0))), trace_it=False)
    tt = trace(llc).traced_store[t]
    assert tt.assignments == {(0, 0), (0, 1)}
    assert tt.written_boxes == {((0, 3), (0, 1))}


def test_read_before_write_is_recurrent():
    t, u = node("t", (2,)), node("u", (2,))
    i = get_symbol()
    llc = ll.ForLoop(i, 0, 1, ll.seq(ll.Set(u, (it(i),), ll.Get(t, (it(i),))), ll.Set(t, (it(i),), C(1.0))))
    tt = trace(llc).traced_store[t]
    assert tt.read_before_write and tt.accesses == {(0,): RECURRENT, (1,): RECURRENT}
    assert tt.max_visits() is RECURRENT


def test_zero_out_and_scalar_constant_expressions():
    a, c, d, e, z, late = node("a"), node("c", (1,)), node("d", (1, 1)), node("e", (1,)), node("z", (1,)), node("late")
    zero = (FixedIdx(0),)
    llc = ll.seq(ll.ZeroOut(z),
                 ll.Set(c, zero, C(2.0)),
                 ll.Set(d, (FixedIdx(0), FixedIdx(0)), ll.Binop(B.MUL, ll.Get(c, zero), ll.Get(z, zero))),
                 ll.Set(e, zero, ll.Get(a, zero)),
                 ll.Set(late, zero, C(1.0)), ll.ZeroOut(late))
    store = trace(llc).traced_store
    assert store[z].zero_initialized_by_code and store[z].zeroed_out and store[z].is_scalar_constexpr
    assert store[c].is_scalar_constexpr and not store[c].is_accessing
    assert store[d].is_scalar_constexpr and not store[d].is_accessing
    assert not store[e].is_scalar_constexpr and store[e].is_accessing and store[e].is_simple
    assert store[late].zeroed_out and not store[late].zero_initialized_by_code
    assert store[a].read_only


def test_assigned_twice_is_not_a_scalar_constexpr():
    c = node("c", (1,))
    llc = ll.seq(ll.Set(c, (FixedIdx(0),), C(2.0)), ll.Set(c, (FixedIdx(0),), C(3.0)))
    assert not trace(llc).traced_store[c].is_scalar_constexpr


def test_tracing_follows_the_taken_branch_of_bounds_guards():
    t, out = node("t", (4,)), node("out", (4,))
    i, j = get_symbol(), get_symbol()
    shifted = Affine(((1, j),), -1)
    guard = ll.Binop(B.CMPLT, C(-1.0), ll.EmbedIndex(shifted))
    llc = ll.seq(ll.ForLoop(i, 0, 3, ll.Set(t, (it(i),), C(1.0))),
                 ll.ForLoop(j, 0, 3, ll.Set(out, (it(j),),
                                            ll.Ternop(ops.Ternop.WHERE, guard, ll.Get(t, (shifted,)), C(0.0)))))
    tt = trace(llc).traced_store[t]
    assert tt.accesses == {(0,): 1, (1,): 1, (2,): 1} and not tt.read_before_write


def test_one_merge_buffer_per_routine():
    a, b, t = node("a"), node("b"), node("t")
    zero = (FixedIdx(0),)
    assert trace(ll.Set(t, zero, ll.GetMergeBuffer(a, zero))).merge_node is a
    with pytest.raises(ValueError, match="only one merge buffer"):
        trace(ll.seq(ll.Set(t, zero, ll.GetMergeBuffer(a, zero)), ll.Set(t, zero, ll.GetMergeBuffer(b, zero))))


# ---------------------------------------------------------------- every NonVirtual code


def _cases():
    t, t2, t5, u, a = node("t"), node("t2", (3, 3)), node("t5", (5,)), node("u"), node("a")
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    one = C(1.0)
    return {
        4: (t, ll.ForLoop(i, 0, 2, ll.Set(t, (it(i),), ll.Get(t, (FixedIdx(0),))))),
        5: (t2, ll.ForLoop(i, 0, 2, ll.Set(t2, (it(i), it(i)), one))),
        51: (t5, ll.ForLoop(i, 0, 2, ll.ForLoop(k, 0, 2, ll.Set(t5, (Affine(((1, i), (1, k)), 0),), one)))),
        6: (t, ll.ForLoop(i, 0, 2, ll.Set(t, (it(i),), one), trace_it=False)),
        7: (t, ll.ForLoop(i, 0, 2, ll.seq(ll.Set(t, (it(i),), one), ll.Set(u, (it(j),), one)))),
        8: (t, ll.ForLoop(i, 0, 2, ll.seq(ll.Set(t, (it(i),), one), ll.StagedCompilation(lambda: "f();")))),
        9: (t, ll.ForLoop(i, 0, 2, ll.Set(t, (it(i),), ll.Get(a, (it(j),))))),
        10: (t, ll.ForLoop(i, 0, 2, ll.Set(t, (it(i),), ll.EmbedIndex(it(j))))),
        11: (node("h", host=True), ll.Noop()),
        12: (t, ll.ForLoop(i, 0, 2, ll.Set(u, (it(i),), one))),
        140: (t, ll.SetFromVec(t, (FixedIdx(0),), 3, ops.VecUnop.UNIFORM_HASH, one)),
    }


@pytest.mark.parametrize("code", sorted(_cases()))
def test_check_computation_codes(code):
    tn, llc = _cases()[code]
    with pytest.raises(NonVirtual) as info:
        check_computation(tn, frozenset(), llc)
    assert info.value.code == code


def test_static_symbols_do_not_escape():
    t, a = node("t"), node("a", (4,))
    i, s = get_symbol(), get_symbol("s")
    llc = ll.ForLoop(i, 0, 2, ll.Set(t, (it(i),), ll.Get(a, (it(s),))))
    assert check_computation(t, frozenset({s}), llc) == (it(i),)
    with pytest.raises(NonVirtual, match=r"NonVirtual\(9\)"):
        check_computation(t, frozenset(), llc)


def _stored(tn, llc, static=frozenset()):
    state = VirtualState(trace(llc), static)
    assert check_and_store_virtual(state, tn, llc)
    return state


def test_inline_codes_13_and_14():
    t = node("t", (4,))
    i = get_symbol()
    partial = ll.ForLoop(i, 0, 2, ll.Set(t, (it(i),), C(1.0)))
    with pytest.raises(NonVirtual, match=r"NonVirtual\(13\).*does not sweep axis 0"):
        inline_computation(ll.fresh_scope_id(t), _stored(t, partial), t, (FixedIdx(1),))
    with pytest.raises(NonVirtual, match=r"NonVirtual\(14\)"):
        inline_computation(ll.fresh_scope_id(t), VirtualState(trace(ll.Noop()), frozenset()), t, (FixedIdx(1),))
    j = get_symbol()
    shifted = ll.ForLoop(j, 0, 2, ll.Set(t, (Affine(((1, j),), 1),), C(1.0)))
    with pytest.raises(NonVirtual, match=r"NonVirtual\(13\).*written at i\d+\+1"):
        inline_computation(ll.fresh_scope_id(t), _stored(t, shifted), t, (Affine(((1, j),), 1),))


def test_inlining_substitutes_affine_call_indices_and_freshens_loops():
    t, a = node("t", (3,)), node("a", (12,))
    i, k, j = get_symbol("i"), get_symbol("k"), get_symbol("j")
    body = ll.Set(t, (it(i),), ll.Binop(B.ADD, ll.Get(t, (it(i),)), ll.Get(a, (Affine(((2, i), (1, k)), 1),))))
    llc = ll.ForLoop(i, 0, 2, ll.ForLoop(k, 0, 3, body))
    state = _stored(t, llc)
    sid = ll.fresh_scope_id(t)
    got = inline_computation(sid, state, t, (Affine(((2, j),), 1),))
    assert isinstance(got, ll.ForLoop) and got.index not in (i, k, j) and (got.from_, got.to_) == (0, 3)
    k2 = got.index
    assert got.body == ll.SetLocal(sid, ll.Binop(B.ADD, ll.GetLocal(sid),
                                                 ll.Get(a, (Affine(((4, j), (1, k2)), 3),))))
    again = inline_computation(ll.fresh_scope_id(t), state, t, (FixedIdx(2),))
    assert again.body.value.arg2 == ll.Get(a, (Affine(((1, again.index),), 5),))


def test_inlined_local_scopes_get_fresh_ids():
    t, u, a = node("t"), node("u"), node("a")
    i = get_symbol()
    inner = ll.fresh_scope_id(u)
    read = ll.LocalScope(inner, ll.SetLocal(inner, ll.Get(a, (it(i),))), (it(i),))
    llc = ll.ForLoop(i, 0, 2, ll.Set(t, (it(i),), ll.Unop(U.EXP, read)))
    state = _stored(t, llc)
    state.inlined_scopes.add(inner)
    got = inline_computation(ll.fresh_scope_id(t), state, t, (FixedIdx(1),))
    scope = got.value.arg
    assert scope.id != inner and scope.id.tn is u and scope.id in state.inlined_scopes
    assert scope.body == ll.SetLocal(scope.id, ll.Get(a, (FixedIdx(1),)))
    assert scope.orig_indices == (FixedIdx(1),)


# ---------------------------------------------------------------- cleanup


def test_cleanup_rejects_unbound_symbols():
    a, out = node("a", host=True), node("out", host=True)
    j = get_symbol()
    with pytest.raises(ScopeError, match=rf"symbol {j!r} .* read of a#"):
        optimize_proc(ll.Set(out, (FixedIdx(0),), ll.Get(a, (it(j),))))
    with pytest.raises(ScopeError, match="embedded index"):
        optimize_proc(ll.Set(out, (FixedIdx(0),), ll.EmbedIndex(it(j))))
