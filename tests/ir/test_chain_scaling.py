"""The optimizer on long chains of virtual nodes (issue 13, compile speed): the work grows
linearly with the chain's length, and the inlined chain computes what the unoptimized code
computes. Work is counted in calls of the copying and simplifying functions, not timed."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.optimize import VirtualizeSettings, optimize_proc
from einjit.ir.passes import simplify, virtualize
from einjit.ir.tnode import Tnode, hosted

B, U = ops.Binop, ops.Unop


def chain(n: int, width: int = 8) -> tuple[ll.LLStmt, list[Tnode]]:
    """`t[k+1] = relu(t[k])` or `t[k+1] = t[k] * 0.75 + 0.5`, alternating; only the ends hosted."""
    nodes = [Tnode(f"t{k}", (width,), ops.double) for k in range(n + 1)]
    for end in (nodes[0], nodes[-1]):
        end.update_memory_mode(hosted(), 0)
    stmts = []
    for k, (src, dst) in enumerate(pairwise(nodes)):
        i = get_symbol()
        read = ll.Get(src, (Iterator(i),))
        value = (ll.Unop(U.RELU, read) if k % 2 else
                 ll.Binop(B.ADD, ll.Binop(B.MUL, read, ll.Constant(0.75)), ll.Constant(0.5)))
        stmts.append(ll.ForLoop(i, 0, width - 1, ll.Set(dst, (Iterator(i),), value)))
    return ll.seq(*stmts), nodes


def expected(x: np.ndarray, n: int) -> np.ndarray:
    for k in range(n):
        x = np.maximum(x, 0.0) if k % 2 else x * 0.75 + 0.5
    return x


def count_calls(monkeypatch: pytest.MonkeyPatch, module, name: str) -> list[int]:
    counter = [0]
    original = getattr(module, name)

    def counted(*args, **kwargs):
        counter[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return counter


@pytest.mark.parametrize(("module", "name"), [(virtualize, "_inline_scalar"), (virtualize, "_inline_stmt"),
                                              (ll, "deep_parts"), (simplify, "_scalar")])
def test_optimizer_work_is_linear_in_the_chain_length(monkeypatch, module, name):
    calls = {}
    for n in (100, 400):
        code, _ = chain(n)
        with monkeypatch.context() as m:
            counter = count_calls(m, module, name)
            optimize_proc(code, name="chain")
            calls[n] = counter[0]
    assert calls[100] > 0
    ratio = calls[400] / calls[100]
    assert 3.5 <= ratio <= 4.5, (name, calls)  # quadratic work gives 16


def test_deep_parts_visits_a_linear_number_of_nodes(monkeypatch):
    """`deep_parts` is called a linear number of times; each call must also visit a bounded part
    of the code (before, every inlined value was scanned again at each level of the chain)."""
    visited = {}
    original = ll.deep_parts
    for n in (100, 400):
        count = [0]

        def counted(root, count=count):
            for x in original(root):
                count[0] += 1
                yield x

        code, _ = chain(n)
        with monkeypatch.context() as m:
            m.setattr(ll, "deep_parts", counted)
            optimize_proc(code, name="chain")
        visited[n] = count[0]
    assert 3.5 <= visited[400] / visited[100] <= 4.5, visited


@pytest.mark.parametrize("n", [1, 2, 7, 150])
def test_inlined_chain_computes_the_chain(n):
    code, nodes = chain(n)
    x = np.linspace(-3.0, 3.0, 8)
    ref = interpret.run(code, {nodes[0]: x.copy()})
    opt = optimize_proc(code, name="chain")
    got = interpret.run(opt.llc, {nodes[0]: x.copy()})
    np.testing.assert_allclose(ref[nodes[-1]], expected(x, n), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[nodes[-1]], ref[nodes[-1]], rtol=1e-12, atol=1e-12)
    assert all(t.is_virtual() for t in nodes[1:-1])
    assert {x.tn for x in ll.deep_parts(opt.llc) if isinstance(x, (ll.Get, ll.Set))} == {nodes[0], nodes[-1]}
    assert sum(isinstance(x, ll.ForLoop) for x in ll.deep_parts(opt.llc)) == 1


def test_a_chain_node_read_twice_is_stored_and_both_halves_inline():
    """A middle node read by two consumers stays stored (max_visits); the chain on each side of
    it is still inlined, and the pending copies of the first half are made only once."""
    n = 40
    code, nodes = chain(n)
    mid, i = nodes[n // 2], get_symbol()
    side = Tnode("side", (8,), ops.double)
    side.update_memory_mode(hosted(), 0)
    extra = ll.ForLoop(i, 0, 7, ll.Set(side, (Iterator(i),), ll.Unop(U.NEG, ll.Get(mid, (Iterator(i),)))))
    code = ll.seq(code, extra)
    x = np.linspace(-3.0, 3.0, 8)
    opt = optimize_proc(code, name="chain")
    got = interpret.run(opt.llc, {nodes[0]: x.copy()})
    np.testing.assert_allclose(got[nodes[-1]], expected(x, n), rtol=1e-12)
    np.testing.assert_allclose(got[side], -expected(x, n // 2), rtol=1e-12)
    assert not mid.is_virtual()
    assert all(t.is_virtual() for t in nodes[1:-1] if t is not mid)
    assert sum(isinstance(x, ll.ForLoop) for x in ll.deep_parts(opt.llc)) == 3


def test_a_node_written_twice_inlines_both_computations_with_their_pending_scopes():
    """`t := a; u := 2 t; t := t + u; out := t`: `u` inlines the first computation of `t`, the
    second inlines `u`, and `out` inlines both computations of `t` — pending scopes copied
    inside pending scopes."""
    a, out = Tnode("a", (4,), ops.double), Tnode("out", (4,), ops.double)
    t, u = Tnode("t", (4,), ops.double), Tnode("u", (4,), ops.double)
    for end in (a, out):
        end.update_memory_mode(hosted(), 0)

    def loop(tn, value):
        i = get_symbol()
        return ll.ForLoop(i, 0, 3, ll.Set(tn, (Iterator(i),), value(Iterator(i))))

    code = ll.seq(loop(t, lambda i: ll.Get(a, (i,))),
                  loop(u, lambda i: ll.Binop(B.MUL, ll.Get(t, (i,)), ll.Constant(2.0))),
                  loop(t, lambda i: ll.Binop(B.ADD, ll.Get(t, (i,)), ll.Get(u, (i,)))),
                  loop(out, lambda i: ll.Get(t, (i,))))
    av = np.array([1.0, -2.0, 0.5, 3.0])
    ref = interpret.run(code, {a: av.copy()})
    opt = optimize_proc(code, name="nested", settings=VirtualizeSettings(max_visits=2))
    got = interpret.run(opt.llc, {a: av.copy()})
    np.testing.assert_array_equal(ref[out], 3 * av)
    np.testing.assert_array_equal(got[out], 3 * av)
    assert t.is_virtual() and u.is_virtual()
    assert {x.tn for x in ll.deep_parts(opt.llc) if isinstance(x, (ll.Get, ll.Set))} == {a, out}
