"""The epilogues stage (`ir/sched/epilogues.py`): a bias addition (or a residual one) that reads
a scheduled product cell by cell moves into the product's store, and the product's own node
goes; bit for bit the unscheduled code's values under the interpreter and gcc, at 1 and 2
threads. Consumers that read other cells, compute what a vector statement cannot, or products
whose node is read again or kept stay as they are."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import FixedIdx, Iterator, get_symbol
from einjit.ir.sched.epilogues import MAX_OPERAND_BYTES, fold_epilogues
from einjit.ir.sched.first_writes import first_writes
from einjit.ir.sched.schedule import schedule_llc
from einjit.ir.tnode import LOCAL, MATERIALIZED, Tnode
from test_schedule import ANY_SIZE, ON, check_exact, inputs_for, it, matmul

THREADED = dataclasses.replace(ANY_SIZE, parallel_min_work=1)


def product_of(n, m, p):
    """`c = a @ b.T` (the dense layer's `w @ x`) into a routine-local `c`."""
    product, a, b, c = matmul(n, m, p, transposed=True)
    c.memory_mode = LOCAL
    return product, a, b, c


def over(out, body_of):
    """`out[i, j] = body_of(i, j)` over fresh loop symbols."""
    i, j = get_symbol("i"), get_symbol("j")
    n, p = out.dims
    return ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, p - 1, ll.Set(out, it(i, j), body_of(i, j))))


def add(x, y):
    return ll.Binop(ops.Binop.ADD, x, y)


def biased(c, bias):
    """`y = bias + c`, the dense layer's bias addition."""
    y = Tnode("y", c.dims, c.prec)
    return y, over(y, lambda i, j: add(ll.Get(bias, (Iterator(j),)), ll.Get(c, it(i, j))))


def scheduled(code, blocking=ANY_SIZE):
    return first_writes(schedule_llc(code, ON, blocking))


def top_level(code):
    return list(ll.flatten(code))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,m,p", [(16, 8, 32), (12, 5, 40)], ids=["whole panels", "tail panel"])
def test_a_bias_addition_moves_into_the_products_store(n, m, p, threads):
    product, a, b, c = product_of(n, m, p)
    bias = Tnode("bias", (p,))
    y, consumer = biased(c, bias)
    code = ll.seq(product, consumer)
    before = scheduled(code, THREADED)
    new = fold_epilogues(before)
    assert c in ll.nodes_of(before) and c not in ll.nodes_of(new)
    assert len(top_level(new)) == len(top_level(before)) - 1
    want = check_exact(code, new, inputs_for(a, b, bias), y, threads=threads, name=f"epilogue{threads}")
    ins = inputs_for(a, b, bias)
    np.testing.assert_allclose(want, ins[a] @ ins[b].T + ins[bias], rtol=1e-5, atol=1e-5)


def test_a_residual_addition_and_the_rest_of_its_nest():
    """`y = r + (bias + c)` moves in; a second statement of the same nest, reading `y`, stays
    behind and reads what the product stored."""
    product, a, b, c = product_of(16, 8, 32)
    bias, r = Tnode("bias", (32,)), Tnode("r", (16, 32))
    y, z = Tnode("y", (16, 32)), Tnode("z", (16, 32))
    i, j = get_symbol("i"), get_symbol("j")
    body = ll.seq(ll.Set(y, it(i, j), add(ll.Get(r, it(i, j)), add(ll.Get(bias, (Iterator(j),)), ll.Get(c, it(i, j))))),
                  ll.Set(z, it(i, j), ll.Unop(ops.Unop.EXP, ll.Get(y, it(i, j)))))
    consumer = ll.ForLoop(i, 0, 15, ll.ForLoop(j, 0, 31, body))
    code = ll.seq(product, consumer)
    new = fold_epilogues(scheduled(code))
    assert c not in ll.nodes_of(new)
    last = top_level(new)[-1]
    assert {x.tn for x in ll.deep_parts(last) if isinstance(x, ll.Set)} == {z}
    ins = inputs_for(a, b, bias, r)
    check_exact(code, new, ins, y)
    check_exact(code, new, ins, z)


def _stays(product, c, consumer, *extra):
    code = ll.seq(product, consumer, *extra)
    before = scheduled(code)
    assert fold_epilogues(before) == before


def test_a_consumer_reading_another_cell_stays():
    product, a, b, c = product_of(16, 8, 16)
    y = Tnode("y", (16, 16))
    _stays(product, c, over(y, lambda i, j: ll.Get(c, it(j, i))))


def test_a_consumer_computing_more_than_vector_arithmetic_stays():
    product, a, b, c = product_of(16, 8, 32)
    y = Tnode("y", (16, 32))
    _stays(product, c, over(y, lambda i, j: ll.Unop(ops.Unop.EXP, ll.Get(c, it(i, j)))))


def test_a_read_across_the_lanes_stays():
    """The bias read along its first axis by the lane's symbol: not one vector load."""
    product, a, b, c = product_of(16, 8, 32)
    bias = Tnode("bias", (32, 2))
    y = Tnode("y", (16, 32))
    _stays(product, c, over(y, lambda i, j: add(ll.Get(bias, (Iterator(j), FixedIdx(0))), ll.Get(c, it(i, j)))))


@pytest.mark.parametrize("case", ["read again", "kept", "accumulated"])
def test_a_product_whose_node_is_needed_stays(case):
    product, a, b, c = product_of(16, 8, 32)
    if case == "kept":
        c.memory_mode = MATERIALIZED
    if case == "accumulated":
        product = top_level(product)[1]
    bias = Tnode("bias", (32,))
    y, consumer = biased(c, bias)
    extra = [over(Tnode("z", c.dims), lambda i, j: ll.Get(c, it(i, j)))] if case == "read again" else []
    _stays(product, c, consumer, *extra)


def test_off_without_local_storage():
    product, a, b, c = product_of(16, 8, 32)
    y, consumer = biased(c, Tnode("bias", (32,)))
    before = scheduled(ll.seq(product, consumer))
    assert fold_epilogues(before, local_storage=False) == before


def test_a_bf16_result_stays():
    """A bf16 node rounds the float accumulator it stores; the consumer read the rounded cell."""
    product, a, b, c = matmul(16, 8, 32, transposed=True, prec=ops.bf16)
    c.memory_mode = LOCAL
    y, consumer = biased(c, Tnode("bias", (32,), ops.bf16))
    _stays(product, c, consumer)


def test_an_operand_as_large_as_the_result_stays():
    """A residual stream of 32 KiB would be read a block at a time between runs of the summed
    loop, where no prefetcher follows (`MAX_OPERAND_BYTES`); a bias of the same product moves."""
    product, a, b, c = product_of(128, 8, 64)
    r = Tnode("r", (128, 64))
    y = Tnode("y", (128, 64))
    assert r.size * 4 > MAX_OPERAND_BYTES
    _stays(product, c, over(y, lambda i, j: add(ll.Get(r, it(i, j)), ll.Get(c, it(i, j)))))
    product, a, b, c = product_of(128, 8, 64)
    y, consumer = biased(c, Tnode("bias", (64,)))
    assert c not in ll.nodes_of(fold_epilogues(scheduled(ll.seq(product, consumer))))
