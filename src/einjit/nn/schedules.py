"""Learning-rate schedules: plain functions of the step number (counting from 0). An optimizer
writes `schedule(step)` into its hosted learning-rate scalar before each step, so the compiled
routine never changes."""

from __future__ import annotations

import math
from collections.abc import Callable

Schedule = Callable[[int], float]


def constant(lr: float) -> Schedule:
    return lambda step: float(lr)


def step_decay(lr: float, step_size: int, gamma: float = 0.1) -> Schedule:
    """`lr * gamma ** (step // step_size)` (PyTorch's StepLR)."""
    if step_size < 1:
        raise ValueError(f"einjit: step_decay needs step_size >= 1, got {step_size}")
    return lambda step: float(lr) * gamma ** (step // step_size)


def cosine(lr: float, total_steps: int, min_lr: float = 0.0) -> Schedule:
    """Half a cosine from `lr` at step 0 to `min_lr` at `total_steps`, then flat."""
    if total_steps < 1:
        raise ValueError(f"einjit: cosine needs total_steps >= 1, got {total_steps}")
    return lambda step: min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(step, total_steps) / total_steps))


def linear_warmup(schedule: Schedule | float, warmup_steps: int) -> Schedule:
    """Ramps linearly from `1/warmup_steps` of the schedule's value up to it over the first
    `warmup_steps` steps, then follows the schedule."""
    inner = constant(schedule) if isinstance(schedule, (int, float)) else schedule
    if warmup_steps < 1:
        return inner
    return lambda step: inner(step) * min(1.0, (step + 1) / warmup_steps)
