"""Stable generated code: the same model renders byte-identical code in every process, even
after unrelated tensors shifted every global id, and so hits the compiled-object cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from einjit.ir import optimize
from einjit.ir.passes.tracing import VirtualizeSettings
from test_c_syntax import check_golden

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
STAGES = ("cd", "ll",
          *(f"{s.name}.ll" for s in optimize.STAGES if s.name != "tracing" and s.enabled(VirtualizeSettings())),
          "optimized.ll", "c")
GOLDEN_STAGES = ("cd", "ll", "optimized.ll", "c")


def run_step(cache: Path, dump: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(SRC), "EINJIT_CACHE_DIR": str(cache), "EINJIT_DUMP_DIR": str(dump)}
    env.pop("EINJIT_BACKEND", None)
    done = subprocess.run([sys.executable, str(HERE / "moons_step.py"), *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_fresh_process_after_unrelated_tensors_hits_the_cache_with_identical_code(tmp_path):
    cache, first_dump, second_dump = tmp_path / "cache", tmp_path / "first", tmp_path / "second"
    first = run_step(cache, first_dump)
    second = run_step(cache, second_dump, "unrelated")
    assert (first["compiler_invocations"], first["cache_hits"]) == (1, 0)
    assert (second["compiler_invocations"], second["cache_hits"]) == (0, 1)
    assert second["losses"] == first["losses"] and first["losses"][-1] < first["losses"][0]
    assert sorted(p.name for p in first_dump.iterdir()) == sorted(f"moons_train_step.{s}" for s in STAGES)
    for stage in STAGES:
        name = f"moons_train_step.{stage}"
        text = (first_dump / name).read_text()
        assert (second_dump / name).read_text() == text, f"{name} differs between the processes"
        if stage in GOLDEN_STAGES:
            check_golden(name, text)
