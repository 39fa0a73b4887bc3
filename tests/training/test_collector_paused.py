"""`memory.collector_paused`: compiles run with Python's cyclic collector off, and it is back on
afterwards, after a failing compile too, and left off when the caller had switched it off."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import einjit as ej
from einjit import memory, train


def test_the_collector_is_off_inside_and_restored_after_errors_and_nesting():
    assert gc.isenabled()
    with pytest.raises(ValueError):
        with memory.collector_paused():
            assert not gc.isenabled()
            with memory.collector_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
            raise ValueError("a failing compile")
    assert gc.isenabled()
    gc.disable()
    try:
        with memory.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_compile_pauses_the_collector_and_its_routine_computes(monkeypatch, tmp_path):
    monkeypatch.setenv("EINJIT_CACHE_DIR", str(tmp_path))
    from einjit.backends.cc import backend

    seen = []
    compile_batch = backend.CcSimpleBackend.compile_batch

    def spy(self, *args, **kwargs):
        seen.append(gc.isenabled())
        return compile_batch(self, *args, **kwargs)

    monkeypatch.setattr(backend.CcSimpleBackend, "compile_batch", spy)
    x = ej.ndarray(np.arange(6, dtype=np.float32).reshape(2, 3), batch_axes=1, label="x")
    y = ej.relu(x - 2.0)
    routine = train.to_routine(train.forward(y), name="relu")
    routine()
    want = np.maximum(np.arange(6, dtype=np.float32).reshape(2, 3) - 2.0, 0.0)
    np.testing.assert_array_equal(y.numpy().reshape(2, 3), want)
    assert seen == [False] and gc.isenabled()
