"""How long einjit's OpenMP threads spin before they sleep.

libgomp's threads spin at a barrier, or between parallel regions, for 300,000 rounds of
`pause` (about 8 ms on the 2-core znver3 machine) before they sleep on a futex. On a quiet
machine that costs nothing; on one that other processes keep busy, a thread spins away the
time slice its partner needs to reach the barrier, and every barrier of a training step can
cost a slice. The 2-block GPT step at 2 threads, side by side with 1 thread at a load of 7-9
on 2 cores: 0.06-0.09x the 1-thread speed with libgomp's default, 0.35x with a spin count of
10,000, 0.79x with 1,000, 0.87-0.98x with `OMP_WAIT_POLICY=passive` (no spinning).

einjit loads its programs with a spin count of `SPIN_COUNT` (1,000 rounds, 28 µs here): a
thread still finds the next nest's work at once when the nests between take less than that,
and sleeps otherwise, so a busy machine's other processes get the core. libgomp reads its
settings from the environment once, when the first program that uses it is loaded; the
setting is made around that load only and taken back after, so the user's environment (and
any process started from it) is unchanged. A user who sets `OMP_WAIT_POLICY` or
`GOMP_SPINCOUNT` keeps their own; a library that loaded libgomp before einjit keeps its
settings too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["SPIN_COUNT", "USER_SETTINGS", "spin_policy"]

SPIN_COUNT = 1000

USER_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
"""The environment variables that decide how libgomp's threads wait: if one is set, einjit
sets nothing."""


@contextlib.contextmanager
def spin_policy() -> Iterator[None]:
    """Load a compiled program inside this: libgomp, if this load brings it in, reads
    `GOMP_SPINCOUNT = SPIN_COUNT` (unless the user set a wait policy)."""
    if any(var in os.environ for var in USER_SETTINGS):
        yield
        return
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    try:
        yield
    finally:
        os.environ.pop("GOMP_SPINCOUNT", None)
