"""Tracing's nest limit (`VirtualizeSettings.max_tracing_nest`): deep nests trace only the first
two iterations of their inner loops, which must still reveal a cell read twice."""

from __future__ import annotations

import pytest

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import Affine, Iterator, get_symbol
from einjit.ir.passes.tracing import VirtualizeSettings, visit_llc
from einjit.ir.tnode import Tnode


def _conv_like():
    """`t := relu(x)`, then a 7-deep window nest reading `t[c, y+u, x+v]`: each cell of `t` is
    read by several (y, u) pairs, but only once per pair of inner iterations."""
    n_, o_, c_, h, k = 4, 4, 4, 6, 3
    x, t = Tnode("x", (c_, h + k - 1, h + k - 1)), Tnode("t", (c_, h + k - 1, h + k - 1))
    out = Tnode("out", (n_, o_, h, h))
    a, b, c = get_symbol("a"), get_symbol("b"), get_symbol("c")
    fill = ll.Set(t, (Iterator(a), Iterator(b), Iterator(c)),
                  ll.Unop(ops.Unop.RELU, ll.Get(x, (Iterator(a), Iterator(b), Iterator(c)))))
    fill = ll.ForLoop(a, 0, c_ - 1, ll.ForLoop(b, 0, h + k - 2, ll.ForLoop(c, 0, h + k - 2, fill)))
    n, o, ci, y, xx, u, v = (get_symbol(s) for s in ("n", "o", "ci", "y", "x", "u", "v"))
    read = ll.Get(t, (Iterator(ci), Affine(((1, y), (1, u))), Affine(((1, xx), (1, v)))))
    cell = (Iterator(n), Iterator(o), Iterator(y), Iterator(xx))
    body = ll.Set(out, cell, ll.Binop(ops.Binop.ADD, ll.Get(out, cell), read))
    for s, e in reversed([(n, n_), (o, o_), (ci, c_), (y, h), (xx, h), (u, k), (v, k)]):
        body = ll.ForLoop(s, 0, e - 1, body)
    return ll.seq(ll.ZeroOut(out), fill, body), t


@pytest.mark.parametrize("nest", [1, 25, 125, 10**9])
def test_a_cell_read_through_two_window_offsets_counts_twice_at_any_nest_limit(nest):
    code, t = _conv_like()
    traced = visit_llc(code, settings=VirtualizeSettings(max_tracing_nest=nest)).traced_store[t]
    assert traced.max_visits() >= 4  # (y, u) in {(0, 1), (1, 0)} times (x, v) likewise
    assert not traced.read_before_write


def test_the_default_nest_limit_traces_a_deep_nest_cheaply():
    """The default limit: the window nest's 7 loops run 4*4*4*2^4 = 1024 traced iterations
    rather than 4*4*4*5*5*3*3 = 14400; this is what keeps tracing a small share of compiling."""
    code, t = _conv_like()
    traced = visit_llc(code, settings=VirtualizeSettings()).traced_store[t]
    assert len(traced.accesses) == 4 * 3 * 3  # c in 0..3, y+u and x+v in 0..2
