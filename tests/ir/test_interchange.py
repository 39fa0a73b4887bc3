"""The interchange stage of the optimizer (`ir/sched/interchange.py`): the unit-stride loop of a
nest's left-hand side moves innermost when the nest's iterations may run in any order."""

from __future__ import annotations

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import Affine, Iterator, get_symbol
from einjit.ir.sched.interchange import interchange_loops
from einjit.ir.tnode import Tnode


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def _matmul(n=8):
    a, b, c = Tnode("a", (n, n)), Tnode("b", (n, n)), Tnode("c", (n, n))
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    acc = ll.Set(c, it(i, j), ll.Binop(ops.Binop.ADD, ll.Get(c, it(i, j)),
                                        ll.Binop(ops.Binop.MUL, ll.Get(a, it(i, k)), ll.Get(b, it(k, j)))))
    return ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, n - 1, ll.ForLoop(k, 0, n - 1, acc))), (i, j, k)


def _loop_order(code):
    return [s.index for s in ll.iter_stmts(code) if isinstance(s, ll.ForLoop)]


def test_interchange_moves_unit_stride_lhs_loop_innermost():
    code, (i, j, k) = _matmul()
    assert _loop_order(interchange_loops(code)) == [i, k, j]


def test_interchange_keeps_row_reduction_and_unsafe_nests():
    a, s, o = Tnode("a", (8, 8)), Tnode("s", (8,)), Tnode("o", (8, 8))
    i, k = get_symbol(), get_symbol()
    row_sum = ll.ForLoop(i, 0, 7, ll.ForLoop(k, 0, 7, ll.Set(s, it(i), ll.Binop(
        ops.Binop.ADD, ll.Get(s, it(i)), ll.Get(a, it(i, k))))))
    assert _loop_order(interchange_loops(row_sum)) == [i, k]
    col_sum = ll.ForLoop(i, 0, 7, ll.ForLoop(k, 0, 7, ll.Set(s, it(i), ll.Binop(
        ops.Binop.ADD, ll.Get(s, it(i)), ll.Get(a, it(k, i))))))
    assert _loop_order(interchange_loops(col_sum)) == [k, i]
    shifted = ll.ForLoop(i, 0, 7, ll.ForLoop(k, 1, 7, ll.Set(o, it(k, i), ll.Binop(
        ops.Binop.ADD, ll.Get(o, (Affine(((1, k),), -1), Iterator(i))), ll.Get(a, it(i, k))))))
    assert _loop_order(interchange_loops(shifted)) == [i, k]


def test_interchange_keeps_a_row_sum_reading_a_row_broadcast_value():
    """`var[i] += (x[i, k] - mean[i]) * (x[i, k] - mean[i])`: `mean[i]`, read twice and invariant
    along the row, does not outvote the unit-stride read of `x` (LayerNorm's variance once its
    `x - mean` is recomputed, not stored: column-outer, it read `x` 512 bytes apart)."""
    x, mean, var = Tnode("x", (8, 16)), Tnode("mean", (8,)), Tnode("var", (8,))
    i, k = get_symbol(), get_symbol()
    d = ll.Binop(ops.Binop.SUB, ll.Get(x, it(i, k)), ll.Get(mean, it(i)))
    row = ll.ForLoop(i, 0, 7, ll.ForLoop(k, 0, 15, ll.Set(var, it(i), ll.Ternop(
        ops.Ternop.FMA, d, d, ll.Get(var, it(i))))))
    assert _loop_order(interchange_loops(row)) == [i, k]
