"""einjit's own thread team (`team.c`), linked into every program compiled for several threads.

gcc lowers the generated C's OpenMP pragmas to calls of libgomp's interface (`GOMP_parallel`,
the dynamic loop's start/next/end, `GOMP_single_start`, `GOMP_barrier`); `team.c` defines
those einjit uses, with hidden visibility, so a program's calls bind to its own copy and
nothing else in the process (another library's OpenMP) is touched. The generated C keeps its
pragmas and reads as before; what changes is how threads wait (spin while the work comes back
to back, sleep when the machine is busy or the wait is long: see `team.c`).

`EINJIT_THREAD_TEAM=gomp` links libgomp's instead (for A/B measurements), and so does a user's
own libgomp wait setting (`OMP_WAIT_POLICY`, `GOMP_SPINCOUNT`: `openmp_env.USER_SETTINGS`),
which then applies as it would to any OpenMP program; the choice is part of every compiled
object's cache key. The object is compiled once per process (the first time
a multithreaded program is compiled), into the process's private directory.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
from importlib import resources
from pathlib import Path

from einjit.backends.cc import openmp_env
from einjit.errors import EinjitError

__all__ = ["SOURCE_NAME", "enabled", "key", "object_path", "source", "unbound_calls"]

SOURCE_NAME = "team.c"
"""The C source of the team, beside this module."""

FLAGS = ("-O2", "-fPIC", "-std=gnu11", "-Wall", "-Werror")


class ThreadTeamError(EinjitError, RuntimeError):
    """einjit's thread team could not be compiled (the message has the compiler's output)."""


def enabled() -> bool:
    """Whether multithreaded programs link einjit's team (`EINJIT_THREAD_TEAM` unset or
    `einjit`, no libgomp wait setting of the user's, and Linux: the team waits on futexes) or
    libgomp's."""
    value = os.environ.get("EINJIT_THREAD_TEAM", "einjit").strip() or "einjit"
    if value not in ("einjit", "gomp"):
        raise ThreadTeamError(f"einjit: EINJIT_THREAD_TEAM must be 'einjit' or 'gomp', got {value!r}")
    return (value == "einjit" and sys.platform.startswith("linux")
            and not any(var in os.environ for var in openmp_env.USER_SETTINGS))


@functools.cache
def source() -> str:
    """The C text of `team.c`."""
    return resources.files(__package__).joinpath(SOURCE_NAME).read_text(encoding="utf-8")


def key() -> str:
    """What a program's cache key takes from the team: its source's digest."""
    return "team:" + hashlib.sha256(source().encode()).hexdigest()[:16]


_objects: dict[str, Path] = {}
_lock = threading.Lock()


@functools.cache
def _dir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="einjit-team-")


def object_path(compiler: str) -> Path:
    """The team compiled by `compiler` into an object file (once per process and compiler)."""
    with _lock:
        return _objects.get(compiler) or _compile(compiler)


def _compile(compiler: str) -> Path:
    directory = Path(_dir().name)
    c_path = directory / SOURCE_NAME
    c_path.write_text(source(), encoding="utf-8")
    path = directory / f"team{len(_objects)}.o"
    try:
        done = subprocess.run([compiler, *FLAGS, "-c", "-o", str(path), str(c_path)], capture_output=True, text=True)
    except OSError as e:
        raise ThreadTeamError(f"einjit: could not run {compiler!r} to compile the thread team: {e}") from e
    if done.returncode != 0:
        raise ThreadTeamError(f"einjit: {compiler} failed compiling the thread team ({SOURCE_NAME}):\n"
                              f"{(done.stdout + done.stderr).strip()[:8000]}")
    _objects[compiler] = path
    return path


_RUNTIME_PREFIXES = ("GOMP_", "GOACC_", "omp_")


def unbound_calls(so_path: Path) -> tuple[str, ...]:
    """The OpenMP runtime entries a program linked with the team still leaves to the dynamic
    loader (`nm -D -u`): entries `team.c` does not define, which would bind to libgomp. Without
    `nm` (binutils, which gcc's own linker comes with) nothing can be listed: every entry counts
    as unbound then, so the program links on libgomp, the safe runtime."""
    try:
        done = subprocess.run(["nm", "-D", "-u", str(so_path)], capture_output=True, text=True)
    except OSError:
        return ("(nm not found)",)
    if done.returncode != 0:
        return ("(nm failed)",)
    names = (line.split()[-1].partition("@")[0] for line in done.stdout.splitlines() if line.strip())
    return tuple(sorted({n for n in names if n.startswith(_RUNTIME_PREFIXES)}))
