"""`python -m einjit`: arguments are checked before training, every error names its flag."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest

from einjit import __main__ as cli
from einjit.demos import moons as demo
from einjit.demos.cli import valid_batch_sizes


@pytest.fixture(autouse=True)
def no_training(monkeypatch):
    """Any of these runs reaching training is a failure of the checks."""
    def refuse(*args, **kwargs):
        raise AssertionError("training started")
    monkeypatch.setattr(demo, "run_moons", refuse)


def usage_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main(list(argv))
    assert info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv,message", [
    (["--epochs", "0"], "--epochs must be at least 1, got 0"),
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--devices", "0"], "--devices must be at least 1, got 0"),
    (["--seed", "-1"], "--seed must be at least 0, got -1"),
    (["--epochs", "x"], "argument --epochs: invalid int value: 'x'"),
    (["--mpi", "--devices", "2"], "--mpi and --devices are exclusive"),
    (["--batch-size", "7"], "--batch-size 7: the 400 points do not split into whole batches of 7; valid batch "
                            "sizes: 1, 2, 4, 5, 8, 10, 16, 20, 25, 40, 50, 80, 100, 200, 400"),
    (["--devices", "4", "--batch-size", "3"], "--batch-size 3: the 400 points do not split into whole batches of 3 "
                                               "with 4 replicas; valid batch sizes: 1, 2, 4, 5, 10, 20, 25, 50, 100"),
    (["--devices", "3"], "--devices 3: the 400 points do not split evenly among 3 replicas"),
])
def test_bad_arguments_name_their_flag(capsys, argv, message):
    assert message in usage_error(capsys, "demo", "moons", *argv)


def test_plot_is_checked_before_training(capsys, tmp_path):
    missing = tmp_path / "no" / "such" / "plot.png"
    assert f"--plot {missing}: the folder {missing.parent} does not exist" in usage_error(
        capsys, "demo", "moons", "--plot", str(missing))
    assert f"--plot {tmp_path}: is a folder" in usage_error(capsys, "demo", "moons", "--plot", str(tmp_path))
    assert "unknown image format 'xyz'" in usage_error(capsys, "demo", "moons", "--plot", str(tmp_path / "a.xyz"))


def test_plot_without_matplotlib_names_the_extra(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert "--plot needs matplotlib: pip install 'einjit[plot]'" in usage_error(
        capsys, "demo", "moons", "--plot", str(tmp_path / "p.png"))


def test_version_and_defaults_in_help(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"einjit {importlib.metadata.version('einjit')}"
    with pytest.raises(SystemExit):
        cli.main(["demo", "moons", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 80)", "(default: 10)", "(default: 0)", "(default: 1)"):
        assert default in text


def test_valid_batch_sizes_divide_the_data():
    assert valid_batch_sizes(12, 1) == [1, 2, 3, 4, 6, 12]
    assert valid_batch_sizes(12, 2) == [1, 2, 3, 6]
    assert valid_batch_sizes(12, 5) == []


def test_good_arguments_reach_the_demo(monkeypatch, capsys):
    seen = {}

    def fake_main(args):
        seen.update(vars(args))
        return 0

    monkeypatch.setattr(demo, "main_moons", fake_main)
    assert cli.main(["demo", "moons", "--epochs", "3", "--batch-size", "25", "--devices", "2"]) == 0
    assert seen["epochs"] == 3 and seen["batch_size"] == 25 and seen["devices"] == 2


def test_the_demo_table_is_extensible():
    assert set(cli.DEMOS) >= {"moons"}
    assert all(callable(d.check) and callable(d.run) for d in cli.DEMOS.values())
