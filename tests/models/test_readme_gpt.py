"""The README's transformer section runs as printed."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Transformers"):text.index("## The pieces")]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def _run(code: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_readme_gpt_trains_and_generates(tmp_path):
    out = _run(_blocks()[0], tmp_path)
    loss = float(re.search(r"loss after 60 steps (\S+)", out).group(1))
    assert loss < 3.5  # from ln(96) = 4.56 at the start
    sample = out.splitlines()[-1]
    assert sample.startswith("The ") and len(sample) >= 4


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_readme_gpt2_loading_runs(tmp_path):
    out = _run(_blocks()[1], tmp_path)
    ids = [int(v) for v in re.findall(r"\d+", out)]
    assert ids[:3] == [464, 3290, 318] and len(ids) == 11 and max(ids) < 4000
