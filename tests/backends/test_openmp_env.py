"""The spin count einjit's OpenMP threads wait with (`openmp_env`): libgomp, loaded with a
program compiled for 2 threads on it, reads `SPIN_COUNT` unless the user set a wait policy, and
the process's environment is as it was afterwards; programs on einjit's thread team load no
libgomp at all. Each case runs in a fresh process (libgomp
reads its settings once per process), with `OMP_DISPLAY_ENV=verbose`: libgomp prints the
settings it took when it loads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from einjit.backends.cc import openmp_env

SRC = Path(__file__).resolve().parents[2] / "src"

_PROGRAM = textwrap.dedent("""
    import os
    import numpy as np
    sets = []
    environ_set = type(os.environ).__setitem__
    def recorded(self, key, value):
        sets.append(key)
        environ_set(self, key, value)
    type(os.environ).__setitem__ = recorded
    from einjit.backends.cc import toolchain as cc
    from einjit.backends.cc.backend import CcBackend
    from einjit.ir import low_level as ll, tnode
    from einjit.ir.indexing import Iterator, get_symbol
    out = tnode.Tnode("out", (64, 1024), memory_mode=tnode.hosted())
    i, j = get_symbol(), get_symbol()
    body = ll.ForLoop(j, 0, 1023, ll.Set(out, (Iterator(i), Iterator(j)), ll.Constant(2.5)))
    code = ll.ForLoop(i, 0, 63, body)
    from dataclasses import replace
    from einjit.backends.c_syntax import C_SYNTAX
    # one small nest: on threads only with the routine threshold off
    backend = CcBackend(cc.CcOptions(threads=2, syntax=replace(C_SYNTAX, thread_routine_min_work=0)))
    ctx = backend.init("spin")
    backend.link(ctx, backend.compile((), code, shared=True, name="spin"))()
    assert (ctx.array(out) == 2.5).all()
    backend.link(ctx, backend.compile((), ll.seq(code, code), shared=True, name="again"))()
    print("environment set:", sets.count("GOMP_SPINCOUNT"))
    print("after:", os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY"))
    with open("/proc/self/maps") as maps:
        print("libgomp loaded:", "libgomp" in maps.read())
""")


def _run(tmp_path: Path, **user: str) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in openmp_env.USER_SETTINGS}
    env.update(user, PYTHONPATH=str(SRC), EINJIT_CACHE_DIR=str(tmp_path / "cache"), OMP_DISPLAY_ENV="verbose")
    done = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_programs_load_with_einjits_spin_count_and_leave_the_environment_as_it_was(tmp_path):
    stdout, stderr = _run(tmp_path, EINJIT_THREAD_TEAM="gomp")
    assert f"GOMP_SPINCOUNT = '{openmp_env.SPIN_COUNT}'" in stderr + stdout
    assert "after: None None" in stdout
    assert "environment set: 1" in stdout  # for libgomp's load only, not again for the second program
    assert "libgomp loaded: True" in stdout


def test_programs_on_einjits_thread_team_leave_libgomp_unloaded(tmp_path):
    """They need no libgomp (gcc links it only as needed), so none is loaded or set up."""
    stdout, stderr = _run(tmp_path)
    assert "libgomp loaded: False" in stdout
    assert "environment set: 0" in stdout
    assert "GOMP_SPINCOUNT" not in stderr + stdout.replace("environment set", "")


@pytest.mark.parametrize("user", [{"GOMP_SPINCOUNT": "7"}, {"OMP_WAIT_POLICY": "passive"}])
def test_a_wait_policy_the_user_set_is_kept(tmp_path, user):
    stdout, stderr = _run(tmp_path, **user)
    [(var, value)] = user.items()
    assert f"after: {value if var == 'GOMP_SPINCOUNT' else None} {value if var == 'OMP_WAIT_POLICY' else None}" \
        in stdout
    assert "environment set: 0" in stdout
    printed = stderr + stdout
    assert f"GOMP_SPINCOUNT = '{openmp_env.SPIN_COUNT}'" not in printed
    if var == "GOMP_SPINCOUNT":
        assert "GOMP_SPINCOUNT = '7'" in printed
    else:
        assert "OMP_WAIT_POLICY = 'PASSIVE'" in printed
