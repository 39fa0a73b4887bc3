"""The compiled-object cache shared by every toolchain (gcc, NVRTC, nvcc).

An object is keyed by a content hash of everything that determines it (ABI version, compiler
identity, flags, target, source), so compiling a program compiled before — in this process or
an earlier one — returns the cached object without running the compiler.

Each cached file is the object followed by a trailer: `_MAGIC`, the key the object was stored
under (the hash in its file name) and the SHA-256 of key and object together. A file is
loaded only when its trailer names the key that is asked for and the hash matches, so a
truncated or corrupted file (a crash, a full disk), a stale one of an older layout, or a valid
object of another program copied over it is rebuilt instead of run. The trailer changes
nothing for its readers: the dynamic loader ignores bytes after an ELF object's last section,
and `read_object` strips it.

A cached file is opened and read once: the bytes validated are the bytes handed out
(`CompiledObject.data`), and users load those, never the path again — a file replaced between
the check and a second open would otherwise run unchecked.

Directories and files the cache cannot create or write are `config.ConfigError`s naming the
path: a compile never fails with a bare `OSError`.

Objects are written to a temporary file and published with `os.replace`, so concurrent
processes compiling the same program both succeed: each publishes a complete file, and a
reader sees one complete file or the other, never a partial one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from einjit import config
from einjit.config import atomic_write, cache_key

__all__ = ["CacheStats", "CompiledObject", "atomic_write", "cache_key", "get_or_build", "read_object"]

_MAGIC = b"\nEINJIT-OBJECT-KEY-SHA256\n"
_KEY_BYTES = 32
_TRAILER = len(_MAGIC) + _KEY_BYTES + 32


@dataclass
class CacheStats:
    """How often a toolchain's compiler actually ran, and how often the cache answered."""

    compiler_invocations: int = 0
    cache_hits: int = 0
    rebuilds: int = 0
    """Cached files found invalid (truncated, corrupt, stale or another key's) and compiled again."""


@dataclass(frozen=True)
class CompiledObject:
    """A cached object and, when kept, its source beside it; `data` is the object as validated
    (without its trailer), what a user loads."""

    path: Path
    source_path: Path | None
    hit: bool
    data: bytes = dataclasses.field(repr=False)


def _directory(kind: str) -> Path:
    return config.usable_dir(config.cache_dir() / kind, "EINJIT_CACHE_DIR")


def _trailer(key: str, data: bytes) -> bytes:
    tag = key.encode("ascii")
    return _MAGIC + tag + hashlib.sha256(tag + data).digest()


def _read_valid(path: Path, key: str) -> tuple[bool, bytes | None]:
    """Whether a file is at `path`, and the object it holds when it is intact and stored under
    `key` (read through one open: what is checked is what is returned)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return False, None
    except OSError:
        return True, None
    if len(data) >= _TRAILER and data[-_TRAILER:] == _trailer(key, data[:-_TRAILER]):
        return True, data[:-_TRAILER]
    return True, None


def read_object(path: Path) -> bytes:
    """The object stored at `path`, without its trailer."""
    return path.read_bytes()[:-_TRAILER]


def get_or_build(kind: str, key_parts: Sequence[str], *, suffix: str, source: str, source_suffix: str,
                 build: Callable[[Path, Path, Path], None], stats: CacheStats, label: str,
                 keep_source: bool = False) -> CompiledObject:
    """The object for `key_parts`: from `<cache>/<kind>/` when a valid one is there, else
    made by `build(output, source_path, kept_path)`, which compiles the source at
    `source_path` (already written) into `output` (a temporary path), or raises; on failure
    the source is moved to `kept_path`, which the error message should name."""
    directory = _directory(kind)
    key = cache_key(*key_parts)
    path, kept = directory / f"{key}{suffix}", directory / f"{key}{source_suffix}"
    try:
        return _get_or_build(directory, key, path, kept, kind=kind, source=source, source_suffix=source_suffix,
                             suffix=suffix, build=build, stats=stats, label=label, keep_source=keep_source)
    except config.ConfigError:
        raise
    except OSError as e:
        where = e.filename if e.filename is not None else directory
        raise config.ConfigError(f"einjit: the compiled-object cache cannot use {str(where)!r} "
                                 f"(EINJIT_CACHE_DIR) while compiling {label}: {e.strerror or e}") from e


def _get_or_build(directory: Path, key: str, path: Path, kept: Path, *, kind: str, source: str, source_suffix: str,
                  suffix: str, build: Callable[[Path, Path, Path], None], stats: CacheStats, label: str,
                  keep_source: bool) -> CompiledObject:
    if keep_source:
        atomic_write(kept, source.encode())
    found, valid = _read_valid(path, key)
    if valid is not None:
        stats.cache_hits += 1
        config.debug(1, f"{kind}: {label}: cache hit {path}")
        return CompiledObject(path, kept if keep_source else None, True, valid)
    if found:
        stats.rebuilds += 1
        config.debug(1, f"{kind}: {label}: cached object {path} is truncated, corrupt or not stored under its "
                        "key; rebuilding")
    fd, tmp_src = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=source_suffix)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(source)
    tmp_out = Path(tmp_src).with_suffix(suffix)
    stats.compiler_invocations += 1
    try:
        try:
            build(tmp_out, Path(tmp_src), kept)
        except BaseException:
            os.replace(tmp_src, kept)
            raise
        data = tmp_out.read_bytes()
        with open(tmp_out, "ab") as f:
            f.write(_trailer(key, data))
        os.replace(tmp_out, path)
    finally:
        tmp_out.unlink(missing_ok=True)
        Path(tmp_src).unlink(missing_ok=True)
    return CompiledObject(path, kept if keep_source else None, False, data)
