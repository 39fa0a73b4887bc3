"""`@einjit.op`: inline-declared parameters are created once per definition, or per label."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train


@ej.op
def affine(x):
    return ej.param("b", output_dims=[2], init="zeros") + ej.param("w", output_dims=[2]) @ x


def test_calls_share_the_parameters_of_the_definition():
    x1, x2 = ej.ndarray(np.ones(3)), ej.ndarray(np.arange(3.0))
    y1, y2 = affine(x1), affine(x2)
    assert {p.id for p in y1.params()} == {p.id for p in y2.params()}
    assert sorted(p.label_str for p in y1.params()) == ["b", "w"]


def test_a_label_makes_separate_instances_with_prefixed_labels():
    x = ej.ndarray(np.ones(3))
    a, b = affine(x, label="first"), affine(x, label="second")
    assert not {p.id for p in a.params()} & {p.id for p in b.params()}
    assert sorted(p.label_str for p in a.params()) == ["first.b", "first.w"]
    assert affine(x, label="first").params()[0] in a.params()


def test_shared_parameters_train_from_both_uses():
    with ej.default_precision("double"):
        @ej.op
        def scale(x):
            return ej.param("s", values=[2.0]) * x

        loss = ej.sum(scale(ej.ndarray(np.array([1.0, 2.0]))) + scale(ej.ndarray(np.array([3.0]))),
                      "...|...->... => 0")
        train.init_params(loss)
        train.to_routine(train.grad_update(loss))()
        (s,) = scale.params()
        assert s.grad.numpy()[0] == pytest.approx((1.0 + 3.0) + (2.0 + 3.0))


def test_outside_an_op_every_param_is_new():
    assert ej.param("w", output_dims=[1]) is not ej.param("w", output_dims=[1])


def test_locals_of_an_op_are_labelled_by_their_binding_names():
    @ej.op
    def block(x):
        hidden = ej.relu(ej.param("w", output_dims=[3]) @ x)
        explicit = ej.exp(hidden, label="kept")
        return explicit + 1

    out = block(ej.ndarray(np.ones(2)), label="blk")
    labels = {t.label_str for t in out.subtree()}
    assert "blk.hidden" in labels and "kept" in labels and "blk.w" in labels
    hidden = next(t for t in out.subtree() if t.label_str == "blk.hidden")
    assert hidden.value_tn.name.startswith("blk_hidden_")


def test_a_labelled_inner_definition_gets_parameters_per_outer_instance():
    """Seed 004 `~config`: `A.inner.w` and `B.inner.w` are different parameters."""

    @ej.op
    def inner(x):
        return ej.param("w", values=[2.0]) * x

    @ej.op
    def outer(x):
        return inner(x, label="inner") + ej.param("b", values=[1.0])

    x = ej.ndarray(np.array([3.0]), label="x")
    a, b = outer(x, label="A"), outer(x, label="B")
    assert sorted(p.label_str for p in a.params()) == ["A.b", "A.inner.w"]
    assert sorted(p.label_str for p in b.params()) == ["B.b", "B.inner.w"]
    assert not {p.id for p in a.params()} & {p.id for p in b.params()}
    assert {p.id for p in outer(x, label="A").params()} == {p.id for p in a.params()}
    total = a + b
    train.init_params(total)
    a_w = next(p for p in a.params() if p.label_str == "A.inner.w")
    a_w.value_tn.host_array()[...] = 5.0
    np.testing.assert_allclose(train.forward_once(total), [5.0 * 3 + 1 + 2.0 * 3 + 1])


def test_an_unlabelled_inner_definition_is_shared_by_every_outer_instance():
    @ej.op
    def inner(x):
        return ej.param("w", values=[2.0]) * x

    @ej.op
    def outer(x):
        return inner(x)

    x = ej.ndarray(np.array([3.0]), label="x")
    assert [p.label_str for p in outer(x, label="A").params()] == ["w"]
    assert {p.id for p in outer(x, label="A").params()} == {p.id for p in outer(x, label="B").params()}
