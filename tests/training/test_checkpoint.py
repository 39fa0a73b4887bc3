"""Checkpoints: the safetensors layout, bit-identical resumption across processes, refusals
that leave the model unchanged."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import einjit as ej
from einjit import checkpoint
from mlp_model import build, params_of

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def test_round_trip_keyed_by_labels(tmp_path):
    _, _, loss, lr = build(4, seed=1)
    path = tmp_path / "model.safetensors"
    ej.save([*loss.params(), lr], path, metadata={"epoch": "3"})
    saved = params_of(loss)
    _, _, loss2, lr2 = build(4, seed=2)
    lr2.set_values(0.5)
    ej.load([*loss2.params(), lr2], path)
    for name, value in params_of(loss2).items():
        np.testing.assert_array_equal(value, saved[name])
    assert lr2.numpy()[0] == 0.1
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    header = json.loads(path.read_bytes()[8:8 + n])
    assert header["__metadata__"] == {"epoch": "3"}
    assert header["w1"]["dtype"] == "F64" and header["w1"]["shape"] == [8, 2]
    assert not [p for p in os.listdir(tmp_path) if p != "model.safetensors"], "no temporary files left"


def test_compatible_with_the_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    _, _, loss, _ = build(4, seed=1)
    ej.save(loss, tmp_path / "ours.safetensors")
    theirs = st.load_file(str(tmp_path / "ours.safetensors"))
    for name, value in params_of(loss).items():
        np.testing.assert_array_equal(theirs[name], value)
    st.save_file({k: v * 2 for k, v in theirs.items()}, str(tmp_path / "theirs.safetensors"))
    ej.load(loss, tmp_path / "theirs.safetensors")
    for name, value in params_of(loss).items():
        np.testing.assert_array_equal(value, theirs[name] * 2)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_save_load_new_process_continue_is_bit_identical(tmp_path, momentum):
    path = os.pathsep.join([str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}

    def script(*args):
        subprocess.run([sys.executable, str(HERE / "resume_run.py"), *map(str, args)], check=True, env=env,
                       capture_output=True, text=True, timeout=300)

    script(0, 4, momentum, tmp_path / "straight.safetensors")
    script(0, 2, momentum, tmp_path / "half.safetensors")
    script(2, 2, momentum, tmp_path / "resumed.safetensors", tmp_path / "half.safetensors")
    straight = checkpoint.read(tmp_path / "straight.safetensors")
    resumed = checkpoint.read(tmp_path / "resumed.safetensors")
    half = checkpoint.read(tmp_path / "half.safetensors")
    names = ["b1", "b2", "lr", "w1", "w2"]
    if momentum:
        names += [f"{p}.momentum" for p in ("b1", "b2", "w1", "w2")]
        assert np.abs(half["w1.momentum"]).max() > 0
    assert sorted(straight) == sorted(names)
    for name in straight:
        assert straight[name].tobytes() == resumed[name].tobytes(), name
    assert not np.array_equal(straight["w1"], half["w1"])


def _expect_refusal(loss, path, pattern):
    before = params_of(loss)
    with pytest.raises(ej.CheckpointError, match=pattern):
        ej.load(loss, path)
    for name, value in params_of(loss).items():
        assert value.tobytes() == before[name].tobytes(), f"{name} changed by a refused load"


def test_mismatched_checkpoints_are_refused_listing_every_difference(tmp_path):
    _, _, loss, _ = build(4, seed=1)
    path = tmp_path / "m.safetensors"
    values = params_of(loss)
    values["w1"] = np.zeros((8, 3))
    values["b2"] = values["b2"].astype(np.float32)
    values["extra"] = np.zeros(2)
    del values["b1"]
    checkpoint_tensors = {k: ej.ndarray(v, label=k) for k, v in values.items()}
    ej.save(checkpoint_tensors, path)
    _expect_refusal(loss, path, r"(?s)nothing was loaded.*missing from the file: 'b1'.*not in the model: 'extra'"
                                r".*'b2': dtype float64 in the model, float32.*'w1': dims \(8, 2\) in the model, "
                                r"\(8, 3\)")


@pytest.mark.parametrize("damage,pattern", [
    (lambda b: b[:len(b) - 5], "corrupted.*needs .* bytes"),
    (lambda b: b[:6], "not a safetensors checkpoint"),
    (lambda b: struct.pack("<Q", 10 ** 9) + b[8:], "header length"),
    (lambda b: b[:8] + b"}" + b[9:], "not JSON"),
    (lambda b: b + b"\0" * 8, "not one contiguous block"),
])
def test_corrupted_checkpoints_are_refused(tmp_path, damage, pattern):
    _, _, loss, _ = build(4, seed=1)
    path = tmp_path / "c.safetensors"
    ej.save(loss, path)
    path.write_bytes(damage(path.read_bytes()))
    _, _, other, _ = build(4, seed=2)
    _expect_refusal(other, path, pattern)


def test_duplicate_labels_are_refused_at_save(tmp_path):
    a, b = ej.param("same", values=[1.0]), ej.param(["same"], values=[2.0])
    with pytest.raises(ej.CheckpointError, match="'same'.*distinct labels"):
        ej.save([a, b], tmp_path / "d.safetensors")


def test_load_writes_into_the_contexts_already_holding_the_parameters(tmp_path):
    from einjit import backends, fit, train
    from mlp_model import dataset
    xs, ys = dataset(64)
    _, inputs, loss, lr = build(32, seed=1)
    step = fit.train_step(loss, train.sgd_update(loss, lr), inputs=inputs, context=backends.get("cc").init("ck"))
    step(xs[:32], ys[:32])
    path = tmp_path / "p.safetensors"
    ej.save(loss, path)
    saved = params_of(loss)
    step(xs[32:], ys[32:])
    assert not np.array_equal(params_of(loss)["w1"], saved["w1"])
    ej.load(loss, path)
    for name, value in params_of(loss).items():
        assert value.tobytes() == saved[name].tobytes(), name
    lr.set_values(0.0)
    step(xs[32:], ys[32:])
    for name, value in params_of(loss).items():
        assert value.tobytes() == saved[name].tobytes(), name
