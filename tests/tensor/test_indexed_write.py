"""`ej.write_at`: a KV-cache slice written in place at a run-time position (a static symbol, or
a hosted integer read inside the routine), against NumPy and the interpreter; one compiled
routine for every position; static positions out of range refused, hosted ones clamped."""

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


# ---------------------------------------------------------------- a hosted-integer position


def hosted_decode_step(n_new=1, prec="single", pos_dims=(1,)):
    """As `decode_step`, the rows written at the positions an integer input holds."""
    with ej.default_precision(prec):
        cache = ej.buffer("hcache", batch_dims=[B], output_dims=[TM, H, E])
        new = ej.input("hnew", batch_dims=[B], output_dims=[n_new, H, E])
        where = ej.input("hpos", batch_dims=list(pos_dims), prec="int32")
        updated = ej.write_at(cache, new, where, axis=1)
        total = ej.sum(updated * updated, "...|...->... => 0", label="htotal")
    return cache, new, where, total


def _numpy_write(cache: np.ndarray, v: np.ndarray, positions) -> np.ndarray:
    out = cache.copy()
    for i, p in enumerate(positions):
        out[:, min(max(p, 0), TM - 1)] = v[:, i]
    return out


def test_a_hosted_integer_position_writes_every_position_with_one_routine(compiles):
    cache, new, where, total = hosted_decode_step()
    step = train.to_routine(train.forward(total), name="hosted_write")
    compiled = compiles[0]
    want = np.zeros((B, TM, H, E), np.float32)
    rng = np.random.default_rng(3)
    for t in [0, 4, 1, 5, 2, 2]:
        v = rng.standard_normal((B, 1, H, E)).astype(np.float32)
        new.set_values(v)
        where.set_values(np.array([t], np.int32))
        step()
        want = _numpy_write(want, v, [t])
        np.testing.assert_array_equal(cache.value.numpy(), want)
        np.testing.assert_allclose(total.value.numpy()[0], (want * want).sum(), rtol=1e-5)
    assert compiles[0] == compiled


def test_bad_hosted_positions_are_clamped_into_the_cache_never_past_it():
    cache, new, where, total = hosted_decode_step()
    guard = np.full((B, TM, H, E), 7.0, np.float32)
    cache.set_values(guard)
    step = train.to_routine(train.forward(total), name="hosted_clamped")
    want = guard.copy()
    for bad in (-1, -1000, TM, TM + 5, 2**31 - 1, -2**31):
        v = np.full((B, 1, H, E), float(bad % 97), np.float32)
        new.set_values(v)
        where.set_values(np.array([bad], np.int32))
        step()
        want = _numpy_write(want, v, [bad])
        np.testing.assert_array_equal(cache.value.numpy(), want)   # row 0 or row TM - 1, nothing else
    assert (want[:, 1:TM - 1] == 7.0).all()


def test_several_rows_at_hosted_positions_match_numpy_and_the_interpreter():
    cache, new, where, total = hosted_decode_step(n_new=3, prec="double", pos_dims=(3, 1))
    code = train.forward(total)
    v = np.random.default_rng(4).standard_normal((B, 3, H, E))
    start = np.random.default_rng(5).standard_normal((B, TM, H, E))
    positions = np.array([4, -2, 9], np.int32).reshape(where.value_tn.dims)   # rows 4, 0 and 5 (clamped)
    want = _numpy_write(start, v, positions.ravel())
    llc = asg.to_low_level(code)
    got = interpret.run(llc, {cache.value_tn: start.copy(), new.value_tn: v.copy(), where.value_tn: positions})
    np.testing.assert_array_equal(got[cache.value_tn], want)
    cache.set_values(start)
    new.set_values(v)
    where.set_values(positions)
    train.to_routine(code, name="hosted_write3")()
    np.testing.assert_array_equal(cache.value.numpy(), want)
    np.testing.assert_allclose(total.value.numpy()[0], (want * want).sum(), rtol=1e-12)


def test_wrong_hosted_positions_are_named():
    cache = ej.buffer("hk", batch_dims=[B], output_dims=[TM, H, E])
    new = ej.input("hv", batch_dims=[B], output_dims=[2, H, E])
    with pytest.raises(ej.TensorError, match="position tensor hf must have an integer precision"):
        ej.write_at(cache, new, ej.input("hf", batch_dims=[2]), axis=1)
    one = ej.input("hone", batch_dims=[1], prec="int32")
    out = ej.write_at(cache, new, one, axis=1)
    with pytest.raises(ej.ShapeError, match=r"position tensor hone has dims \(1, 1\); it must hold one position per "
                                            r"written row \(2 cells"):
        train.to_routine(train.forward(out), name="bad_hosted_write")
