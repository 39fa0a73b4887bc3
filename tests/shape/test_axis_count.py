"""An einsum spec that names more axes in a row than the argument has is an error, not a
silent size-1 axis: viewing a `[D]` axis as `h,e` used to give one head."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train


def data(label, *dims, batch=2):
    return ej.ndarray(np.ones(dims, np.float32), batch_axes=batch, label=label)


def test_viewing_one_axis_as_two_names_the_spec_column_and_the_tensor():
    q, k = data("q", 2, 3, 8), data("k", 2, 3, 8)
    with pytest.raises(ej.ShapeError, match=r'einsum spec "b,t\|->h,e; b,s\|->h,e => b,t\|->h,s": column 7: the '
                                            r'output row names 2 axes \(h, e\), but "q" .* has 1 there \(\[8 '):
        ej.einsum("b,t|->h,e; b,s|->h,e => b,t|->h,s", q, k)
    with pytest.raises(ej.ShapeError, match=r"column 18: the output row names 2 axes \(h, e\), but \"k4\""):
        ej.einsum("b,t|->h,e; b,s|->h,e => b,t|->h,s", data("q2", 2, 3, 2, 4), data("k4", 2, 3, 4))


def test_the_same_spec_works_on_tensors_with_the_head_axis_and_after_an_error():
    rng = np.random.default_rng(0)
    with pytest.raises(ej.ShapeError):
        ej.einsum("b|->h,e => b|->h", data("flat", 2, 8, batch=1))
    qv, kv = rng.standard_normal((2, 3, 2, 4)), rng.standard_normal((2, 5, 2, 4))
    q, k = ej.ndarray(qv, batch_axes=2), ej.ndarray(kv, batch_axes=2)
    s = ej.einsum("b,t|->h,e; b,s|->h,e => b,t|->h,s", q, k)
    np.testing.assert_allclose(train.forward_once(s), np.einsum("bthe,bshe->bths", qv, kv), rtol=1e-5)


def test_size_one_axes_still_broadcast_and_parameters_take_the_spec_axes():
    x = data("x", 2, 1, 4, batch=1)   # an axis of size 1 is still an axis: broadcasting dims is fine
    y = ej.einsum("b|->h,e; b|->h,e => b|->h,e", x, data("y", 2, 3, 4, batch=1))
    assert train.forward_once(y).shape == (2, 3, 4)
    w = ej.param("w")                 # shape unknown: inferred from the spec, both axes
    z = ej.einsum("b|->h,e; |->h,e => b|->h", data("z", 2, 3, 4, batch=1), w)
    train.init_params(z)
    assert w.value.numpy().shape == (3, 4)
