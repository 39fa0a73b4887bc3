"""Miscompilations seen in the wild, pinned so they stay fixed."""

from __future__ import annotations

from einjit.backends.cc.backend import run_once
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import FixedIdx, Iterator, get_symbol
from einjit.ir.tnode import Tnode, hosted


def test_reduction_over_where_with_conditional_loads():
    """gcc 12.2 at -O3 -march=native vectorizes `l += c ? a[k] : b[k]` over a 2x3 nest with masked
    loads and drops the last element; the renderer loads both branches unconditionally."""
    c, a, b, out = (Tnode(n, d, ops.double) for n, d in (("c", (2, 3)), ("a", (2, 3)), ("b", (2, 3)), ("l", (1,))))
    for tn in (c, a, b, out):
        tn.update_memory_mode(hosted(), 0)
    i, j = get_symbol(), get_symbol()
    ij = (Iterator(i), Iterator(j))
    body = ll.Set(out, (FixedIdx(0),), ll.Binop(ops.Binop.ADD, ll.Get(out, (FixedIdx(0),)),
                                              ll.Ternop(ops.Ternop.WHERE, ll.Get(c, ij), ll.Get(a, ij), ll.Get(b, ij))))
    code = ll.seq(ll.Set(out, (FixedIdx(0),), ll.Constant(0.0)), ll.ForLoop(i, 0, 1, ll.ForLoop(j, 0, 2, body)))
    c.host_array()[...] = [[1, 0, 1], [0, 0, 1]]
    a.host_array()[...] = 1.0
    b.host_array()[...] = 2.0
    run_once(code, name="where_reduction")
    assert out.host_array()[0] == 9.0
