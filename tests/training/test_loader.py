"""The data loader: batch counts, per-epoch seeded shuffles, the last partial batch."""

from __future__ import annotations

import numpy as np
import pytest

from einjit import data

X = np.arange(1000 * 3, dtype=np.float64).reshape(1000, 3)
Y = np.arange(1000)


def test_drop_last_gives_full_batches_of_distinct_shuffled_rows():
    loader = data.Loader(X, Y, batch_size=64, seed=1)
    batches = list(loader.epoch(0))
    assert len(loader) == len(batches) == 15
    assert all(xb.shape == (64, 3) and yb.shape == (64,) for xb, yb in batches)
    seen = np.concatenate([yb for _, yb in batches])
    assert len(np.unique(seen)) == 960
    assert not np.array_equal(seen, np.arange(960))
    for xb, yb in batches:
        np.testing.assert_array_equal(xb, X[yb])


def test_each_epoch_has_its_own_reproducible_order():
    loader = data.Loader(X, Y, batch_size=100, seed=4)
    first, second = [np.concatenate([b[1] for b in epoch]) for epoch in (iter(loader), iter(loader))]
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(first, np.concatenate([b[1] for b in loader.epoch(0)]))
    np.testing.assert_array_equal(second, np.random.default_rng([4, 1]).permutation(1000))
    other_seed = np.concatenate([b[1] for b in data.Loader(X, Y, batch_size=100, seed=5).epoch(0)])
    assert not np.array_equal(first, other_seed)


def test_keeping_the_last_batch_short_or_weighted():
    short = list(data.Loader(X, Y, batch_size=64, shuffle=False, drop_last=False).epoch(0))
    assert len(short) == 16 and short[-1][1].shape == (40,)
    np.testing.assert_array_equal(short[-1][1], np.arange(960, 1000))
    weighted = list(data.Loader(X, Y, batch_size=64, seed=2, drop_last=False, weights=True).epoch(0))
    assert len(weighted) == 16
    for xb, _yb, wb in weighted:
        assert xb.shape == (64, 3) and wb.shape == (64,)
        assert wb.sum() == pytest.approx(1.0, abs=1e-15)
    *_, (xb, yb, wb) = weighted
    np.testing.assert_array_equal(wb[:40], np.full(40, 1 / 40))
    np.testing.assert_array_equal(wb[40:], np.zeros(24))
    real = np.concatenate([b[1][b[2] > 0] for b in weighted])
    np.testing.assert_array_equal(np.sort(real), np.arange(1000))


def test_split_is_a_seeded_partition():
    (xtr, ytr), (xte, yte) = data.split(X, Y, test_fraction=0.25, seed=3)
    assert len(yte) == 250 and len(ytr) == 750
    np.testing.assert_array_equal(np.sort(np.concatenate([ytr, yte])), Y)
    np.testing.assert_array_equal(xte, X[yte])


def test_bad_requests_are_refused():
    with pytest.raises(data.DataError, match=r"differ in length.*\[1000, 999\]"):
        data.Loader(X, Y[:-1], batch_size=8)
    with pytest.raises(data.DataError, match="drop_last=False"):
        data.Loader(X, batch_size=8, weights=True)
    with pytest.raises(data.DataError, match="positive"):
        data.Loader(X, batch_size=0)
