"""`ej.write_at`: a KV-cache slice written in place at a run-time position (a static symbol),
against NumPy and the interpreter; one compiled routine for every position; positions out
of range refused."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.backends.cc import toolchain as cc
from einjit.ir import assignments as asg
from einjit.ir import interpret

B, TM, H, E = 2, 6, 3, 4


@pytest.fixture
def compiles(monkeypatch):
    """The number of C compilations since the fixture started."""
    count = [0]
    real = cc.compile_source

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(cc, "compile_source", counting)
    return count


def decode_step(n_new=1, prec="single"):
    """A cache `[B, TM, H, E]`, `n_new` new rows written at `pos`, and the sum of the cache read
    through the updated tensor (so the read comes after the write)."""
    with ej.default_precision(prec):
        cache = ej.buffer("kcache", batch_dims=[B], output_dims=[TM, H, E])
        new = ej.input("knew", batch_dims=[B], output_dims=[n_new, H, E])
        pos = ej.get_static_symbol(name="pos")
        updated = ej.write_at(cache, new, pos, axis=1)
        total = ej.sum(updated * updated, "...|...->... => 0", label="total")
    return cache, new, pos, total


def test_one_routine_writes_every_position_in_place_without_recompiling(compiles):
    cache, new, pos, total = decode_step()
    ref = ej.IntRef(0)
    step = train.to_routine(train.forward(total), bindings={pos: ref}, name="decode_write")
    compiled = compiles[0]
    want = np.zeros((B, TM, H, E), np.float32)
    rng = np.random.default_rng(0)
    for t in [0, 1, 2, 5, 3, 4, 3]:
        v = rng.standard_normal((B, 1, H, E)).astype(np.float32)
        new.set_values(v)
        ref.value = t
        step()
        want[:, t:t + 1] = v
        np.testing.assert_array_equal(cache.value.numpy(), want)
        np.testing.assert_allclose(total.value.numpy()[0], (want * want).sum(), rtol=1e-5)
    assert compiles[0] == compiled
    assert pos.static_range == TM


def test_a_position_past_the_end_is_refused_and_the_routine_stays_usable():
    cache, new, pos, total = decode_step(n_new=2)
    ref = ej.IntRef(0)
    step = train.to_routine(train.forward(total), bindings={pos: ref}, name="decode_write2")
    assert pos.static_range == TM - 1   # two rows from pos must fit
    for bad in (TM - 1, TM, -1):
        ref.value = bad
        with pytest.raises(ej.StaticRangeError, match=r"static symbol pos\S* = -?\d+ is outside its range \[0, 5\)"):
            step()
    new.set_values(np.ones((B, 2, H, E), np.float32))
    ref.value = TM - 2
    step()
    assert cache.value.numpy()[:, TM - 2:].sum() == B * 2 * H * E and cache.value.numpy()[:, :TM - 2].sum() == 0


def test_interpreter_and_c_agree_on_the_written_cache():
    cache, new, pos, total = decode_step(n_new=3, prec="double")
    code = train.forward(total)
    v = np.random.default_rng(1).standard_normal((B, 3, H, E))
    start = np.random.default_rng(2).standard_normal((B, TM, H, E))
    llc = asg.to_low_level(code)
    got = interpret.run(llc, {cache.value_tn: start.copy(), new.value_tn: v.copy()}, {pos.symbol: 2})
    want = start.copy()
    want[:, 2:5] = v
    np.testing.assert_array_equal(got[cache.value_tn], want)
    np.testing.assert_allclose(got[total.value_tn][0], (want * want).sum(), rtol=1e-12)
    cache.set_values(start)
    new.set_values(v)
    train.to_routine(code, bindings={pos: ej.IntRef(2)}, name="decode_write3")()
    np.testing.assert_array_equal(cache.value.numpy(), want)


def test_wrong_shapes_and_arguments_are_named():
    cache = ej.buffer("kc", batch_dims=[B], output_dims=[TM, H, E])
    pos = ej.get_static_symbol(name="p")
    with pytest.raises(ej.TensorError, match="position must be a static symbol"):
        ej.write_at(cache, cache, 3, axis=1)
    param = ej.param("w", output_dims=[2])
    with pytest.raises(ej.TensorError, match="cache w is differentiable"):
        ej.write_at(param, param, pos, axis=0)
    wrong = ej.input("kw", batch_dims=[B], output_dims=[1, H, E + 1])
    out = ej.write_at(cache, wrong, pos, axis=1)
    with pytest.raises(ej.ShapeError, match=r"the value kw has dims \(2, 1, 3, 5\); the cache kc has \(2, 6, 3, 4\)"):
        train.to_routine(train.forward(out), bindings=[pos], name="bad_write")
    with pytest.raises(ej.ShapeError, match="dims must be positive"):
        ej.buffer("zero", output_dims=[0])
