"""Optimizer updates against NumPy, and the interactive conveniences."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def quadratic(target: np.ndarray):
    """loss = sum((p - target)^2) / 2, so p.grad = p - target."""
    p = ej.param("p", values=np.zeros_like(target))
    loss = ej.sum((p - ej.ndarray(target)) ** 2, "...|...->... => 0") / 2
    train.init_params(loss)
    return p, loss


TARGET = np.array([1.0, -2.0, 0.5])


@pytest.mark.parametrize("momentum,nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_sgd_with_weight_decay_momentum_nesterov(momentum, nesterov):
    lr, wd, steps = 0.1, 0.01, 7
    p, loss = quadratic(TARGET)
    routine = train.to_routine([train.grad_update(loss),
                                train.sgd_update(loss, lr, weight_decay=wd, momentum=momentum, nesterov=nesterov)])
    for _ in range(steps):
        routine()
    want, buf = np.zeros(3), np.zeros(3)
    for _ in range(steps):
        delta = (want - TARGET) + wd * want
        if momentum > 0:
            buf = momentum * buf + delta
            delta = delta + momentum * buf if nesterov else buf
        want = want - lr * delta
    np.testing.assert_allclose(p.value.numpy(), want, rtol=1e-12, atol=1e-14)


def test_learning_rate_as_a_tensor_of_a_static_symbol():
    p, loss = quadratic(TARGET)
    step = ej.get_static_symbol(None, "step")
    lr = ej.mul(0.1, 1.0 / (1 + ej.embed_symbol(step)))
    routine = train.to_routine([train.grad_update(loss), train.sgd_update(loss, lr)], bindings=[step])
    want = np.zeros(3)
    for k in range(5):
        routine.bindings[step].value = k
        routine()
        want = want - 0.1 / (1 + k) * (want - TARGET)
    np.testing.assert_allclose(p.value.numpy(), want, rtol=1e-12)


def test_adam_matches_numpy():
    lr, b1, b2, eps, steps = 0.05, 0.9, 0.999, 1e-8, 6
    p, loss = quadratic(TARGET)
    sym = ej.get_static_symbol(None, "t")
    t = ej.embed_symbol(sym)
    routine = train.to_routine([train.grad_update(loss),
                                train.adam_update(loss, lr, step=t, beta1=b1, beta2=b2, eps=eps)], bindings=[sym])
    for k in range(1, steps + 1):
        routine.bindings[sym].value = k
        routine()
    want, m, v = np.zeros(3), np.zeros(3), np.zeros(3)
    for k in range(1, steps + 1):
        g = want - TARGET
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        want = want - lr * ((m / (1 - b1 ** k)) / (np.sqrt(v / (1 - b2 ** k)) + eps))
    np.testing.assert_allclose(p.value.numpy(), want, rtol=1e-10)


def test_sequential_loop_visits_every_ranged_value():
    a = ej.get_static_symbol(3, "a")
    b = ej.get_static_symbol(2, "b")
    free = ej.get_static_symbol(None, "free")
    refs = {a: ej.IntRef(), b: ej.IntRef(), free: ej.IntRef(5)}
    seen = []
    train.sequential_loop(refs, lambda: seen.append((refs[a].value, refs[b].value, refs[free].value)))
    assert seen == [(i, j, 5) for i in range(3) for j in range(2)]


def test_forward_once_and_update_once():
    x = ej.param("x", values=[3.0])
    y = x * x
    assert train.forward_once(y)[0] == 9.0
    assert train.forward_once(y)[0] == 9.0
    p, loss = quadratic(TARGET)
    first = train.update_once(loss, learning_rate=0.5)
    second = train.update_once(loss, learning_rate=0.5)
    assert first == pytest.approx(0.5 * np.sum(TARGET ** 2))
    assert second == pytest.approx(0.5 * np.sum((0.5 * TARGET) ** 2))


def test_batch_slice_reads_the_row_of_the_static_symbol():
    rows = ej.ndarray(np.arange(6.0).reshape(3, 2), batch_axes=1)
    sym = ej.get_static_symbol(3, "row")
    w = ej.param("w", values=[1.0, 1.0])
    loss = ej.sum(ej.batch_slice(rows, sym) * w, "...|...->... => 0")
    train.init_params(loss)
    routine = train.to_routine(train.grad_update(loss), bindings=[sym])
    routine.bindings[sym].value = 2
    routine()
    np.testing.assert_allclose(w.grad.numpy(), [4.0, 5.0])
    assert loss.value.numpy()[0] == 9.0
