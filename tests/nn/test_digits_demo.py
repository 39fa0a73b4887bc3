"""`python -m einjit demo digits`: a short run through the command line, the message when the
`datasets` extra is missing, and (under `-m slow`) the full default run's accuracy for seeds
0, 1 and 2."""

from __future__ import annotations

import json
import sys

import pytest

from einjit.__main__ import main


def test_digits_demo_json_short_run(capsys):
    assert main(["demo", "digits", "--epochs", "2", "--batch-size", "32", "--seed", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["test_accuracy"] >= 0.9
    assert out["steps"] == 2 * (1438 // 32)
    confusion = out["confusion"]
    assert sum(map(sum, confusion)) == 359
    assert sum(confusion[k][k] for k in range(10)) == round(out["test_accuracy"] * 359)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_digits_demo_defaults_reach_the_accuracy_with_margin(seed):
    from einjit.demos.digits import run_digits
    result = run_digits(seed=seed, quiet=True)
    assert result.test_accuracy >= 0.985
    assert result.steps == 25 * (1438 // 64)


def test_digits_demo_names_the_missing_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(SystemExit, match=r"pip install 'einjit\[datasets\]'"):
        main(["demo", "digits", "--epochs", "1"])


def test_digits_demo_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "digits", "--epochs", "0"])
    assert "--epochs must be at least 1" in capsys.readouterr().err
