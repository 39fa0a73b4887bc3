"""Initializers in PyTorch's conventions (gain sqrt(2) for kaiming, 1 for xavier), drawn on the
host from `train.init_params`' seeded generator once fan-in and fan-out are inferred."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from einjit.tensor.tensor import Tensor, TensorError

Fans = Callable[[Tensor], tuple[int, int]]


def _kaiming_uniform(rng, dims, fan_in, fan_out):
    bound = math.sqrt(6.0 / max(1, fan_in))
    return rng.uniform(-bound, bound, dims)


def _kaiming_normal(rng, dims, fan_in, fan_out):
    return rng.standard_normal(dims) * math.sqrt(2.0 / max(1, fan_in))


def _xavier_uniform(rng, dims, fan_in, fan_out):
    bound = math.sqrt(6.0 / max(1, fan_in + fan_out))
    return rng.uniform(-bound, bound, dims)


def _xavier_normal(rng, dims, fan_in, fan_out):
    return rng.standard_normal(dims) * math.sqrt(2.0 / max(1, fan_in + fan_out))


def _bias_uniform(rng, dims, fan_in, fan_out):
    bound = 1.0 / math.sqrt(max(1, fan_in))
    return rng.uniform(-bound, bound, dims)


INITIALIZERS = {
    "kaiming_uniform": _kaiming_uniform,
    "kaiming_normal": _kaiming_normal,
    "xavier_uniform": _xavier_uniform,
    "xavier_normal": _xavier_normal,
    "bias_uniform": _bias_uniform,
    "zeros": lambda rng, dims, fan_in, fan_out: np.zeros(dims),
    "ones": lambda rng, dims, fan_in, fan_out: np.ones(dims),
}


def set_init(p: Tensor, name: str, fans: Fans) -> None:
    """Give parameter `p` the initializer `name`; `fans(p)` is called once dims are inferred."""
    if name not in INITIALIZERS:
        raise TensorError(f"einjit: unknown initializer {name!r} for {p.label_str}; use one of {sorted(INITIALIZERS)}")
    fn = INITIALIZERS[name]
    p.init = lambda rng: fn(rng, p.dims, *fans(p))
