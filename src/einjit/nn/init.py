"""Initializers in PyTorch's conventions (gain sqrt(2) for kaiming, 1 for xavier), written once
(`SCHEMES`) and drawn either on the host from `train.init_params`' seeded generator once fan-in
and fan-out are inferred (the one front door of initialization), or inside a compiled routine
(`init_code`) from the in-graph random numbers of `einjit.uniform`: the same distributions, from
two generators (the host's NumPy stream, the routine's counter-based hash).

The two give different values for the same seed, by design, and cannot be made to agree
without breaking one of them:

- the host's values are a function of the seed and of the order `init_params` meets the
  parameters in (one `np.random.default_rng(seed)` stream): they are what checkpoints,
  PyTorch comparisons and every seeded result so far were made from, and they must not move;
- the routine's values are a function of the seed and of the random tensor's place among all
  those drawn from that seed in the process (`random.stream_base(seed, index)`: dropout masks
  built before count), not of the parameter, so no host order reproduces them in general;
- a normal is Box-Muller computed in the parameter's precision with the backend's `log` and
  `cos` (libm, libmvec or CUDA's), whose last bits differ from NumPy's.

What they share is tested: each reproduces itself for its seed, every scheme has the same
bounds and moments either way, and the routine's uniform draws are exactly the counter-hash
stream (`tests/nn/test_init.py`). To give a model the host's values inside a routine's
context, initialize on the host (`train.init_params`) before the first step."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

from einjit.ir import assignments as asg
from einjit.tensor.tensor import Tensor, TensorError

Fans = Callable[[Tensor], tuple[int, int]]


#: GPT-2's weights: a normal of standard deviation 0.02 whatever the fans.
GPT2_STD = 0.02

SCHEMES: dict[str, tuple[str, Callable[[int, int], float]]] = {
    "gpt2_normal": ("normal", lambda fi, fo: GPT2_STD),
    "kaiming_uniform": ("uniform", lambda fi, fo: math.sqrt(6.0 / max(1, fi))),
    "kaiming_normal": ("normal", lambda fi, fo: math.sqrt(2.0 / max(1, fi))),
    "xavier_uniform": ("uniform", lambda fi, fo: math.sqrt(6.0 / max(1, fi + fo))),
    "xavier_normal": ("normal", lambda fi, fo: math.sqrt(2.0 / max(1, fi + fo))),
    "bias_uniform": ("uniform", lambda fi, fo: 1.0 / math.sqrt(max(1, fi))),
    "zeros": ("constant", lambda fi, fo: 0.0),
    "ones": ("constant", lambda fi, fo: 1.0),
}
"""Each initializer once: its distribution and its scale from fan-in and fan-out (a uniform
bound, a normal standard deviation, or the constant). The host draws (`draw`, for
`train.init_params`) and the in-routine code (`init_code`) both read it, so the two agree on
every distribution by construction."""


def draw(name: str, rng: np.random.Generator, dims: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    """Initializer `name`'s values for `dims`, drawn on the host from `rng`."""
    kind, scale_of = SCHEMES[name]
    scale = scale_of(fan_in, fan_out)
    match kind:
        case "uniform":
            return rng.uniform(-scale, scale, dims)
        case "normal":
            return rng.standard_normal(dims) * scale
        case _:
            return np.full(dims, scale)


_chosen: dict[int, tuple[str, Fans]] = {}


def set_init(p: Tensor, name: str, fans: Fans) -> None:
    """Give parameter `p` the initializer `name`; `fans(p)` is called once dims are inferred."""
    if name not in SCHEMES:
        raise TensorError(f"einjit: unknown initializer {name!r} for {p.label_str}; use one of {sorted(SCHEMES)}")
    p.init = lambda rng: draw(name, rng, p.dims, *fans(p))
    _chosen[p.id] = (name, fans)


def init_code(params: Tensor | Iterable[Tensor], *, seed: int = 0) -> asg.Asgns:
    """Assignments that initialize `params` inside a routine, from in-graph random numbers: the
    same distributions as `train.init_params`, different draws (the module says why). Run the
    routine once."""
    from einjit.tensor import random as rnd
    from einjit.tensor.notation import cd
    from einjit.tensor.operation import _lazy_number

    out = []
    for p in params.params() if isinstance(params, Tensor) else params:
        if p.id not in _chosen:
            raise TensorError(f"einjit: parameter {p.label_str} has no einjit.nn initializer to run in a routine; "
                              f"give it one with einjit.nn.init.set_init")
        name, fans = _chosen[p.id]
        kind, scale_of = SCHEMES[name]

        def scale_value(p=p, fans=fans, scale_of=scale_of):
            return scale_of(*fans(p))

        scale = _lazy_number(asg.Lazy(scale_value))
        match kind:
            case "uniform":
                code = cd("p =: s * (u + u - 1)", p=p.value, s=scale, u=rnd.uniform(p, seed=seed))
            case "normal":
                code = cd("p =: s * n", p=p.value, s=scale, n=rnd.normal(p, seed=seed))
            case _:
                code = cd("p =: s", p=p.value, s=scale)
        out.append(asg.BlockComment(f"init {p.label_str} ({name})", code.asgns))
    return asg.sequence(*out)
