"""`elf_needed.needed`: the libraries a compiled program needs, read from its dynamic section,
as the loader (and `readelf -d`) sees them; anything else reads as unknown (None)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from einjit.backends.cc import elf_needed, thread_team
from einjit.backends.cc import toolchain as cc
from test_openmp_threads import options, region_program


def _compiler() -> str:
    compiler = cc.CcOptions().compiler
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler {compiler!r}")
    return compiler


def test_the_needed_libraries_are_read_in_order(tmp_path):
    compiler = _compiler()
    source = tmp_path / "lib.c"
    source.write_text("#include <math.h>\ndouble f(double x) { return sin(x); }\n")
    so = tmp_path / "lib.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-Wl,--no-as-needed", "-o", str(so), str(source), "-lm", "-lpthread"],
                   check=True)
    names = elf_needed.needed(so.read_bytes())
    assert names is not None and names[0] == "libm.so.6" and "libc.so.6" in names
    if shutil.which("readelf"):
        listed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
        assert list(names) == [line.split("[")[1].split("]")[0] for line in listed.splitlines() if "(NEEDED)" in line]


@pytest.mark.parametrize("data", [b"", b"not an object", b"\x7fELF\x02\x01" + bytes(58),
                                  b"\x7fELF\x01\x01" + bytes(200)])
def test_what_is_not_a_readable_64_bit_object_is_unknown(data):
    assert elf_needed.needed(data) is None


def test_a_truncated_object_is_unknown(tmp_path):
    compiler = _compiler()
    source = tmp_path / "lib.c"
    source.write_text("int f(void) { return 1; }\n")
    so = tmp_path / "lib.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(so), str(source)], check=True)
    data = so.read_bytes()
    assert elf_needed.needed(data) is not None
    assert elf_needed.needed(data[:200]) is None


@pytest.mark.parametrize("team", ["einjit", "gomp"])
def test_a_threaded_program_needs_the_team_or_libgomp(monkeypatch, team):
    _compiler()
    monkeypatch.setenv("EINJIT_THREAD_TEAM", team)
    proc = cc.compile_proc(region_program()[0], name="needs_runtime", options=options(2))
    names = elf_needed.needed(proc.so_path.read_bytes())
    assert names is not None
    assert (thread_team.soname() in names, "libgomp.so.1" in names) == (team == "einjit", team == "gomp")
