"""`python -m einjit demo gpt`: a short run end to end, and its argument checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from einjit.demos import gpt as demo
from einjit.training import checkpoint

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "einjit", "demo", "gpt", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def test_demo_gpt_json_short_run(tmp_path):
    ckpt = tmp_path / "gpt.safetensors"
    out = _cli("--epochs", "2", "--steps", "4", "--batch-size", "4", "--block-size", "8", "--d-model", "16",
               "--layers", "1", "--sample-chars", "12", "--checkpoint", str(ckpt), "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["steps"] == 8 and result["epochs"] == 2
    assert 0 < result["val_loss"] < np.log(len(demo.ALPHABET)) + 0.5
    assert result["sample"].startswith("The ") and len(result["sample"]) == 4 + 12
    saved = checkpoint.read(ckpt)
    assert saved["wte"].shape == (len(demo.ALPHABET), 16) and "h0.attn.q.w" in saved


def test_data_windows_and_order_are_reproducible():
    ids = demo.encode("hello, world\n\u00e9")
    assert demo.decode(ids) == "hello, world\n?"
    offsets = demo.batch_offsets(len(ids), 4, 3, 2, seed=1)
    np.testing.assert_array_equal(offsets, demo.batch_offsets(len(ids), 4, 3, 2, seed=1))
    x, y = demo.windows(ids, offsets[0], 4)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    assert x.dtype == np.int32 and x.shape == (3, 4)


@pytest.mark.parametrize(("args", "message"), [
    (["--d-model", "6"], "--d-model must be a positive multiple of the 4 heads"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--lr", "-1"], "--lr must be positive"),
    (["--checkpoint", "/nonexistent/x.safetensors"], "the folder /nonexistent does not exist"),
])
def test_demo_gpt_bad_arguments_name_their_flag(tmp_path, args, message):
    out = _cli(*args, cwd=tmp_path)
    assert out.returncode == 2 and message in out.stderr
