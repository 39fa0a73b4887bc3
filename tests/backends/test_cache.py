"""The compiled-object cache: hits and misses, invalid files rebuilt, concurrent builders."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from einjit import backends
from einjit.backends import cache
from einjit.backends.cc import toolchain as cc
from einjit.backends.interface import default_context
from einjit.ir import low_level as ll
from einjit.ir import tnode
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.tnode import Tnode

SRC = Path(__file__).resolve().parents[2] / "src"


def fill(value: float) -> tuple[ll.LLStmt, Tnode]:
    out = Tnode("out", (4,), memory_mode=tnode.hosted())
    i = get_symbol()
    return ll.ForLoop(i, 0, 3, ll.Set(out, (Iterator(i),), ll.Constant(value))), out


def make(counter: list[int], payload: bytes = b"object"):
    def build(out: Path, src: Path, kept: Path) -> None:
        counter.append(1)
        assert src.read_text() == "source text"
        out.write_bytes(payload)
    return build


def get(stats: cache.CacheStats, build, key: str = "k1") -> cache.CompiledObject:
    return cache.get_or_build("unit", [key], suffix=".o", source="source text", source_suffix=".src", build=build,
                              stats=stats, label="unit")


def test_hits_misses_and_trailer():
    stats, runs = cache.CacheStats(), []
    first = get(stats, make(runs))
    assert not first.hit and runs == [1] and stats.compiler_invocations == 1
    second = get(stats, make(runs))
    assert second.hit and second.path == first.path and runs == [1] and stats.cache_hits == 1
    assert cache.read_object(first.path) == b"object"
    assert not [p for p in first.path.parent.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "empty"])
def test_an_invalid_cached_object_is_rebuilt_not_loaded(damage):
    stats, runs = cache.CacheStats(), []
    path = get(stats, make(runs), key=damage).path
    data = path.read_bytes()
    path.write_bytes({"truncate": data[:-5], "corrupt": b"X" + data[1:], "empty": b""}[damage])
    again = get(stats, make(runs), key=damage)
    assert not again.hit and runs == [1, 1] and stats.rebuilds == 1
    assert cache.read_object(again.path) == b"object"
    assert get(stats, make(runs), key=damage).hit


def test_a_failed_build_publishes_nothing_and_keeps_the_source():
    stats = cache.CacheStats()

    def broken(out: Path, src: Path, kept: Path) -> None:
        out.write_bytes(b"half")
        raise RuntimeError(f"compiler said no; source at {kept}")

    with pytest.raises(RuntimeError, match="compiler said no") as info:
        get(stats, broken, key="broken")
    kept = Path(str(info.value).rsplit(" ", 1)[1])
    assert kept.read_text() == "source text"
    assert not kept.with_suffix(".o").exists()
    assert not [p for p in kept.parent.iterdir() if p.name.startswith(".tmp-")]


def test_a_truncated_shared_object_is_rebuilt_and_runs():
    code, _ = fill(6.5)
    proc = cc.compile_proc(code, name="fill_rebuilt")
    so = proc.so_path
    damaged = so.with_name("damaged.tmp")
    damaged.write_bytes(so.read_bytes()[:100])
    os.replace(damaged, so)  # a new file: this process has the old one mapped
    rebuilds, runs = cc.stats.rebuilds, cc.stats.compiler_invocations
    code2, out2 = fill(6.5)
    backend = backends.get("cc")
    backend.link(default_context(backend), backend.compile((), code2, shared=True, name="fill_rebuilt"))()
    assert cc.stats.rebuilds == rebuilds + 1 and cc.stats.compiler_invocations == runs + 1
    np.testing.assert_array_equal(out2.host_array(), [6.5] * 4)


_RACER = textwrap.dedent("""
    import sys
    import numpy as np
    from einjit import backends
    from einjit.backends.cc import toolchain as cc
    from einjit.backends.interface import default_context
    from einjit.ir import low_level as ll, tnode
    from einjit.ir.indexing import Iterator, get_symbol
    out = tnode.Tnode("out", (1000,), memory_mode=tnode.hosted())
    i = get_symbol()
    code = ll.ForLoop(i, 0, 999, ll.Set(out, (Iterator(i),), ll.Constant(float(sys.argv[1]))))
    backend = backends.get("cc")
    backend.link(default_context(backend), backend.compile((), code, shared=True, name="racer"))()
    assert (out.host_array() == float(sys.argv[1])).all()
    print(cc.stats.compiler_invocations, cc.stats.cache_hits)
""")


def test_two_processes_compiling_the_same_program_at_once_both_succeed(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC), "EINJIT_CACHE_DIR": str(tmp_path / "cache")}
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, "3.25"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [r.communicate(timeout=120) for r in racers]
    assert [r.returncode for r in racers] == [0, 0], results
    objects = list((tmp_path / "cache" / "cc").glob("*.so"))
    assert len(objects) == 1 and not list((tmp_path / "cache" / "cc").glob(".tmp-*"))
    after = subprocess.run([sys.executable, "-c", _RACER, "3.25"], env=env, capture_output=True, text=True,
                           timeout=120, check=True)
    assert after.stdout.split() == ["0", "1"]


def test_the_object_handed_out_is_the_one_read_and_checked():
    stats, runs = cache.CacheStats(), []
    assert get(stats, make(runs), key="data").data == b"object"
    assert get(stats, make(runs), key="data").data == b"object" and stats.cache_hits == 1


def test_a_shared_object_replaced_after_its_check_is_not_what_runs(monkeypatch):
    """Time of check, time of use: the file at the cache path is swapped for another valid
    object (trailer and all) right after the cache validated it; what runs is what was checked."""
    other, _ = fill(-9.0)
    forged = cache.read_object(cc.compile_proc(other, name="swapped").so_path)
    checked = cache.get_or_build

    def racing(kind, key_parts, **kw):
        built = checked(kind, key_parts, **kw)
        key = cache.cache_key(*key_parts)
        tmp = built.path.with_name("swap.tmp")
        tmp.write_bytes(forged + cache._trailer(kind, key, forged))
        os.replace(tmp, built.path)
        return built

    monkeypatch.setattr(cache, "get_or_build", racing)
    code, out = fill(7.125)
    backend = backends.get("cc")
    backend.link(default_context(backend), backend.compile((), code, shared=True, name="swapped"))()
    np.testing.assert_array_equal(out.host_array(), [7.125] * 4)
