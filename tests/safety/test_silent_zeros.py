"""The three silent-zero cases of issue 15: a tensor computed by one routine and read by
another either holds its computed values (it is shared through the context) or makes the
second compile fail naming it; a host array replaced behind a linked routine is detected at
the next call (or its new values are used)."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train

X = np.array([[1.0, -2.0], [0.5, 3.0], [-1.5, 0.25]])   # 3 examples of 2 features
W = np.array([[0.5, -1.0], [2.0, 0.25]])                 # output 2, input 2


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def model():
    x = ej.ndarray(X, batch_axes=1, label="sz_x")
    w = ej.param("sz_w", values=W, output_dims=[2], input_dims=[2])
    h = ej.relu(w @ x, label="sz_h")
    return x, w, h


def expected_h(w=W):
    return np.maximum(X @ w.T, 0)


def value_or_named_error(compute, want, name):
    """`compute()` gives `want`, or raises an EinjitError naming `name`."""
    try:
        got = compute()
    except ej.EinjitError as e:
        assert name in str(e), f"the error does not name {name}: {e}"
        return
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_second_loss_reusing_a_compiled_subexpression():
    _, w, h = model()
    loss1 = ej.sum(h, "...|...->... => 0", label="sz_loss1")
    train.init_params(loss1)
    train.to_routine([train.grad_update(loss1), train.sgd_update(loss1, 0.0)], name="sz_first")()
    loss2 = ej.sum(ej.mul(h, 2.0), "...|...->... => 0", label="sz_loss2")

    def second():
        train.to_routine(train.forward(loss2), name="sz_second")()
        return loss2.value.numpy().ravel()

    value_or_named_error(second, [2 * expected_h().sum()], "sz_h")


def test_a_trained_sub_output_evaluated_in_another_routine():
    _, w, h = model()
    loss = ej.sum(ej.mul(h, h), "...|...->... => 0", label="sz_loss")
    train.init_params(loss)
    step = train.to_routine([train.grad_update(loss), train.sgd_update(loss, 0.01)], name="sz_train")
    step()
    step()
    last_forward = w.value.numpy()
    step()
    assert not np.allclose(w.value.numpy(), last_forward)

    def evaluate():
        reader = ej.mul(h, 1.0, label="sz_reader")
        train.to_routine(train.forward(reader), name="sz_eval")()
        return reader.value.numpy()

    # sz_h holds what the last step's forward computed, before that step's update (as a
    # PyTorch tensor from the last forward would); `fit.forward_step` recomputes it instead
    value_or_named_error(evaluate, expected_h(last_forward), "sz_h")


def test_evaluating_a_consumed_sub_output_directly_is_a_named_error():
    """Already safe here: asking for the forward code of a sub-output a training routine
    consumed is refused, naming it (or, after the runtime branch, gives its values)."""
    x = ej.ndarray(X, batch_axes=1, label="sz2_x")
    feat = ej.relu(ej.mul(x, 2.0), label="sz2_feat")
    w = ej.param("sz2_w", values=W, output_dims=[2], input_dims=[2])
    loss = ej.sum(ej.mul(w @ feat, 1.0), "...|...->... => 0", label="sz2_loss")
    train.init_params(loss)
    train.to_routine([train.grad_update(loss), train.sgd_update(loss, 0.01)], name="sz2_train")()

    def evaluate():
        train.to_routine(train.forward(feat), name="sz2_eval")()
        return feat.value.numpy()

    value_or_named_error(evaluate, np.maximum(2 * X, 0), "sz2_feat")


def test_a_host_array_replaced_after_linking():
    x = ej.ndarray(np.array([1.0, 2.0, 3.0]), label="sz_in")
    y = ej.mul(x, 10.0, label="sz_out")
    routine = train.to_routine(train.forward(y), name="sz_linked")
    routine()
    np.testing.assert_array_equal(y.value.numpy(), [10.0, 20.0, 30.0])
    x.value_tn.array = np.array([4.0, 5.0, 6.0])

    def again():
        routine()
        return y.value.numpy()

    value_or_named_error(again, [40.0, 50.0, 60.0], "sz_in")
