"""The loop-independence analysis the CUDA planner uses (`backends/parallel_loops.py`)."""

from __future__ import annotations

from einjit.backends.parallel_loops import accesses, is_parallel, parallel_chain
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import FixedIdx, Iterator, get_symbol
from einjit.ir.tnode import Tnode


def test_elementwise_loops_are_parallel_and_a_reduction_into_one_cell_is_not():
    a, out, total = Tnode("a", (4, 5)), Tnode("out", (4, 5)), Tnode("total", (1,))
    i, j = get_symbol(), get_symbol()
    ij = (Iterator(i), Iterator(j))
    double = ll.ForLoop(i, 0, 3, ll.ForLoop(j, 0, 4, ll.Set(out, ij, ll.Binop(ops.Binop.MUL, ll.Get(a, ij),
                                                                               ll.Constant(2.0)))))
    assert is_parallel(double, set()) and [lp.index for lp in parallel_chain(double, set())] == [i, j]
    at0 = (FixedIdx(0),)
    k = get_symbol()
    reduce = ll.ForLoop(k, 0, 3, ll.Set(total, at0, ll.Binop(ops.Binop.ADD, ll.Get(total, at0),
                                                             ll.Get(a, (Iterator(k), FixedIdx(0))))))
    assert not is_parallel(reduce, set()) and parallel_chain(reduce, set()) == ()
    found = [(x.tn, x.write) for x in accesses(reduce)]
    assert found[-1] == (total, True) and set(found[:-1]) == {(total, False), (a, False)}


def test_a_private_scratch_node_written_before_read_keeps_a_loop_parallel():
    a, out, tmp = Tnode("a", (4,)), Tnode("out", (4,)), Tnode("tmp", (1,))
    i = get_symbol()
    at0 = (FixedIdx(0),)
    body = ll.seq(ll.Set(tmp, at0, ll.Get(a, (Iterator(i),))),
                  ll.Set(out, (Iterator(i),), ll.Binop(ops.Binop.ADD, ll.Get(tmp, at0), ll.Constant(1.0))))
    loop = ll.ForLoop(i, 0, 3, body)
    assert is_parallel(loop, {tmp}) and not is_parallel(loop, set())
