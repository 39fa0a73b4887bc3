"""The memory report of a step is the same cold and on a program-cache hit: a step compiled
under other virtualization settings (routine-local storage off, as `bench_memory.py` builds
first) must not answer for it, or the hit reports the other program's arrays and classes."""

from __future__ import annotations

import re
from collections import Counter

import pytest

import einjit as ej
from einjit import nn, train
from einjit.backends.cc import program_cache
from einjit.ir import optimize
from einjit.ir.optimize import VirtualizeSettings

pytestmark = pytest.mark.usefixtures("fresh_inference_state")


def _report(monkeypatch, local_storage: bool) -> tuple[Counter, int, int, int]:
    """The MLP step's arrays by (label, class, bytes), ids left out, and its kept, local and
    scratch bytes, compiled with routine-local storage on or off."""
    monkeypatch.setattr(optimize, "virtualize_settings", VirtualizeSettings(local_storage=local_storage))
    model = nn.Sequential(nn.Flatten(label="flat"), nn.Linear(64, 256, label="fc1"), nn.ReLU(),
                          nn.Linear(256, 256, label="fc2"), nn.ReLU(), nn.Linear(256, 10, label="fc3"))
    x = ej.input("images", batch_dims=[64], output_dims=[1, 8, 8])
    y = ej.input("labels", batch_dims=[64], output_dims=[10])
    loss = nn.cross_entropy(model(x), y)
    train.init_params(loss, seed=0)
    report = train.to_routine([train.grad_update(loss), train.sgd_update(loss, 0.1)], name="mem_step").memory
    arrays = Counter((re.sub(r"#\d+", "", name), cls, n) for name, cls, n in report.arrays)
    return arrays, report.kept_bytes, report.local_bytes, report.scratch_bytes


def test_the_same_step_reports_the_same_cold_and_warm(tmp_path, monkeypatch):
    monkeypatch.delenv("EINJIT_PROFILE", raising=False)
    monkeypatch.setenv("EINJIT_CACHE_DIR", str(tmp_path / "cold"))
    cold = _report(monkeypatch, True)
    hits = program_cache.stats.hits
    assert _report(monkeypatch, True) == cold and program_cache.stats.hits == hits + 1
    monkeypatch.setenv("EINJIT_CACHE_DIR", str(tmp_path / "after_off"))
    off = _report(monkeypatch, False)
    assert off[1] > cold[1]  # without local storage the intermediates are kept in the context
    assert _report(monkeypatch, True) == cold
    assert any(cls == "Local_only (scratch)" for _, cls, _ in cold[0])
    assert _report(monkeypatch, False) == off
