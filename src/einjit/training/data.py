"""Batches from NumPy arrays, for routines that read `ej.input` tensors.

A `Loader` slices equally long arrays (features, labels, ...) into batches along their first
axis, in a fresh random order every epoch. The order of epoch `e` is a pure function of
`(seed, e)`, so a run resumed from a checkpoint at epoch `e` sees exactly the batches an
uninterrupted run would have seen.

Compiled routines have fixed dims, so a last partial batch is either dropped
(`drop_last=True`), yielded short (`drop_last=False`: fine for prediction, which pads it, see
`einjit.fit`), or padded to full size with per-row weights (`weights=True`): each real row
weighs `1 / rows`, each padding row 0, so a loss written as `ej.sum(w * per_sample_loss)`
is the mean over the real rows of every batch, the short one included, in one routine.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from einjit.errors import EinjitError


class DataError(EinjitError, ValueError):
    """Arrays that cannot be batched together, or a batching request that makes no sense."""


class Loader:
    """Iterate to get one epoch of batches (each a tuple of arrays, one per given array);
    every new iteration is the next epoch. `epoch(e)` gives epoch `e` explicitly."""

    def __init__(self, *arrays: np.ndarray, batch_size: int, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = True, weights: bool = False):
        if not arrays:
            raise DataError("einjit: Loader needs at least one array")
        self.arrays = tuple(np.asarray(a) for a in arrays)
        lengths = {len(a) for a in self.arrays}
        if len(lengths) != 1:
            raise DataError(f"einjit: Loader arrays differ in length (first axis): "
                            f"{[len(a) for a in self.arrays]}; they must hold one row per sample")
        if batch_size < 1:
            raise DataError(f"einjit: batch_size must be positive, got {batch_size}")
        if weights and drop_last:
            raise DataError("einjit: weights=True pads the last partial batch, so it needs drop_last=False")
        self.n = lengths.pop()
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.drop_last, self.weights = drop_last, weights
        self.epochs_started = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.n, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def order(self, epoch: int) -> np.ndarray:
        """The sample indices of epoch `epoch`, in the order they are batched."""
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def index_batches(self, epoch: int) -> Iterator[tuple[np.ndarray, int]]:
        """The rows of each batch of epoch `epoch` (padded to full size with `weights=True`)
        and how many of them are real."""
        order, size = self.order(epoch), self.batch_size
        full = self.n // size * size
        for rows in order[:full].reshape(-1, size):
            yield rows, size
        rows = order[full:]
        real = len(rows)
        if real and not self.drop_last:
            yield (np.concatenate([rows, np.resize(rows, size - real)]) if self.weights else rows), real

    def row_weights(self, real: int) -> np.ndarray:
        """The weights of a batch with `real` real rows: `1 / real` each, 0 for the padding."""
        w = np.zeros(self.batch_size)
        w[:real] = 1.0 / real
        return w

    def batch(self, rows: np.ndarray, real: int) -> tuple[np.ndarray, ...]:
        arrays = tuple([a.take(rows, axis=0) for a in self.arrays])
        return (*arrays, self.row_weights(real)) if self.weights else arrays

    def epoch(self, epoch: int) -> Iterator[tuple[np.ndarray, ...]]:
        for rows, real in self.index_batches(epoch):
            yield self.batch(rows, real)

    def __iter__(self) -> Iterator[tuple[np.ndarray, ...]]:
        e = self.epochs_started
        self.epochs_started += 1
        return self.epoch(e)


def split(*arrays: np.ndarray, test_fraction: float = 0.2, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A seeded random train / test split of equally long arrays: `(train_arrays, test_arrays)`."""
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise DataError(f"einjit: split arrays differ in length: {[len(a) for a in arrays]}")
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"einjit: test_fraction must be in (0, 1), got {test_fraction}")
    n = lengths.pop()
    perm = np.random.default_rng(seed).permutation(n)
    n_test = max(1, int(round(n * test_fraction)))
    test, train = perm[:n_test], perm[n_test:]
    return [np.asarray(a)[train] for a in arrays], [np.asarray(a)[test] for a in arrays]


def batches(arrays: Sequence[np.ndarray], batch_size: int) -> Iterator[tuple[np.ndarray, ...]]:
    """In-order batches of every row, the last one short: for evaluation and prediction."""
    return Loader(*arrays, batch_size=batch_size, shuffle=False, drop_last=False).epoch(0)
