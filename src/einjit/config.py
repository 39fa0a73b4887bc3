"""Process-wide settings read from the environment: debug level and cache location (with the
content keys and atomic writes of cached files).

Every layer may import this module; it imports nothing from einjit.

`EINJIT_DEBUG=N`: 0 silent; 1 compile timings; 2 + assignments and optimized low-level code;
3 + generated C/CUDA and the compiler command; 4 + unoptimized low-level code and
virtualization decisions with their `NonVirtual` codes. Output goes to stderr (or to the file
named by `EINJIT_DEBUG_FILE`).

`EINJIT_DUMP_DIR=dir`: every compile writes what it produced, stage by stage, as files named
`<routine>.<stage>.<ext>` (`.cd` assignments, `.ll` low-level code, `.c`/`.cu` sources), so
what a compiler sees is always something a person can open.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path


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
    path = Path(base) if base else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "einjit"
    path.mkdir(parents=True, exist_ok=True)
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


def dumping() -> bool:
    """Whether `EINJIT_DUMP_DIR` is set: callers skip printing code that nobody will read."""
    return bool(os.environ.get("EINJIT_DUMP_DIR"))


def dump(routine: str, stage: str, ext: str, text: str) -> None:
    """Write one compile stage's text to `EINJIT_DUMP_DIR`, if set; a no-op otherwise."""
    base = os.environ.get("EINJIT_DUMP_DIR")
    if not base:
        return
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    name = f"{routine}.{stage}.{ext}" if stage else f"{routine}.{ext}"
    (path / name).write_text(text, encoding="utf-8")
