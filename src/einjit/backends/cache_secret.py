"""The per-user secret that signs what einjit caches (compiled objects, program records).

A cache directory may be shared (`EINJIT_CACHE_DIR` on a group's disk) or writable by
someone else, and what it holds is code einjit loads and runs. A content hash proves only
that a file is intact, not who wrote it: anyone who can write the directory can compute it.
So every cached file carries an HMAC-SHA256 under a secret only this user can read, and a
file whose HMAC does not verify is a miss.

The secret lives outside any cache directory: `EINJIT_CACHE_KEY` names the file, else
`$XDG_CONFIG_HOME/einjit/cache.key` (default `~/.config/einjit/cache.key`). It is 32 random
bytes, created on first use with mode 0600 in a 0700 directory. A key file that is another
user's, or that others may read or write, would let them sign objects, so it is a
`ConfigError` naming the path rather than a key einjit uses. Two users sharing one cache
directory each sign with their own key and rebuild what the other wrote.
"""

from __future__ import annotations

import functools
import os
import secrets
import stat
from pathlib import Path

from einjit.config import ConfigError

__all__ = ["key_path", "secret"]

_BYTES = 32


def key_path() -> Path:
    """The key file this process uses (see the module docstring)."""
    explicit = os.environ.get("EINJIT_CACHE_KEY")
    if explicit:
        return Path(explicit)
    home = os.environ.get("XDG_CONFIG_HOME")
    return (Path(home) if home else Path.home() / ".config") / "einjit" / "cache.key"


def secret() -> bytes:
    """This user's signing secret, created on first use."""
    return _secret(key_path())


@functools.cache
def _secret(path: Path) -> bytes:
    try:
        try:
            return _read(path)
        except FileNotFoundError:
            _create(path)
            return _read(path)
    except ConfigError:
        raise
    except OSError as e:
        raise ConfigError(f"einjit: cannot use the cache signing key {str(path)!r} (set by EINJIT_CACHE_KEY, else "
                          f"XDG_CONFIG_HOME or ~/.config): {e.strerror or e}") from e


def _read(path: Path) -> bytes:
    """The key at `path`, once it is checked to be this user's alone (opened once, checked and
    read through the same descriptor, never through a link)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(_BYTES + 1)
    finally:
        os.close(fd)
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO) or not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"einjit: the cache signing key {str(path)!r} is not a file only this user can read and "
                          f"write (mode {stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}); whoever else can "
                          f"read it can sign code einjit loads: remove it (einjit makes a new one) or chmod 600 it")
    if len(data) != _BYTES:
        raise ConfigError(f"einjit: the cache signing key {str(path)!r} holds {len(data)} bytes, not {_BYTES}; "
                          f"remove it and einjit makes a new one")
    return data


def _create(path: Path) -> None:
    """Write a fresh key; when another process made one first, keep that one (`os.link`
    publishes a complete file and never replaces one)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(_BYTES))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
