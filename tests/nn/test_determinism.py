"""The same model, built in two fresh processes, renders to byte-identical C — dropout's
in-graph random numbers and BatchNorm's running statistics included."""

from __future__ import annotations

import os
import subprocess
import sys

_PROGRAM = """
import numpy as np
import einjit as ej
from einjit import nn, train
from einjit.backends import c_syntax
from einjit.backends.interface import lower_assignments
from einjit.ir import assignments as asg
model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, label="conv1"), nn.BatchNorm(4, label="bn"), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Dropout(0.2, seed=3), nn.Linear(64, 10, label="fc"))
x = ej.input("x", batch_dims=[8], output_dims=[1, 8, 8])
y = ej.input("y", batch_dims=[8], output_dims=[10])
loss = nn.cross_entropy(model(x), y)
opt = nn.Adam(loss, 0.01)
_, optimized = lower_assignments((), asg.sequence(train.grad_update(loss), opt.update()), "det")
print(c_syntax.render_program([("det", optimized.llc)]).source)
"""


def _render() -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, ["src", os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, env=env, check=True)
    return out.stdout


def test_generated_c_is_byte_identical_across_processes():
    first, second = _render(), _render()
    assert "einjit_uniform01(" in first and "bn_running_var" in first
    assert first == second
