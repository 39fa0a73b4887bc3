"""The README's real-data section runs as printed and reaches a useful accuracy."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_real_data_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Real data"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    match = re.search(r"loss (\S+)  test accuracy (\S+)  score (\S+)", out.stdout)
    assert match, out.stdout
    assert float(match.group(1)) < 0.3 and float(match.group(2)) >= 0.85
    assert (tmp_path / "moons.safetensors").exists()
