"""The nest profiler (`backends/profile.py`): one row per top-level loop nest, positive times,
and the instrumented variant computes the same values as the routine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from einjit import train
from einjit.backends.interface import lower_assignments
from einjit.backends.profile import instrument
from einjit.ir import assignments as asg
from einjit.ir import low_level as ll
from einjit.ir import optimize
from einjit.ir.optimize import VirtualizeSettings
from test_outline import residual_model

HERE = Path(__file__).resolve().parent


def step_of(loss):
    return train.to_routine([train.grad_update(loss), train.sgd_update(loss, 0.1)], name="step")


def params(loss) -> dict[str, np.ndarray]:
    return {p.label_str: p.value_tn.host_array().copy() for p in train._params_of(loss)}


def test_profile_rows_match_the_nests_and_values_are_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("EINJIT_CACHE_DIR", str(tmp_path))
    plain_loss, profiled_loss = residual_model(1), residual_model(1)
    plain, profiled = step_of(plain_loss), step_of(profiled_loss)
    for _ in range(3):
        plain()
    report = profiled.profile(3)
    for name, value in params(plain_loss).items():
        np.testing.assert_array_equal(params(profiled_loss)[name], value, err_msg=name)

    loss = residual_model(1)
    _, lowered = lower_assignments((), asg.sequence(train.grad_update(loss), train.sgd_update(loss, 0.1)), "step")
    nests = [s for s in ll.flatten(lowered.llc) if isinstance(s, ll.ForLoop)]
    rows = report.rows()
    assert report.calls == 3 and len(rows) == len(nests) == len(report.nests)
    assert all(r["seconds"] > 0 for r in rows)
    assert abs(sum(r["share"] for r in rows) - 1.0) < 1e-9
    assert any("wq0.grad" in r["writes"] for r in rows)
    table = str(report)
    assert table.startswith(f"profile of step: {len(nests)} nests") and len(table.splitlines()) == len(nests) + 2
    assert profiled.profile(2).calls == 2


def test_flop_counts_of_a_contraction(monkeypatch):
    # one nest per node: fused, this small model's forward is one loop over its batch of 2
    monkeypatch.setattr(optimize, "virtualize_settings", VirtualizeSettings(fuse=False))
    loss = residual_model(1)
    _, lowered = lower_assignments((), train.grad_update(loss), "step")
    _, _, infos = instrument(lowered.llc, "step")
    # q0 = a @ wq0 over batch 2 x seq 4, 8 -> 2 x 4 features: 2*4*8*8 multiply-adds.
    q = [i for i in infos if i.writes == ("q0",)]
    assert q and max(i.flops for i in q) == 2 * (2 * 4 * 8 * 8)


def test_einjit_profile_env_prints_the_table_at_exit(tmp_path):
    script = ("import sys; sys.path.insert(0, %r)\n"
              "from test_profile import step_of\nfrom test_outline import residual_model\n"
              "r = step_of(residual_model(1)); r(); r()\n" % str(HERE))
    env = {"EINJIT_PROFILE": "1", "EINJIT_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(HERE.parents[1] / "src"),
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "profile of step:" in done.stderr and "over 2 calls" in done.stderr
