"""Memory safety of static symbols used as indices: a `batch_slice` symbol given no range gets
the sliced axis's size, so every compiled routine refuses an out-of-range value in Python
before any C runs (a `StaticRangeError`, an `IndexError` and an `EinjitError`). The sweep
covers [-3, n+3] and 10**6 on every CPU backend."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.backends.cc.backend import CcBackend
from einjit.backends.cc.multicore import MulticoreBackend
from einjit.backends.interface import StaticRangeError, lower_assignments, routine_inputs

N = 3
VALUES = list(range(-3, N + 4)) + [10**6]
OUT_OF_RANGE = StaticRangeError
assert issubclass(StaticRangeError, IndexError) and issubclass(StaticRangeError, ej.EinjitError)


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def sliced_model(static_range=None, *, through_intermediate=False):
    """data[s] * 2 + 1 over a batch of N rows of 2; `s` has no range unless given."""
    data = np.arange(2.0 * N).reshape(N, 2) + 10.0
    src = ej.ndarray(data, batch_axes=1, label="data")
    if through_intermediate:
        src = ej.relu(src, label="data_relu")
    s = ej.get_static_symbol(static_range, "b")
    y = ej.add(ej.mul(ej.batch_slice(src, s), 2.0), 1.0, label="y")
    y.hosted()
    return data, s, y


def check_sweep(call, s, y, data, label):
    for v in VALUES:
        if 0 <= v < N:
            call(v)
            np.testing.assert_array_equal(y.value.numpy(), data[v] * 2 + 1, err_msg=f"{label}: s = {v}")
        else:
            with pytest.raises(OUT_OF_RANGE, match=rf"static symbol {s!r} = {v} is outside its range \[0, {N}\)"):
                call(v)


@pytest.mark.parametrize("through_intermediate", [False, True], ids=["literal", "intermediate"])
def test_range_comes_from_the_sliced_axis(through_intermediate):
    data, s, y = sliced_model(through_intermediate=through_intermediate)
    assert s.static_range is None
    routine = train.to_routine(train.forward(y), bindings=[s], name="slice_sweep")
    assert s.static_range == N and routine.bindings[s].value == 0

    def call(v):
        routine.bindings[s].value = v
        routine()

    check_sweep(call, s, y, data, "to_routine")


def test_a_given_range_is_kept_and_a_wrong_one_is_a_shape_error():
    _, s, y = sliced_model(N)
    train.to_routine(train.forward(y), bindings=[s], name="slice_ranged")
    assert s.static_range == N
    with pytest.raises(ej.ShapeError, match="4 vs 3"):
        sliced_model(N + 1)


def test_the_symbol_stays_a_usable_key_after_its_range_is_inferred():
    data, s, y = sliced_model()
    refs = {s: ej.IntRef(1)}
    routine = train.to_routine(train.forward(y), bindings=refs, name="slice_keyed")
    assert s.static_range == N and s in refs and refs[s] is routine.bindings[s]
    routine()
    np.testing.assert_array_equal(y.value.numpy(), data[1] * 2 + 1)


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "specialized"])
@pytest.mark.parametrize("kind", ["cc", "multicore"])
def test_sweep_on_every_cpu_backend(kind, shared):
    data, s, y = sliced_model()
    _, code = lower_assignments((s,), train.forward(y), "slice_backend")
    assert s.static_range == N
    with contextlib.ExitStack() as stack:
        if kind == "cc":
            backend, device = CcBackend(), None
            ctx = backend.init("cpu")
        else:
            backend = stack.enter_context(MulticoreBackend(CcBackend(), num_devices=1))
            device = backend.get_device(0)
            ctx = backend.init(device)
        for tn in routine_inputs(code):
            backend.from_host(ctx, tn)
        routine = backend.link(ctx, backend.compile((s,), code, shared=shared, name="slice_backend"))

        def call(v):
            routine.bindings[s].value = v
            routine()
            if device is not None:
                backend.await_(device)
            backend.to_host(ctx, y.value_tn)

        check_sweep(call, s, y, data, kind)


def test_backprop_through_a_slice_is_guarded_too():
    """The gradient of a sliced tensor is written at the symbol's index: a training step
    refuses out-of-range values the same way, and in range gives NumPy's gradient."""
    data = np.arange(2.0 * N).reshape(N, 2) + 1.0
    w = ej.param("slice_w", values=[0.5, -2.0])
    scaled = ej.mul(w, ej.ndarray(data, batch_axes=1, label="slice_data"), label="scaled")
    s = ej.get_static_symbol(None, "b")
    loss = ej.sum(ej.batch_slice(scaled, s), "...|...->... => 0", label="slice_loss")
    train.init_params(loss)
    routine = train.to_routine(train.grad_update(loss), bindings=[s], name="slice_backprop")
    assert s.static_range == N
    for v in VALUES:
        routine.bindings[s].value = v
        if 0 <= v < N:
            routine()
            np.testing.assert_array_equal(w.grad.numpy(), data[v])
            np.testing.assert_allclose(loss.value.numpy(), [data[v] @ [0.5, -2.0]], rtol=1e-12)
        else:
            with pytest.raises(OUT_OF_RANGE,
                               match=rf"routine 'slice_backprop': static symbol {s!r} = {v} is outside its range "
                                     rf"\[0, {N}\)"):
                routine()
