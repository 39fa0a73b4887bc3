"""Shape inference does work linear in the size of the graph: adding an operation costs what
the operation adds, not a copy of everything under inference (10,000 operations once took
690 s). Work is counted, not timed: calls into the shape modules and entries of states
copied."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import einjit as ej
from einjit import shape as sh
from einjit.errors import EinjitError
from einjit.shape import inference


def build_and_close(n: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """Build a residual chain of `n` blocks and close inference; the calls made into
    `einjit.shape` while doing so, and the entries of inference states copied."""
    copied = [0]
    original = inference.InferenceState.copy

    def counting_copy(self: inference.InferenceState) -> inference.InferenceState:
        copied[0] += len(self.shapes) + len(self.items) + len(self.env.dims) + len(self.env.rows)
        return original(self)

    monkeypatch.setattr(inference.InferenceState, "copy", counting_copy)
    calls = [0]

    def profile(frame, event, _arg):  # noqa: ANN001  # sys.setprofile's signature
        if event == "call" and "einjit/shape/" in frame.f_code.co_filename.replace("\\", "/"):
            calls[0] += 1

    x = ej.ndarray(np.ones((2, 8), np.float32), batch_axes=1, label="x")
    sys.setprofile(profile)
    try:
        h = x
        for _ in range(n):
            h = ej.relu(h) + x
        sh.finish_inference()
    finally:
        sys.setprofile(None)
    assert h.value_tn.dims == (2, 8)
    return calls[0], copied[0]


def test_a_graph_four_times_larger_does_at_most_five_times_the_work(monkeypatch):
    small_calls, small_copied = build_and_close(30, monkeypatch)
    large_calls, large_copied = build_and_close(120, monkeypatch)
    assert large_calls <= 5 * small_calls, (small_calls, large_calls)
    # One copy of the state, when closing it: none per operation.
    assert large_copied <= 5 * small_copied, (small_copied, large_copied)


def test_building_copies_no_state(monkeypatch):
    copies = []
    monkeypatch.setattr(inference.InferenceState, "copy", lambda self: copies.append(1))
    x = ej.ndarray(np.ones((2, 3), np.float32), batch_axes=1, label="x")
    for _ in range(5):
        x = ej.relu(x) + 1.0
    assert copies == []


def test_a_failing_operation_leaves_inference_as_it_was():
    """Applied in place, a failing operation leaves a half-solved state: it is rebuilt from the
    operations before it, which then close as if the failing one had never been added."""
    a = ej.ndarray(np.ones((2, 3), np.float32), batch_axes=1, label="a")
    w = ej.param("w", output_dims=[4])
    h = w @ a
    with pytest.raises(EinjitError):
        _ = h + ej.ndarray(np.ones((2, 5), np.float32), batch_axes=1)
    y = ej.relu(h)
    sh.finish_inference()
    assert h.value_tn.dims == y.value_tn.dims == (2, 4)
    assert w.value_tn.dims == (4, 3)
