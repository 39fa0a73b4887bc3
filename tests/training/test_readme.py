"""Every Python block of the README runs as printed, each in a fresh interpreter (imports
included), so the README cannot rot; the real-data section also reaches a useful accuracy.
A block that imports an optional package which is not installed is skipped, naming it; the
Transformers section's blocks run in `tests/models/test_readme_gpt.py`, which also checks
what they print."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "README.md").read_text()
_GPT = TEXT[TEXT.index("## Transformers"):TEXT.index("## ", TEXT.index("## Transformers") + 3)]
BLOCKS = [b for b in re.findall(r"```python\n(.*?)```", TEXT, re.DOTALL) if b not in _GPT]


def _missing_imports(code: str) -> list[str]:
    roots = re.findall(r"^(?:from|import) (\w+)", code, re.MULTILINE)
    return sorted({r for r in roots if importlib.util.find_spec(r) is None})


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_every_readme_block_runs_as_printed(tmp_path, index):
    missing = _missing_imports(BLOCKS[index])
    if missing:
        pytest.skip(f"README block {index + 1} imports {', '.join(missing)}, not installed")
    out = _run(BLOCKS[index], tmp_path)
    assert out.returncode == 0, f"README Python block {index + 1}:\n{BLOCKS[index]}\n{out.stderr}"


def test_readme_real_data_example_reaches_its_accuracy(tmp_path):
    section = TEXT[TEXT.index("## Real data"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert "nn.clip_grad_norm" in code and "schedules." in code and "fit.fit" in code
    out = _run(code, tmp_path)
    assert out.returncode == 0, out.stderr
    match = re.search(r"loss (\S+)  test accuracy (\S+)  score (\S+)", out.stdout)
    assert match, out.stdout
    assert float(match.group(1)) < 0.3 and float(match.group(2)) >= 0.85
    assert (tmp_path / "moons.safetensors").exists()
