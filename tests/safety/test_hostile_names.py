"""User text in labels and routine names never becomes C code or a path outside its directory;
cached objects run only under the key they were stored with; an unusable cache directory is
an einjit error naming it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import einjit as ej
from einjit import config, train
from einjit.backends import cache
from einjit.backends.c_syntax import _comment
from einjit.backends.cc import toolchain
from einjit.ir.c_names import MAX_NAME, routine_name

SRC = Path(__file__).resolve().parents[2] / "src"

PAYLOAD = "abort(); exit(3);"
HOSTILE = {
    "comment end": f"*/ {PAYLOAD} /*",
    "splice with CR": f"*\\\r/ {PAYLOAD} /*",
    "backslash-newline": f"x *\\\n/ {PAYLOAD}",
    "trigraph": f"??/\n{PAYLOAD}",
    "NUL": f"a\0*/ {PAYLOAD}",
    "newline": f"line\n{PAYLOAD}",
    "parent dir": f"../../{PAYLOAD}",
    "long": "x" * 300 + f"*/ {PAYLOAD}",
    "non-ASCII": f"ñandú λ→ {PAYLOAD} ✓",
}


def code_without_comments(source: str, tmp_path: Path) -> str:
    """What gcc compiles of `source` once comments are gone (its own preprocessor decides)."""
    path = tmp_path / "probe.c"
    path.write_text(source, encoding="utf-8")
    out = subprocess.run(["gcc", "-fpreprocessed", "-dD", "-E", "-P", "-trigraphs", str(path)],
                         capture_output=True, text=True, check=True)
    return out.stdout


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_labels_and_routine_names_compile_run_right_and_inject_nothing(kind, tmp_path, monkeypatch):
    label = HOSTILE[kind]
    dumps = tmp_path / "dumps" / "inner"
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(dumps))
    with ej.default_precision("double"):
        x = ej.param(label, values=[1.0, -2.0, 3.0])
        y = ej.relu(x * 2.0 - 1.0, label=label)
        z = ej.sum(y, label=label + " sum")
    train.init_params(z)
    routine = train.to_routine(train.forward(z), name=label)
    routine()
    np.testing.assert_array_equal(z.value.numpy(), [1.0 + 5.0])
    assert routine.name == routine_name(label) != label
    assert routine.name.isidentifier() and routine.name.isascii() and len(routine.name) <= MAX_NAME
    written = sorted(p for p in (tmp_path / "dumps").rglob("*") if p.is_file())
    assert written and all(p.parent == dumps for p in written), written
    assert all(len(p.name) < 128 for p in written)
    [source_file] = [p for p in written if p.suffix == ".c"]
    source = source_file.read_text(encoding="utf-8")
    assert source.isascii() and "\0" not in source and "\r" not in source and "\\\n" not in source
    compiled = code_without_comments(source, tmp_path)
    assert not re.search(r"\b(abort|exit)\s*\(", compiled), compiled


def test_comments_keep_to_printable_ascii_and_stay_closed():
    assert _comment("forward loss") == "/* forward loss */"
    assert _comment("a */ b") == "/* a * / b */"
    assert _comment("*\\\r/ x") == "/* *? / x */"
    assert _comment("??/\nx") == "/* ? ?/ x */"
    assert _comment("???=") == "/* ? ? ?= */"
    assert _comment("nul\0é") == "/* nul?? */".replace("??", "? ?")
    assert _comment("a/*b") == "/* a/ *b */"


def test_routine_names_become_distinct_identifiers_and_dump_names_stay_in_their_directory():
    assert routine_name("train_step") == "train_step"
    assert routine_name("../escaped").startswith("escaped_h")
    assert routine_name("a-b") != routine_name("a_b") == "a_b"
    assert routine_name("é") != routine_name("ü")
    assert routine_name("9lives").startswith("routine_9lives_h")
    assert len(routine_name("y" * 1000)) <= MAX_NAME
    for name in ["../x", "/etc/passwd", "..", "a/../../b", "x\0y", "z" * 400]:
        stem = config.file_stem(name)
        assert "/" not in stem and "\0" not in stem and stem not in ("", ".", "..") and len(stem) <= 100
    assert config.file_stem("forward_s") == "forward_s"


def test_an_unusable_cache_or_dump_directory_is_an_error_naming_it(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("EINJIT_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(config.ConfigError, match=r"a_file/cache.*EINJIT_CACHE_DIR"):
        toolchain.compile_source("void f(void) {}\n", label="probe")
    monkeypatch.setenv("EINJIT_CACHE_DIR", str(blocker))
    with pytest.raises(config.ConfigError, match=r"a_file.*EINJIT_CACHE_DIR"):
        toolchain.compile_source("void f(void) {}\n", label="probe")
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        monkeypatch.setenv("EINJIT_CACHE_DIR", str(locked))
        with pytest.raises(config.ConfigError, match=r"locked.*not writable"):
            toolchain.compile_source("void f(void) {}\n", label="probe")
    monkeypatch.setenv("EINJIT_CACHE_DIR", str(tmp_path / "fine"))
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(blocker))
    with pytest.raises(config.ConfigError, match=r"a_file.*EINJIT_DUMP_DIR"):
        config.dump("r", "", "c", "text")


def test_a_cached_object_answers_only_to_its_own_key(tmp_path):
    stats, runs = cache.CacheStats(), []

    def build(payload: bytes):
        def run(out: Path, src: Path, kept: Path) -> None:
            runs.append(payload)
            out.write_bytes(payload)
        return run

    def get(key: str, payload: bytes) -> cache.CompiledObject:
        return cache.get_or_build("unit-key", [key], suffix=".o", source="s", source_suffix=".src",
                                  build=build(payload), stats=stats, label=key)

    first, other = get("one", b"first"), get("two", b"second")
    shutil.copyfile(other.path, first.path)  # a complete, valid object, stored under another key
    again = get("one", b"first")
    assert not again.hit and stats.rebuilds == 1 and runs == [b"first", b"second", b"first"]
    assert cache.read_object(again.path) == b"first"


_SWAPPED = textwrap.dedent("""
    import sys
    import numpy as np
    from einjit import backends
    from einjit.backends.interface import default_context
    from einjit.backends.cc import toolchain
    from einjit.ir import low_level as ll, tnode
    from einjit.ir.indexing import Iterator, get_symbol
    out = tnode.Tnode("out", (4,), memory_mode=tnode.hosted())
    i = get_symbol()
    code = ll.ForLoop(i, 0, 3, ll.Set(out, (Iterator(i),), ll.Constant(float(sys.argv[1]))))
    backend = backends.get("cc")
    backend.link(default_context(backend), backend.compile((), code, shared=True, name="fill"))()
    print(out.host_array().tolist(), toolchain.stats.rebuilds, backend.compile((), code, shared=True,
          name="fill").procedure.procedure.so_path)
""")


def test_a_shared_object_replaced_by_another_valid_one_is_rebuilt_not_run(tmp_path):
    env = {**os.environ, "EINJIT_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(SRC)}
    env.pop("EINJIT_DUMP_DIR", None)

    def run(value: str) -> tuple[list[float], int, Path]:
        out = subprocess.run([sys.executable, "-c", _SWAPPED, value], capture_output=True, text=True, env=env,
                             check=True, timeout=300).stdout.split()
        values, rebuilds, path = " ".join(out[:-2]), int(out[-2]), Path(out[-1])
        return [float(v) for v in values.strip("[]").split(",")], rebuilds, path

    seven, _, seven_path = run("7.0")
    nine, _, nine_path = run("9.0")
    assert seven == [7.0] * 4 and nine == [9.0] * 4 and seven_path != nine_path
    shutil.copyfile(nine_path, seven_path)  # the object of another program, trailer and all
    again, rebuilds, path = run("7.0")
    assert again == [7.0] * 4 and rebuilds == 1 and path == seven_path
