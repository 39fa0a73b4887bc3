"""`EINJIT_SEARCH=1`: tiles measured on first compile, the winner cached on disk beside the
compiled objects, so a second process searches nothing and schedules the same code. No
timings are asserted: which candidate wins depends on the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from einjit.errors import EinjitError
from einjit.ir.sched import search

HERE = Path(__file__).parent
SRC = HERE.parents[1] / "src"

SCRIPT = f"""
import json, sys
sys.path[:0] = [{str(SRC)!r}, {str(HERE)!r}]
from einjit.ir import low_level as ll
from einjit.ir.sched import search
from einjit.ir.optimize import optimize_proc
from test_schedule import matmul
code, *_ = matmul(128, 96, 160, True)
first = optimize_proc(code, name="mm").llc
again = optimize_proc(code, name="mm").llc
def tiles(code):
    return [s.message for s in ll.iter_stmts(code) if isinstance(s, ll.Comment) and "register-blocked" in s.message]
print(json.dumps({{"searches": search.stats.searches, "hits": search.stats.cache_hits, "tiles": tiles(first),
                  "same": tiles(first) == tiles(again)}}))
"""


def run_process(cache: Path) -> dict:
    env = dict(os.environ, EINJIT_SEARCH="1", EINJIT_SEARCH_CANDIDATES="2", EINJIT_CACHE_DIR=str(cache),
               EINJIT_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_does_no_search(tmp_path):
    first = run_process(tmp_path)
    assert (first["searches"], first["hits"]) == (1, 1)
    assert first["same"] and len(first["tiles"]) == 1
    [record] = [json.loads(p.read_text()) for p in (tmp_path / "search").iterdir()]
    assert record["shape"] == {"rows": 128, "cols": 160, "depth": 96, "outer_depth": 96, "itemsize": 4,
                               "strided_rows": False}
    assert len(record["seconds"]) == 2 and all(t > 0 for t in record["seconds"].values())
    won = record["tile"]
    assert f"register-blocked {won['mb']}x{won['nb']} contraction" in first["tiles"][0]
    second = run_process(tmp_path)
    assert (second["searches"], second["hits"]) == (0, 2)
    assert second["tiles"] == first["tiles"]


def test_a_record_naming_no_candidate_is_searched_again(tmp_path):
    """A record edited (or planted) to name a tile outside the candidates is not believed: the
    next process searches again and schedules a candidate, rewriting the record."""
    first = run_process(tmp_path)
    [path] = (tmp_path / "search").iterdir()
    record = json.loads(path.read_text())
    record["tile"] = dict(record["tile"], mb=4096, nb=0)
    path.write_text(json.dumps(record))
    again = run_process(tmp_path)
    assert (again["searches"], again["hits"]) == (1, 1)
    assert len(again["tiles"]) == 1 and "register-blocked 4096x" not in again["tiles"][0]
    assert (first["searches"], first["hits"]) == (1, 1)
    assert json.loads(path.read_text())["tile"]["nb"] > 0


def test_search_setting_is_validated(monkeypatch):
    monkeypatch.setenv("EINJIT_SEARCH", "yes")
    with pytest.raises(EinjitError, match="EINJIT_SEARCH must be 0 or 1, got 'yes'"):
        search.enabled()
    monkeypatch.setenv("EINJIT_SEARCH", "0")
    assert not search.enabled()
