"""How long einjit's OpenMP threads spin before they sleep.

libgomp's threads spin at a barrier, or between parallel regions, for 300,000 rounds of
`pause` (about 8 ms on the 2-core znver3 machine) before they sleep on a futex. On a quiet
machine that costs nothing; on one that other processes keep busy, a thread spins away the
time slice its partner needs to reach the barrier, and every barrier of a training step can
cost a slice. The 2-block GPT step at 2 threads, side by side with 1 thread at a load of 7-9
on 2 cores: 0.06-0.09x the 1-thread speed with libgomp's default, 0.35x with a spin count of
10,000, 0.79x with 1,000, 0.87-0.98x with `OMP_WAIT_POLICY=passive` (no spinning).

einjit's libgomp spins `SPIN_COUNT` rounds (1,000, 28 µs here): a thread still finds the
next region's work at once when the code between takes less than that, and sleeps
otherwise, so a busy machine's other processes get the core. (By default einjit's programs
do not call libgomp at all: they run on einjit's thread team, `thread_team`, whose waits
adapt to the machine, and libgomp is not loaded for them. This setting is for
`EINJIT_THREAD_TEAM=gomp`.)

libgomp reads its settings from the environment once, when it is loaded, and has no other
way to take them. So the first time einjit loads a program that needs libgomp in a process
(`toolchain.load_library` reads the program's needed libraries: `elf_needed`), it loads libgomp
itself with `GOMP_SPINCOUNT` set, under a lock, and takes the setting back at once: the
environment is changed for that one load and never again (the user's environment, and any
process started from it, is unchanged). A process whose other threads read or change the
environment while einjit loads its first program may see the setting for that moment; load
an einjit program (or call `prepare`) before starting them. A user who sets
`OMP_WAIT_POLICY` or `GOMP_SPINCOUNT` keeps their own; a library that loaded libgomp before
einjit keeps its settings too.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

__all__ = ["LIBGOMP", "SPIN_COUNT", "USER_SETTINGS", "prepare"]

SPIN_COUNT = 1000

USER_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
"""The environment variables that decide how libgomp's threads wait: if one is set, einjit
sets nothing."""

LIBGOMP = "libgomp.so.1"
"""The library gcc's `-fopenmp` links, by the name the dynamic loader finds it under."""

_lock = threading.Lock()
_prepared = False


def prepare() -> None:
    """Load libgomp with `GOMP_SPINCOUNT = SPIN_COUNT` (unless the user set a wait policy, or
    libgomp is already loaded), once per process; later calls do nothing. Where libgomp is not
    found by that name (not Linux, or another OpenMP runtime), nothing is set."""
    global _prepared
    with _lock:
        if _prepared:
            return
        _prepared = True
        if not sys.platform.startswith("linux") or any(var in os.environ for var in USER_SETTINGS) or _loaded():
            return
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
        try:
            _keep.append(ctypes.CDLL(LIBGOMP))
        except OSError:
            pass  # no libgomp here: a program needing one fails to load with the loader's message
        finally:
            os.environ.pop("GOMP_SPINCOUNT", None)


_keep: list[ctypes.CDLL] = []
"""libgomp as `prepare` loaded it (never unloaded)."""


def _loaded() -> bool:
    try:
        ctypes.CDLL(LIBGOMP, mode=os.RTLD_NOLOAD)
    except OSError:
        return False
    return True
