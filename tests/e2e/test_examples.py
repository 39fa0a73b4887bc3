"""The examples a newcomer runs first keep working and print what they promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(name: str) -> str:
    out = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_micrograd_example_prints_the_known_values():
    text = run("micrograd.py")
    assert "g = 24.7041" in text and "dg/da = 138.8338" in text and "dg/db = 645.5773" in text


def test_shapes_example():
    text = run("shapes_and_einsum.py")
    assert "y: 8|3   w: 5->3" in text
    assert "strided convolution: [-2. -2. -2. -2. -2.]" in text


def test_atl_example():
    pytest.importorskip("halide", reason="the example also runs Halide when it is installed")
    lines = run("atl_matvec.py").splitlines()
    assert lines[0] == "interpreter: [34.  13.3 46. ]"
    assert all(line.endswith("[34.  13.3 46. ]") for line in lines[1:])
