"""Values read from einjit never swallow a write, results a training routine kept inside itself
can still be computed, indices pass 2^31 in 64 bits, threads calling one routine or step take
turns, and a chain of 10,000 operations compiles."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import einjit as ej
from einjit import fit, train
from einjit.backends import c_syntax
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import Affine, FixedIdx, get_symbol
from einjit.ir.passes.virtualize import MAX_INLINE_DEPTH
from einjit.ir.tnode import Tnode
from einjit.shape import finish_inference


def test_arrays_read_from_a_tensor_are_read_only_and_set_values_writes():
    with ej.default_precision("double"):
        w = ej.param("w", values=[1.0, 2.0, 3.0])
        y = w * 2.0
    train.init_params(y)
    for arr in (w.value.numpy(), np.asarray(w), w.numpy(), w.value[0:2], np.asarray(w, dtype=np.float32)):
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = 10.0
    np.testing.assert_array_equal(train.forward_once(y), [2.0, 4.0, 6.0])
    w.set_values([5.0, 6.0, 7.0])
    np.testing.assert_array_equal(train.forward_once(y), [10.0, 12.0, 14.0])
    snapshot = w.value.numpy().copy()
    snapshot[0] = -1.0
    np.testing.assert_array_equal(w.value.numpy(), [5.0, 6.0, 7.0])


def test_an_output_a_training_routine_kept_inside_itself_is_recomputed():
    with ej.default_precision("double"):
        w = ej.param("w", values=[1.0, 2.0, 3.0])
        x = ej.ndarray([0.5, -1.0, 2.0], label="xin")
        h = ej.relu(w * x, label="h")
        loss = ej.sum(h * h, label="loss")
        train.init_params(loss)
        train.to_routine([train.grad_update(loss), train.sgd_update(loss, 0.1)])()
    assert h.value_tn.is_local()
    w_now = np.array([1.0, 2.0, 3.0]) - 0.1 * np.array([0.5, 0.0, 24.0])
    np.testing.assert_allclose(train.forward_once(h), np.maximum(w_now * [0.5, -1.0, 2.0], 0), rtol=1e-15)
    np.testing.assert_allclose(fit.forward_step(h, inputs=[])(), np.maximum(w_now * [0.5, -1.0, 2.0], 0),
                               rtol=1e-15)


def test_a_sum_over_three_billion_indices_is_exact_in_double():
    with ej.default_precision("double"):
        s = ej.sum(ej.range(3_000_000_000), label="s")
    got = float(train.forward_once(s)[0])
    exact = 3_000_000_000 * 2_999_999_999 // 2
    assert abs(got - exact) <= 4 * np.spacing(float(exact)), got


def test_the_index_type_widens_only_when_an_index_can_pass_2_31():
    """A range the scheduler split into `32*k + l`: every loop bound fits an `int`, the index
    value does not once `k` runs past 2^26."""
    out = Tnode("out", (1,), prec=ops.double)
    k, lane = get_symbol(), get_symbol()

    def program(outer: int) -> ll.LLStmt:
        body = ll.Set(out, (FixedIdx(0),), ll.EmbedIndex(Affine(((32, k), (1, lane)))))
        return ll.ForLoop(k, 0, outer - 1, ll.ForLoop(lane, 0, 31, body))

    assert c_syntax.index_type("small", program(1000)) == "int"
    assert c_syntax.index_type("edge", program(2**26)) == "int"  # 32 * (2^26 - 1) + 31 = 2^31 - 1
    assert c_syntax.index_type("past", program(2**26 + 1)) == "long long"
    assert c_syntax.index_type("range3e9", program(93_750_000)) == "long long"


def test_one_routine_called_from_two_threads_gives_only_right_values():
    with ej.default_precision("double"):
        v = ej.param("v", values=np.linspace(-1.0, 1.0, 4000))
        total = ej.sum(ej.relu(v) * 3.0, label="total")
    train.init_params(total)
    routine = train.to_routine(train.forward(total))
    want = float(np.maximum(np.linspace(-1.0, 1.0, 4000), 0).sum() * 3.0)
    start, wrong = threading.Barrier(2), []

    def hammer() -> None:
        start.wait()
        for _ in range(900):
            routine()
            got = float(total.value.numpy()[0])
            if abs(got - want) > 1e-9 * abs(want):
                wrong.append(got)

    threads = [threading.Thread(target=hammer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_one_forward_step_called_from_two_threads_answers_each_its_own_input():
    with ej.default_precision("double"):
        x = ej.input("x", batch_dims=[500], output_dims=[3])
        w = ej.param("w", output_dims=[4])
        y = ej.sum(ej.relu(w @ x), label="ysum")
    train.init_params(y)
    step = fit.forward_step(y, inputs=[x])
    weights = w.value.numpy().reshape(4, 3)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((500, 3)) for _ in range(2)]
    want = [float(np.maximum(xx @ weights.T, 0).sum()) for xx in xs]
    start, wrong = threading.Barrier(2), []

    def hammer(k: int) -> None:
        start.wait()
        for _ in range(900):
            got = float(np.asarray(step(xs[k])).ravel()[0])
            if abs(got - want[k]) > 1e-9 * abs(want[k]):
                wrong.append((k, got))

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


@pytest.mark.parametrize("length", [2_500, pytest.param(10_000, marks=pytest.mark.slow)])
def test_a_long_chain_of_pointwise_operations_compiles_and_computes(length):
    """2,500 operations used to end in a RecursionError in the simplifier (10,000 takes minutes
    on a loaded machine: `-m slow`). Shape inference is closed every 500 operations: open, it
    copies its whole state per operation (quadratic in the chain), which is not what this test
    is about."""
    assert MAX_INLINE_DEPTH < length
    with ej.default_precision("double"):
        x = ej.param("x", values=[0.5, 0.25])
        y = x
        for k in range(length):
            y = y * 1.0001 if k % 2 == 0 else y + 0.001
            if k % 500 == 0:
                finish_inference()
    want = np.array([0.5, 0.25])
    for k in range(length):
        want = want * 1.0001 if k % 2 == 0 else want + 0.001
    np.testing.assert_allclose(train.forward_once(y), want, rtol=1e-12)


@pytest.mark.slow
def test_the_gradient_through_a_long_chain_compiles_and_is_right():
    """Backprop doubles the chain, and every gradient node reads itself (`g =+ ...`)."""
    with ej.default_precision("double"):
        x = ej.param("x", values=[0.5, 0.25])
        y = x
        for k in range(2_500):
            y = y * 1.0001 if k % 2 == 0 else y + 0.001
            if k % 500 == 0:
                finish_inference()
        loss = ej.sum(y, label="loss")
        train.init_params(loss)
        train.to_routine(train.grad_update(loss))()
    np.testing.assert_allclose(x.grad.numpy(), [1.0001**1_250] * 2, rtol=1e-12)
