"""Small synthetic datasets, generated locally (no network).

`half_moons` follows OCANNL's generator: `len` points per moon at angles `i * pi / len`; the
first moon is `(cos v, sin v)` with label 1, the second `(1 - cos v, 0.5 - sin v)` with label
-1, each coordinate perturbed by uniform noise in `[-noise_range, noise_range)`.
"""

from __future__ import annotations

import numpy as np


def half_moons(len: int = 200, *, noise_range: float = 0.1, seed: int | None = 0,  # noqa: A002 - the seed's name
               dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates of shape (2*len, 2) and labels ±1 of shape (2*len, 1)."""
    rng = np.random.default_rng(seed)
    v = np.arange(len) * np.pi / len
    c, s = np.cos(v), np.sin(v)
    first = np.stack([c, s], axis=1)
    second = np.stack([1.0 - c, 0.5 - s], axis=1)
    coords = np.concatenate([first, second]) + rng.uniform(-noise_range, noise_range, (2 * len, 2))
    labels = np.concatenate([np.ones((len, 1)), -np.ones((len, 1))])
    return coords.astype(dtype), labels.astype(dtype)


def circles(len: int = 200, *, noise_range: float = 0.1, inner_radius: float = 0.5, seed: int | None = 0,  # noqa: A002
            dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """Two concentric circles: the outer (radius 1) labelled 1, the inner labelled -1."""
    rng = np.random.default_rng(seed)
    v = np.arange(len) * 2 * np.pi / len
    outer = np.stack([np.cos(v), np.sin(v)], axis=1)
    inner = inner_radius * outer
    coords = np.concatenate([outer, inner]) + rng.uniform(-noise_range, noise_range, (2 * len, 2))
    labels = np.concatenate([np.ones((len, 1)), -np.ones((len, 1))])
    return coords.astype(dtype), labels.astype(dtype)


def shuffled(coords: np.ndarray, labels: np.ndarray, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The same points in a seeded random order (the generators emit one class after the other)."""
    perm = np.random.default_rng(seed).permutation(len(coords))
    return coords[perm], labels[perm]
