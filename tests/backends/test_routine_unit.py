"""The routine's own translation unit of an outlined program (its calls of the nest
functions, memsets and barriers) is compiled without gcc's points-to analysis and dead-store
eliminations, tree and RTL (`CcOptions.routine_unit_flags`), which cost most of its compile
time in deep models and find nothing there; the nest units keep every pass."""

from __future__ import annotations

import numpy as np

from einjit.backends.cc import toolchain as cc
from test_outline import trained


def test_only_the_routine_unit_gets_the_flags_and_the_values_stay_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("EINJIT_CACHE_DIR", str(tmp_path))
    commands: list[list[str]] = []
    original = cc._run
    monkeypatch.setattr(cc, "_run", lambda cmds, *a: commands.extend(cmds) or original(cmds, *a))
    options = cc.CcOptions(threads=1, outline_min_nests=1, jobs=2)
    lean = trained(2, options)
    units = [c for c in commands if "-c" in c]
    assert len(units) == 3  # the routine's unit and two of nests
    flagged = [c for c in units if all(f in c for f in options.routine_unit_flags)]
    assert [c[-1].rsplit("/", 1)[-1] for c in flagged] == ["unit0.c"]
    full = trained(2, cc.CcOptions(threads=1, outline_min_nests=1, jobs=2, routine_unit_flags=()))
    assert full["losses"][-1] < full["losses"][0]
    for name, value in full.items():
        np.testing.assert_array_equal(lean[name], value, err_msg=name)
