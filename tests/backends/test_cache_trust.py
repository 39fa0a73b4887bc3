"""A cache directory someone else can write is not trusted: compiled objects and program
records are signed with the user's own key (`backends/cache_secret.py`), and a planted file —
unkeyed or signed with another key — is rebuilt, never loaded, with one warning per process."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest

from einjit.backends import cache, cache_secret
from einjit.config import ConfigError
from test_program_cache import run

SRC = Path(__file__).resolve().parents[2] / "src"

_PLANT = textwrap.dedent("""
    #include <stdio.h>
    __attribute__((constructor)) static void planted(void) {
        FILE *f = fopen("%s", "w");
        if (f) fclose(f);
    }
""")
"""C that leaves a marker file behind as soon as the object holding it is loaded."""

_VICTIM = textwrap.dedent("""
    import json
    import warnings
    warnings.simplefilter("always")
    from einjit import backends
    from einjit.backends.cc import toolchain as cc
    from einjit.backends.interface import default_context
    from einjit.ir import low_level as ll, tnode
    from einjit.ir.indexing import Iterator, get_symbol
    out = tnode.Tnode("out", (5,), memory_mode=tnode.hosted())
    i = get_symbol()
    code = ll.ForLoop(i, 0, 4, ll.Set(out, (Iterator(i),), ll.Constant(3.25)))
    backend = backends.get("cc")
    backend.link(default_context(backend), backend.compile((), code, shared=True, name="victim"))()
    print(json.dumps({"out": out.host_array().tolist(), "gcc": cc.stats.compiler_invocations,
                      "rebuilds": cc.stats.rebuilds, "hits": cc.stats.cache_hits}))
""")


def _victim(env: dict[str, str]) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", _VICTIM], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _attacker_trailer(monkeypatch, tmp_path: Path, kind: str, key: str, data: bytes) -> bytes:
    """The trailer of this cache's layout, signed by someone holding another key."""
    with monkeypatch.context() as m:
        m.setenv("EINJIT_CACHE_KEY", str(tmp_path / "attacker" / "cache.key"))
        return cache._trailer(kind, key, data)


def _unkeyed_trailer(key: str, data: bytes) -> bytes:
    """The trailer anyone can compute: a plain SHA-256 of key and object (the layout before
    objects were signed)."""
    tag = key.encode("ascii")
    return b"\nEINJIT-OBJECT-KEY-SHA256\n" + tag + hashlib.sha256(tag + data).digest()


def test_the_key_is_made_once_and_only_its_owner_can_read_it(tmp_path, monkeypatch):
    path = tmp_path / "config" / "einjit" / "cache.key"
    monkeypatch.setenv("EINJIT_CACHE_KEY", str(path))
    first = cache_secret.secret()
    assert len(first) == 32 and path.read_bytes() == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    cache_secret._secret.cache_clear()
    assert cache_secret.secret() == first
    monkeypatch.setenv("EINJIT_CACHE_KEY", str(tmp_path / "other.key"))
    assert cache_secret.secret() != first


def test_the_default_key_is_in_the_users_config_not_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("EINJIT_CACHE_KEY")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert cache_secret.key_path() == tmp_path / "xdg" / "einjit" / "cache.key"


@pytest.mark.parametrize("damage", ["group-readable", "wrong-length", "symlink"])
def test_a_key_file_others_could_use_is_refused_naming_it(tmp_path, monkeypatch, damage):
    path = tmp_path / "cache.key"
    if damage == "symlink":
        (tmp_path / "real.key").write_bytes(b"k" * 32)
        (tmp_path / "real.key").chmod(0o600)
        path.symlink_to(tmp_path / "real.key")
    else:
        path.write_bytes(b"k" * (32 if damage == "group-readable" else 7))
        path.chmod(0o640 if damage == "group-readable" else 0o600)
    monkeypatch.setenv("EINJIT_CACHE_KEY", str(path))
    with pytest.raises(ConfigError, match="cache.key"):
        cache_secret.secret()


def test_a_record_changed_or_signed_by_another_key_is_refused_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "_warned", threading.Event())
    good, changed, foreign = (tmp_path / f"{name}.rec" for name in ("good", "changed", "foreign"))
    for path in (good, changed):
        cache.store_record("unit", path.stem, path, b'{"a": 1}')
    assert cache.load_record("unit", "good", good) == b'{"a": 1}'
    changed.write_bytes(changed.read_bytes().replace(b"1", b"2", 1))
    foreign.write_bytes(b'{"a": 3}' + _attacker_trailer(monkeypatch, tmp_path, "unit", "foreign", b'{"a": 3}'))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for path in (changed, foreign):
            with pytest.raises(cache.UnsignedRecord):
                cache.load_record("unit", path.stem, path)
    assert [w.category for w in caught] == [cache.CacheTrustWarning]
    with pytest.raises(cache.UnsignedRecord):  # signed, but for another key: not interchangeable
        cache.load_record("unit", "changed", good)


@pytest.mark.parametrize("forge", ["unkeyed", "another_users_key"])
def test_a_planted_shared_object_is_not_loaded_and_the_routine_still_computes(tmp_path, monkeypatch, forge):
    env = {**os.environ, "PYTHONPATH": str(SRC), "EINJIT_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("EINJIT_DEBUG", None)
    first, _ = _victim(env)
    assert first["out"] == [3.25] * 5 and first["gcc"] == 1
    (so,) = (tmp_path / "cache" / "cc").glob("*.so")
    marker = tmp_path / "loaded"
    planted_c = tmp_path / "planted.c"
    planted_c.write_text(_PLANT % marker)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "planted.so"), str(planted_c)], check=True)
    data = (tmp_path / "planted.so").read_bytes()
    trailer = _unkeyed_trailer(so.stem, data) if forge == "unkeyed" else \
        _attacker_trailer(monkeypatch, tmp_path, "cc", so.stem, data)
    so.write_bytes(data + trailer)
    again, stderr = _victim(env)
    assert not marker.exists()
    assert again["out"] == [3.25] * 5 and (again["gcc"], again["rebuilds"], again["hits"]) == (1, 1, 0)
    assert ("CacheTrustWarning" in stderr) == (forge == "another_users_key")
    last, _ = _victim(env)
    assert (last["gcc"], last["hits"]) == (0, 1) and last["out"] == [3.25] * 5
    assert not marker.exists()


@pytest.mark.parametrize("forge", ["unkeyed", "another_users_key"])
def test_a_planted_program_record_is_not_loaded_and_the_step_still_computes(tmp_path, monkeypatch, forge):
    """A record holds the C source a hit compiles and runs: a record someone else wrote must
    be a miss, not code einjit runs."""
    first = run(tmp_path)
    (record,) = (tmp_path / "program").iterdir()
    planted = json.loads(cache.load_record("program", record.stem, record))
    marker = tmp_path / "loaded"
    planted["source"] = _PLANT % marker + planted["source"]
    text = json.dumps(planted).encode()
    record.write_bytes(text if forge == "unkeyed" else
                       text + _attacker_trailer(monkeypatch, tmp_path, "program", record.stem, text))
    again = run(tmp_path)
    assert not marker.exists()
    assert (again["hits"], again["stores"]) == (0, 1) and again["losses"] == first["losses"]
    assert run(tmp_path)["hits"] == 1
