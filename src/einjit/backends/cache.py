"""The compiled-object cache shared by every toolchain (gcc, NVRTC, nvcc), and the signed
records other caches keep beside it.

An object is keyed by a content hash of everything that determines it (ABI version, compiler
identity, flags, target, source), so compiling a program compiled before — in this process or
an earlier one — returns the cached object without running the compiler.

Each cached file is the object followed by a trailer: `_MAGIC`, the key the object was stored
under (the hash in its file name) and an HMAC-SHA256 of kind, key and object under this
user's secret (`cache_secret.py`). A file is loaded only when its trailer names the key that
is asked for and the HMAC verifies, so a truncated or corrupted file (a crash, a full disk),
a stale one of an older layout, a valid object of another program copied over it, and an
object someone else planted in a shared or writable cache directory are all rebuilt instead
of run; the first such file a process meets is also a warning (`CacheTrustWarning`), since
it may be an attack. The trailer changes nothing for its readers: the dynamic loader ignores
bytes after an ELF object's last section, and `read_object` strips it. Records
(`store_record`, `load_record`: the program cache's JSON, which holds C source) carry the
same trailer.

A cached file is opened and read once: the bytes validated are the bytes handed out
(`CompiledObject.data`), and users load those, never the path again — a file replaced between
the check and a second open would otherwise run unchecked. An object is built in a private
temporary directory, not the cache directory, so nobody can swap the compiler's output
before it is read and signed.

Directories and files the cache cannot create or write are `config.ConfigError`s naming the
path: a compile never fails with a bare `OSError`.

Objects are written to a temporary file and published with `os.replace`, so concurrent
processes compiling the same program both succeed: each publishes a complete file, and a
reader sees one complete file or the other, never a partial one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from einjit import config
from einjit.backends import cache_secret
from einjit.config import atomic_write, cache_key

__all__ = ["CacheStats", "CacheTrustWarning", "CompiledObject", "UnsignedRecord", "atomic_write", "cache_key",
           "get_or_build", "load_record", "read_object", "store_record"]

_MAGIC = b"\nEINJIT-CACHED-KEY-HMAC-SHA256\n"
_KEY_BYTES = 32
_MAC_BYTES = 32
_TRAILER = len(_MAGIC) + _KEY_BYTES + _MAC_BYTES


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


class CacheTrustWarning(UserWarning):
    """A cached file's trailer names the right key but its HMAC does not verify: it was
    changed, or written by someone without this user's secret. It is rebuilt, not loaded."""


class UnsignedRecord(ValueError):
    """A record whose trailer is missing or does not verify under this user's secret."""


_warned = threading.Event()


def _trailer(kind: str, key: str, data: bytes) -> bytes:
    tag = key.encode("ascii")
    mac = hmac.new(cache_secret.secret(), kind.encode() + b"\0" + tag + b"\0" + data, hashlib.sha256)
    return _MAGIC + tag + mac.digest()


def _verified(kind: str, key: str, path: Path, blob: bytes) -> bytes | None:
    """What `blob` holds when its trailer names `key` and its HMAC verifies; else None, and
    once per process a warning when the trailer looks right but was not signed by this user."""
    size = len(_MAGIC) + len(key) + _MAC_BYTES
    data, trailer = blob[:-size], blob[-size:]
    if len(blob) >= size and hmac.compare_digest(trailer, _trailer(kind, key, data)):
        return data
    if trailer[:-_MAC_BYTES] == _MAGIC + key.encode("ascii") and not _warned.is_set():
        _warned.set()
        warnings.warn(f"einjit: cached file {str(path)!r} is not signed by this user's cache key "
                      f"({cache_secret.key_path()}): it was changed or written by someone else; it is not loaded "
                      f"but rebuilt (further such files are rebuilt without a warning)", CacheTrustWarning,
                      stacklevel=2)
    return None


def _read_valid(kind: str, path: Path, key: str) -> tuple[bool, bytes | None]:
    """Whether a file is at `path`, and the object it holds when it is intact, stored under
    `key` and signed by this user (read through one open: what is checked is what is returned)."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except FileNotFoundError:
        return False, None
    except OSError:
        return True, None
    return True, _verified(kind, key, path, blob)


def read_object(path: Path) -> bytes:
    """The object stored at `path`, without its trailer."""
    return path.read_bytes()[:-_TRAILER]


def store_record(kind: str, key: str, path: Path, data: bytes) -> None:
    """Publish `data` at `path` (atomically) with a trailer signing it under `key`."""
    atomic_write(path, data + _trailer(kind, key, data))


def load_record(kind: str, key: str, path: Path) -> bytes:
    """The record stored at `path` under `key`, read once and verified; `FileNotFoundError`
    when there is none, `UnsignedRecord` when it is not signed by this user."""
    blob = path.read_bytes()
    data = _verified(kind, key, path, blob)
    if data is None:
        raise UnsignedRecord(f"{path} is not signed by this user's cache key under {key}")
    return data


def get_or_build(kind: str, key_parts: Sequence[str], *, suffix: str, source: str, source_suffix: str,
                 build: Callable[[Path, Path, Path], None], stats: CacheStats, label: str,
                 keep_source: bool = False) -> CompiledObject:
    """The object for `key_parts`: from `<cache>/<kind>/` when a valid one is there, else
    made by `build(output, source_path, kept_path)`, which compiles the source at
    `source_path` (already written) into `output` (a temporary path), or raises; on failure
    the source is written to `kept_path`, which the error message should name."""
    directory = _directory(kind)
    key = cache_key(*key_parts)
    path, kept = directory / f"{key}{suffix}", directory / f"{key}{source_suffix}"
    try:
        return _get_or_build(key, path, kept, kind=kind, source=source, source_suffix=source_suffix,
                             suffix=suffix, build=build, stats=stats, label=label, keep_source=keep_source)
    except config.ConfigError:
        raise
    except OSError as e:
        where = e.filename if e.filename is not None else directory
        raise config.ConfigError(f"einjit: the compiled-object cache cannot use {str(where)!r} "
                                 f"(EINJIT_CACHE_DIR) while compiling {label}: {e.strerror or e}") from e


def _get_or_build(key: str, path: Path, kept: Path, *, kind: str, source: str, source_suffix: str,
                  suffix: str, build: Callable[[Path, Path, Path], None], stats: CacheStats, label: str,
                  keep_source: bool) -> CompiledObject:
    if keep_source:
        atomic_write(kept, source.encode())
    found, valid = _read_valid(kind, path, key)
    if valid is not None:
        stats.cache_hits += 1
        config.debug(1, f"{kind}: {label}: cache hit {path}")
        return CompiledObject(path, kept if keep_source else None, True, valid)
    if found:
        stats.rebuilds += 1
        config.debug(1, f"{kind}: {label}: cached object {path} is truncated, corrupt, not stored under its "
                        "key or not signed by this user; rebuilding")
    with tempfile.TemporaryDirectory(prefix="einjit-build-") as private:
        src = Path(private) / f"{key}{source_suffix}"
        src.write_text(source, encoding="utf-8")
        out = src.with_suffix(suffix)
        stats.compiler_invocations += 1
        try:
            build(out, src, kept)
        except BaseException:
            atomic_write(kept, source.encode())
            raise
        data = out.read_bytes()
    store_record(kind, key, path, data)
    return CompiledObject(path, kept if keep_source else None, False, data)
