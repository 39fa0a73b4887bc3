"""The README's Deploy section runs as printed (every Python block, in a fresh process)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="the Deploy section builds with make")
def test_readme_deploy_blocks_run(tmp_path):
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Deploy"):text.index("## The pieces")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    for code in blocks:
        out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
    assert (tmp_path / "digits_c" / "libdigits.a").exists()
