"""Complete, all-or-nothing checkpoints: buffers and optimizer state saved with the
parameters, resumption across processes bit for bit, refusals that change nothing, I/O
failures as `CheckpointError`s that leave the old file intact, hostile files refused cheaply."""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import einjit as ej
from einjit import checkpoint, nn, train
from einjit.training.checkpoint import CheckpointError
from mlp_model import build

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def _script(*args) -> None:
    path = os.pathsep.join([str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, str(HERE / "state_run.py"), *map(str, args)],
                         env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_batchnorm_model_and_adam_resume_bit_for_bit_in_new_processes(tmp_path):
    _script("train", 0, 4, tmp_path / "straight.safetensors", tmp_path / "straight.npy")
    _script("train", 0, 2, tmp_path / "half.safetensors", tmp_path / "half.npy")
    _script("train", 2, 2, tmp_path / "resumed.safetensors", tmp_path / "resumed.npy", tmp_path / "half.safetensors")
    _script("predict", tmp_path / "straight.safetensors", tmp_path / "fresh.npy")
    straight = checkpoint.read(tmp_path / "straight.safetensors")
    half = checkpoint.read(tmp_path / "half.safetensors")
    resumed = checkpoint.read(tmp_path / "resumed.safetensors")
    assert {"bn.running_mean", "bn.running_var", "drop.uniform.counter", "adam.lr", "adam.schedule_step",
            "adam.step", "adam.fc1.w.adam_m", "adam.fc1.w.adam_v"} <= set(straight)
    assert np.abs(straight["bn.running_var"] - 1).max() > 0.1, "the running statistics moved"
    assert straight["adam.schedule_step"][0] == 40 and half["adam.schedule_step"][0] == 20
    assert straight["adam.step"][0] == 40
    assert sorted(straight) == sorted(resumed)
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)
        assert not np.array_equal(half[name], straight[name]), f"{name} changed in the second half"
    expected = np.load(tmp_path / "straight.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "fresh.npy"), expected)
    np.testing.assert_array_equal(np.load(tmp_path / "resumed.npy"), expected)


def _bn_model():
    model = nn.Sequential(nn.Linear(2, 4, label="l1"), nn.BatchNorm(4, label="norm"), nn.Linear(4, 1, label="l2"))
    x = ej.input("bx", batch_dims=[8], output_dims=[2])
    loss = ej.mean(model(x) * model(x), label="bn_loss")
    train.init_params(loss, seed=3)
    return model, loss


def test_a_loss_and_a_layer_save_parameters_and_buffers(tmp_path):
    model, loss = _bn_model()
    model.layers[1].running_mean.set_values([1.0, 2.0, 3.0, 4.0])
    ej.save(loss, tmp_path / "loss.safetensors")
    ej.save(model, tmp_path / "model.safetensors")
    from_loss = checkpoint.read(tmp_path / "loss.safetensors")
    from_model = checkpoint.read(tmp_path / "model.safetensors")
    assert sorted(from_loss) == sorted(from_model) == sorted(
        ["l1.w", "l1.b", "l2.w", "l2.b", "norm.gamma", "norm.beta", "norm.running_mean", "norm.running_var"])
    np.testing.assert_array_equal(from_model["norm.running_mean"], [1.0, 2.0, 3.0, 4.0])


def _values(tensors) -> dict[str, np.ndarray]:
    return {t.label_str: t.numpy() for t in tensors}


def test_a_refused_load_changes_nothing(tmp_path):
    _, _, loss, lr = build(4, seed=1)
    const = ej.ndarray([5.0], label="const")
    path = tmp_path / "bad.safetensors"
    ej.save({**{p.label_str: p for p in loss.params()}, "lr": lr, "const": ej.scalar(7.0, label="c7")}, path)
    saved = checkpoint.read(path)
    _, _, loss2, lr2 = build(4, seed=2)
    targets = {**{p.label_str: p for p in loss2.params()}, "lr": lr2, "const": const}
    before = _values([*targets.values()])
    assert any(not np.array_equal(before[k], saved[k]) for k in ("w1", "b1", "w2", "b2")), "the load would change"
    with pytest.raises(CheckpointError, match=r"'const'.*constant.*nothing was loaded|nothing was loaded"
                                              r"(.|\n)*'const'.*constant"):
        ej.load(targets, path)
    after = _values([*targets.values()])
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_a_refused_optimizer_load_changes_nothing(tmp_path):
    model, loss = _bn_model()
    opt = nn.SGD(loss, 0.1, momentum=0.9)
    ej.save(loss, tmp_path / "model_only.safetensors")
    before = _values([*checkpoint.state_of(loss).values(), *opt.state_tensors().values()])
    with pytest.raises(CheckpointError, match=r"missing from the file: 'sgd.lr'"):
        ej.load(loss, tmp_path / "model_only.safetensors", optimizer=opt)
    after = _values([*checkpoint.state_of(loss).values(), *opt.state_tensors().values()])
    assert sorted(before) == sorted(after)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_the_reserved_metadata_name_is_refused(tmp_path):
    p = ej.param("__metadata__", values=[1.0, 2.0])
    with pytest.raises(CheckpointError, match=r"__metadata__.*reserves"):
        ej.save([p], tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match=r"__metadata__.*reserves"):
        ej.save({"__metadata__": ej.param("q", values=[1.0])}, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match=r"__metadata__.*reserves"):
        ej.load([p], tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()


# ------------------------------------------------------------------ I/O failures


def _saved_model(tmp_path):
    _, _, loss, _ = build(4, seed=1)
    path = tmp_path / "model.safetensors"
    ej.save(loss, path)
    return loss, path, path.read_bytes()


def _only(tmp_path, name: str) -> None:
    assert sorted(os.listdir(tmp_path)) == [name], "no temporary file left behind"


def test_a_full_disk_is_a_checkpoint_error_and_the_old_file_stays(tmp_path, monkeypatch):
    loss, path, old = _saved_model(tmp_path)
    for p in loss.params():
        p.set_values(p.numpy() + 1)

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint.os, "fsync", full)
    with pytest.raises(CheckpointError, match=rf"cannot write checkpoint {path}: No space left on device"):
        ej.save(loss, path)
    assert path.read_bytes() == old
    _only(tmp_path, "model.safetensors")


def test_a_directory_not_writable_is_a_checkpoint_error(tmp_path, monkeypatch):
    loss, path, old = _saved_model(tmp_path)
    if os.geteuid() == 0:  # root writes into read-only directories: the refusal is simulated
        def denied(**kwargs):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

        monkeypatch.setattr(checkpoint.tempfile, "mkstemp", denied)
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(CheckpointError, match=rf"cannot write checkpoint {path}: Permission denied"):
            ej.save(loss, path)
    finally:
        tmp_path.chmod(0o755)
    assert path.read_bytes() == old
    _only(tmp_path, "model.safetensors")


def test_a_missing_directory_a_directory_at_the_path_and_a_long_name(tmp_path):
    _, _, loss, _ = build(4, seed=1)
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*nowhere.*No such file or directory"):
        ej.save(loss, tmp_path / "nowhere" / "m.safetensors")
    (tmp_path / "dir.safetensors").mkdir()
    (tmp_path / "dir.safetensors" / "keep").write_text("x")
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*dir.safetensors: (Is a directory|"
                                              r"Directory not empty)"):
        ej.save(loss, tmp_path / "dir.safetensors")
    assert (tmp_path / "dir.safetensors" / "keep").read_text() == "x"
    long = tmp_path / ("x" * 300 + ".safetensors")
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*xxxx.*File name too long"):
        ej.save(loss, long)
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint .*File name too long"):
        ej.load(loss, long)
    with pytest.raises(CheckpointError,
                       match=r"cannot read checkpoint .*dir.safetensors: (not a regular file|Is a directory)"):
        ej.load(loss, tmp_path / "dir.safetensors")
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint .*absent.*No such file"):
        ej.load(loss, tmp_path / "absent.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["dir.safetensors"]


def test_endless_files_are_refused_without_reading_them(tmp_path):
    _, _, loss, _ = build(4, seed=1)
    for endless in ("/dev/zero", "/dev/urandom"):
        if os.path.exists(endless):
            with pytest.raises(CheckpointError, match=rf"cannot read checkpoint {endless}: not a regular file"):
                ej.load(loss, endless)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer, so opening it for reading does not block
    try:
        with pytest.raises(CheckpointError, match=r"not a regular file"):
            ej.load(loss, fifo)
    finally:
        os.close(fd)


def _file(tmp_path, header: dict, data: bytes = b"", length: int | None = None) -> Path:
    text = json.dumps(header).encode()
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


@pytest.mark.parametrize("header,data,length,message", [
    ({"w": {"dtype": "F64", "shape": [2 ** 62, 2 ** 62], "data_offsets": [0, 16]}}, b"\0" * 16, None,
     r"needs \d+ bytes at 0..16 of 16"),
    ({"w": {"dtype": "F64", "shape": [-1, 2], "data_offsets": [0, 16]}}, b"\0" * 16, None, r"malformed"),
    ({"w": {"dtype": "F64", "shape": [1e300], "data_offsets": [0, 8]}}, b"\0" * 8, None, r"malformed"),
    ({"w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 2 ** 70]}}, b"\0" * 16, None, r"needs 16 bytes"),
    ({"w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 16, 2 ** 63, r"header length"),
    ({"w": {"dtype": "X99", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 16, None, r"unsupported dtype"),
    ({"w": "not an entry"}, b"", None, r"malformed"),
    ({"w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 8, None, r"needs 16 bytes"),
])
def test_absurd_headers_are_refused_before_allocating(tmp_path, header, data, length, message):
    path = _file(tmp_path, header, data, length)
    with pytest.raises(CheckpointError, match=message):
        checkpoint.read(path)
    w = ej.param("w", values=[1.0, 2.0])
    with pytest.raises(CheckpointError):
        ej.load([w], path)
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])


def test_a_deeply_nested_header_is_a_checkpoint_error(tmp_path):
    text = b"[" * 100_000 + b"]" * 100_000
    path = tmp_path / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text)
    with pytest.raises(CheckpointError, match="not JSON|not a JSON object"):
        checkpoint.read(path)


def test_the_optimizer_round_trips_in_process(tmp_path):
    model, loss = _bn_model()
    opt = nn.Adam(loss, nn.schedules.cosine(0.1, 10))
    for _ in range(3):
        opt.step()
    opt.state_tensors()["adam.l1.w.adam_m"].set_values(np.full((4, 2), 0.25))
    ej.save(model, tmp_path / "s.safetensors", optimizer=opt)
    opt2 = nn.Adam(loss, nn.schedules.cosine(0.1, 10))
    opt2._moments.clear()  # a fresh optimizer of another graph: same names, its own tensors
    opt2._code = None
    ej.load(model, tmp_path / "s.safetensors", optimizer=opt2)
    assert opt2.steps == 3 and opt2.lr.numpy()[0] == opt.lr.numpy()[0] == nn.schedules.cosine(0.1, 10)(2)
    np.testing.assert_array_equal(opt2.state_tensors()["adam.l1.w.adam_m"].numpy(), np.full((4, 2), 0.25))


@pytest.mark.parametrize("bad", ["with\0nul.safetensors", 42, None])
def test_a_path_that_is_no_path_is_a_checkpoint_error(tmp_path, bad):
    _, _, loss, _ = build(4, seed=1)
    with pytest.raises(CheckpointError, match=r"NUL byte|a checkpoint path is a str"):
        ej.save(loss, bad)
    with pytest.raises(CheckpointError, match=r"NUL byte|a checkpoint path is a str"):
        ej.load(loss, bad)


def test_a_checkpoint_saved_with_its_optimizer_loads_into_the_model_alone(tmp_path):
    """As `model.load_state_dict(ckpt["model"])` in PyTorch: the model's values load, the
    optimizer state is returned (not loaded anywhere), and a wholly unknown entry is still refused."""
    model, loss = _bn_model()
    opt = nn.Adam(loss, 0.1)
    opt.step()
    saved = _values(checkpoint.state_of(loss).values())
    ej.save(model, tmp_path / "s.safetensors", optimizer=opt)
    fresh, fresh_loss = _bn_model()
    for t in checkpoint.state_of(fresh_loss).values():
        t.set_values(np.zeros(t.dims))
    rest = ej.load(fresh, tmp_path / "s.safetensors")
    for name, value in _values(checkpoint.state_of(fresh_loss).values()).items():
        np.testing.assert_array_equal(value, saved[name], err_msg=name)
    assert sorted(rest) == sorted(opt.state_tensors()) and rest["adam.schedule_step"][0] == 1
    for name, t in opt.state_tensors().items():
        np.testing.assert_array_equal(rest[name], t.numpy(), err_msg=name)
    assert ej.load(fresh, tmp_path / "s.safetensors", optimizer=nn.Adam(fresh_loss, 0.1)) == {}
    arrays = checkpoint.read(tmp_path / "s.safetensors")
    checkpoint.write({**arrays, "stranger": np.zeros(2)}, tmp_path / "odd.safetensors")
    with pytest.raises(CheckpointError, match=r"in the file but not in the model: 'adam.lr'"):
        ej.load(fresh, tmp_path / "odd.safetensors")
    with pytest.raises(CheckpointError, match="einjit.optimizer_state.*einjit's own"):
        ej.save(model, tmp_path / "m.safetensors", optimizer=opt, metadata={"einjit.optimizer_state": "[]"})


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_a_checkpoint_file_has_the_mode_a_plain_file_gets(tmp_path, umask):
    _, _, loss, _ = build(4, seed=1)
    old = os.umask(umask)
    try:
        ej.save(loss, tmp_path / "new.safetensors")
    finally:
        os.umask(old)
    assert (tmp_path / "new.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
    (tmp_path / "new.safetensors").chmod(0o640)
    ej.save(loss, tmp_path / "new.safetensors")
    assert (tmp_path / "new.safetensors").stat().st_mode & 0o777 == 0o640
