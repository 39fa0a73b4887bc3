"""Process-wide settings read from the environment: debug level and cache location (with the
content keys and atomic writes of cached files).

Every layer may import this module; it imports nothing from einjit but `errors`.

`EINJIT_DEBUG=N`: 0 silent; 1 compile timings; 2 + assignments and optimized low-level code;
3 + generated C/CUDA and the compiler command; 4 + unoptimized low-level code and
virtualization decisions with their `NonVirtual` codes. Output goes to stderr (or to the file
named by `EINJIT_DEBUG_FILE`).

`EINJIT_DUMP_DIR=dir`: every compile writes what it produced, stage by stage, as files named
`<routine>.<stage>.<ext>` (`.cd` assignments, `.ll` low-level code, `.c`/`.cu` sources), so
what a compiler sees is always something a person can open. Routine names reach here already
reduced to identifiers (`ir.c_names.routine_name`); `dump` reduces what it is given once more,
so no name, whoever passes it, writes outside the directory.

An unusable cache or dump directory (a file in the way, no permission) is a `ConfigError`
naming the path and the variable that chose it; einjit never falls back to another place
silently, since a cache in an unexpected place is one nobody cleans or finds.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path

from einjit.errors import EinjitError


class ConfigError(EinjitError, OSError):
    """A directory einjit was told to use (by an environment variable or its default) cannot be
    used; the message names the path, the variable and the cause."""


def debug_level() -> int:
    try:
        return int(os.environ.get("EINJIT_DEBUG", "0"))
    except ValueError:
        return 0


def debug(level: int, message: str) -> None:
    """Emit `message` if the debug level is at least `level`."""
    if debug_level() < level:
        return
    target = os.environ.get("EINJIT_DEBUG_FILE")
    text = f"[einjit:{level}] {message}\n"
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stderr.write(text)


def cache_dir() -> Path:
    """Where compiled objects and kept sources live; created on first use."""
    base = os.environ.get("EINJIT_CACHE_DIR")
    if base:
        return usable_dir(Path(base), "EINJIT_CACHE_DIR")
    home = os.environ.get("XDG_CACHE_HOME")
    path = Path(home) if home else Path.home() / ".cache"
    return usable_dir(path / "einjit", "XDG_CACHE_HOME" if home else "the default cache directory ~/.cache")


def usable_dir(path: Path, chosen_by: str) -> Path:
    """`path`, created if missing, once it is a directory einjit can write to; else a
    `ConfigError` naming it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"einjit: cannot use directory {str(path)!r} (set by {chosen_by}): "
                          f"{e.strerror or e}; point {_variable(chosen_by)} at a writable directory") from e
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"einjit: cannot use directory {str(path)!r} (set by {chosen_by}): it is not writable; "
                          f"point {_variable(chosen_by)} at a writable directory")
    return path


def cache_key(*parts: str) -> str:
    """The content hash naming a cached file: 32 hex digits of SHA-256 over the parts."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same directory, so a concurrent
    reader sees the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _variable(chosen_by: str) -> str:
    return chosen_by if chosen_by.startswith("EINJIT_") else "EINJIT_CACHE_DIR"


def dumping() -> bool:
    """Whether `EINJIT_DUMP_DIR` is set: callers skip printing code that nobody will read."""
    return bool(os.environ.get("EINJIT_DUMP_DIR"))


def dump(routine: str, stage: str, ext: str, text: str) -> None:
    """Write one compile stage's text to `EINJIT_DUMP_DIR`, if set; a no-op otherwise."""
    base = os.environ.get("EINJIT_DUMP_DIR")
    if not base:
        return
    path = usable_dir(Path(base), "EINJIT_DUMP_DIR")
    name = f"{file_stem(routine)}.{stage}.{ext}" if stage else f"{file_stem(routine)}.{ext}"
    target = path / name
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"einjit: cannot write dump {str(target)!r} (EINJIT_DUMP_DIR): {e.strerror or e}") from e


_MAX_STEM = 100


def file_stem(name: str) -> str:
    """`name` as one file name component: letters, digits, `_` and `-` only (no separator, no
    `..`, no NUL), at most `_MAX_STEM` characters; a name changed on the way gets a hash of
    the original, so different names keep different files."""
    clean = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_-")
    if clean == name and 0 < len(name) <= _MAX_STEM:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{clean[:_MAX_STEM - 12] or 'routine'}_h{digest}"
