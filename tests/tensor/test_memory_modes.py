"""Memory modes set at the tensor level (seed 001: "set explicitly by the user"), beside
`hosted()`: `materialize()`, `virtual()`, `on_device()`, each with its provenance, and the error
of a routine reading a tensor that another routine made virtual."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import backends, train
from einjit.ir import provenance
from einjit.ir.tnode import MemoryModeError


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def chain():
    x = ej.ndarray(np.arange(3.0), label="x")
    h = ej.exp(x, label="h")
    return x, h, h * 2.0


def test_reading_a_tensor_another_routine_made_virtual_names_both_routines():
    _, h, y = chain()
    train.to_routine(train.forward(y), name="first")()
    assert h.value_tn.is_virtual()
    with pytest.raises(MemoryModeError) as err:
        train.to_routine(train.forward(h + 1.0), name="second")
    msg = str(err.value)
    assert "Tensor h#" in msg and "made virtual by routine 'first'" in msg and "provenance 15" in msg
    assert "routine 'second' reads it" in msg and "call materialize() (or hosted())" in msg


def test_materialize_keeps_the_tensor_for_later_routines():
    x, h, y = chain()
    h.materialize()
    ctx = backends.get("cc").init("memory_modes")
    train.to_routine(train.forward(y), name="first", context=ctx)()
    assert not h.value_tn.is_virtual()
    assert h.value_tn.provenance == provenance.MATERIALIZE_CALL
    z = h + 1.0
    train.to_routine(train.forward(z), name="second", context=ctx)()
    np.testing.assert_allclose(z.value.numpy(), np.exp(np.arange(3.0)) + 1.0, rtol=1e-12)
    np.testing.assert_allclose(y.value.numpy(), 2.0 * np.exp(np.arange(3.0)), rtol=1e-12)


def test_virtual_inlines_and_conflicts_name_both_calls():
    _, h, y = chain()
    h.virtual()
    train.to_routine(train.forward(y), name="only")()
    assert h.value_tn.is_virtual()
    np.testing.assert_allclose(y.value.numpy(), 2.0 * np.exp(np.arange(3.0)), rtol=1e-12)
    with pytest.raises(MemoryModeError, match=r"Virtual \(provenance 63\) and cannot become Hosted .*provenance 60"):
        h.hosted()


def test_virtual_that_cannot_be_inlined_names_the_call():
    _, h, y = chain()
    h.virtual()
    train.forward(y)  # h's computation goes to code that is never compiled
    with pytest.raises(MemoryModeError, match=r"made virtual by the call virtual\(\) \(provenance 63\)"):
        train.to_routine(train.forward(h + 1.0), name="reader")


def test_on_device_is_not_host_readable():
    _, h, y = chain()
    h.on_device()
    train.to_routine(train.forward(y), name="dev")()
    assert str(h.value_tn.memory_mode) == "On_device" and h.value_tn.provenance == provenance.ON_DEVICE_CALL
    np.testing.assert_allclose(y.value.numpy(), 2.0 * np.exp(np.arange(3.0)), rtol=1e-12)


def test_gradient_modes_need_a_differentiable_tensor():
    with pytest.raises(ej.TensorError, match="not differentiable"):
        ej.ndarray(np.ones(2), label="c").materialize(grad=True)
    w = ej.param("w", values=[1.0, 2.0])
    (w * 3.0).on_device(grad=True)
