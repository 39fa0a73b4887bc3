"""einjit's own thread team (`team.c`), the OpenMP runtime of every program compiled for several threads.

gcc lowers the generated C's OpenMP pragmas to calls of libgomp's interface (`GOMP_parallel`,
the dynamic loop's start/next/end, `GOMP_single_start`, `GOMP_barrier`). Each such program
links `team_entries.c`, which defines those einjit uses with hidden visibility (so the
program's calls bind to it and nothing else in the process, another library's OpenMP, is
touched) and passes them on to `team.c`: one shared library per process (`soname`, from a
digest of the sources), which the program needs by that name and the loader finds already
loaded (`load`, before any such program). So every program of the process shares one set of
teams and workers. The generated C keeps its pragmas and reads as before; what changes is how
threads wait (spin while the work comes back to back, sleep when the machine is busy or the
wait is long: see `team.c`).

`EINJIT_THREAD_TEAM=gomp` links libgomp's instead (for A/B measurements), and so does a user's
own libgomp wait setting (`OMP_WAIT_POLICY`, `GOMP_SPINCOUNT`: `openmp_env.USER_SETTINGS`),
which then applies as it would to any OpenMP program; the choice is part of every compiled
object's cache key. The entries' object and the team's library live in the compiled-object
cache (`cache.py`: signed, published by atomic rename, so concurrent processes each read one
complete file), keyed by the compiler and the sources' digest: a process that loads cached
programs runs no compiler for the team either (gcc took 0.9 s of wall time for `team.c` on
the 2-core development machine, which the first multithreaded program of every process
paid). Each process copies the validated bytes into its private directory and links and
loads that copy, as `toolchain.load_library` does for programs.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import threading
from importlib import resources
from pathlib import Path

from einjit.backends import cache
from einjit.backends.cc import openmp_env
from einjit.backends.cc.compiler_identity import identity
from einjit.errors import EinjitError

__all__ = ["SOURCE_NAME", "enabled", "key", "library_path", "link_inputs", "load", "object_path", "soname",
           "source", "stats", "unbound_calls"]

SOURCE_NAME = "team.c"
"""The C source of the team, beside this module."""

ENTRIES_NAME = "team_entries.c"
"""The C source of the libgomp entries each program links."""

_SOURCES = ("team.h", SOURCE_NAME, ENTRIES_NAME)

_FLAGS = ("-O2", "-fPIC", "-std=gnu11", "-Wall", "-Werror")


class ThreadTeamError(EinjitError, RuntimeError):
    """einjit's thread team could not be compiled or loaded (the message says why)."""


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
def source(name: str = SOURCE_NAME) -> str:
    """The C text of `team.c` (or of another of the team's sources, by name)."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


@functools.cache
def _digest() -> str:
    return hashlib.sha256("\0".join(source(name) for name in _SOURCES).encode()).hexdigest()[:16]


def key() -> str:
    """What a program's cache key takes from the team: its sources' digest."""
    return "team:" + _digest()


def soname() -> str:
    """The name programs need the team's library by: a program compiled against other
    sources of the team needs another name, so it never binds to a team it was not built for."""
    return f"libeinjit_team-{_digest()}.so"


_built: dict[tuple[str, str], Path] = {}
_lock = threading.Lock()
_loaded: list[ctypes.CDLL] = []


@functools.cache
def _dir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="einjit-team-")


def object_path(compiler: str) -> Path:
    """The libgomp entries (`team_entries.c`) compiled by `compiler` into an object file."""
    return _build(compiler, "entries")


def library_path(compiler: str) -> Path:
    """The team (`team.c`) compiled by `compiler` into a shared library named `soname`."""
    return _build(compiler, "library")


def link_inputs(compiler: str) -> tuple[str, str]:
    """What a multithreaded program's link takes to run on the team: the entries' object and
    the team's library (which the program then needs by its soname)."""
    return str(object_path(compiler)), str(library_path(compiler))


def load(compiler: str) -> None:
    """Load the team's library into the process (compiled by `compiler` the first time), once:
    programs that need it by its soname then bind to this one copy."""
    path = library_path(compiler)
    with _lock:
        if _loaded:
            return
        try:
            _loaded.append(ctypes.CDLL(str(path)))
        except OSError as e:
            raise ThreadTeamError(f"einjit: could not load the thread team's library {path}: {e}") from e


stats = cache.CacheStats()
"""The team's cache counters: a process finding both built runs no compiler for them."""

_CACHE_VERSION = "einjit-team-1"
"""Changed when the team is built from the same sources and compiler into other objects."""


def _build(compiler: str, kind: str) -> Path:
    with _lock:
        path = _built.get((compiler, kind))
        if path is None:
            path = _built[(compiler, kind)] = _cached(compiler, kind)
        return path


def _cached(compiler: str, kind: str) -> Path:
    """The object of `kind` from the compiled-object cache (compiled into it the first time),
    as a file of this process's private directory."""
    main = ENTRIES_NAME if kind == "entries" else SOURCE_NAME
    suffix = ".o" if kind == "entries" else ".so"
    built = cache.get_or_build(
        "team", [_CACHE_VERSION, identity(compiler), platform.machine(), kind, " ".join(_command(compiler, kind)),
                 *(source(name) for name in _SOURCES)],
        suffix=suffix, source=source(main), source_suffix=".c", stats=stats, label=f"the thread team's {kind}",
        build=lambda out, src, kept: _compile(compiler, kind, out, src.parent))
    path = Path(_dir().name) / f"{Path(main).stem}{len(_built)}{suffix}"
    path.write_bytes(built.data)
    return path


def _command(compiler: str, kind: str) -> list[str]:
    """The compiler command for `kind`, its output and sources left for `_compile` to add."""
    if kind == "entries":
        return [compiler, *_FLAGS, "-c"]
    return [compiler, *_FLAGS, "-fvisibility=hidden", "-shared", f"-Wl,-soname,{soname()}", "-pthread"]


def _compile(compiler: str, kind: str, out: Path, directory: Path) -> None:
    """Compile the team's `kind` into `out` from its sources, written to `directory`."""
    for name in _SOURCES:
        (directory / name).write_text(source(name), encoding="utf-8")
    main = ENTRIES_NAME if kind == "entries" else SOURCE_NAME
    cmd = [*_command(compiler, kind), "-o", str(out), str(directory / main)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise ThreadTeamError(f"einjit: could not run {compiler!r} to compile the thread team: {e}") from e
    if done.returncode != 0:
        raise ThreadTeamError(f"einjit: {compiler} failed compiling the thread team ({' '.join(cmd)}):\n"
                              f"{(done.stdout + done.stderr).strip()[:8000]}")


_RUNTIME_PREFIXES = ("GOMP_", "GOACC_", "omp_")


def unbound_calls(so_path: Path) -> tuple[str, ...]:
    """The OpenMP runtime entries a program linked with the team still leaves to the dynamic
    loader (`nm -D -u`): entries `team_entries.c` does not define, which would bind to libgomp. Without
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
