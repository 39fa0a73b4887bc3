"""The program cache (`backends/cc/program_cache.py`): a fresh process compiling the same model
skips einjit's passes and computes the same values; any change to the graph misses."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

from einjit.backends import cache

HERE = Path(__file__).resolve().parent
SCRIPT = """
import json, sys
sys.path.insert(0, {here!r})
from test_outline import residual_model
from einjit import train
from einjit.backends.cc import program_cache, toolchain
from einjit.ir import optimize
runs = []
original = optimize.optimize_proc
optimize.optimize_proc = lambda *a, **k: runs.append(1) or original(*a, **k)
loss = residual_model(2)
step = train.to_routine([train.grad_update(loss), train.sgd_update(loss, {lr})], name="step")
losses = []
for _ in range(3):
    step()
    losses.append(float(loss.value_tn.host_array().reshape(-1)[0]))
profile = step.profile(1)
print(json.dumps({{"hits": program_cache.stats.hits, "stores": program_cache.stats.stores, "passes": len(runs),
                  "gcc": toolchain.stats.compiler_invocations, "losses": losses, "kept": step.kept_bytes,
                  "local": step.local_bytes, "nests": len(profile.rows())}}))
"""


def run(cache: Path, lr: float = 0.1) -> dict:
    env = {**os.environ, "EINJIT_CACHE_DIR": str(cache), "PYTHONPATH": str(HERE.parents[1] / "src")}
    for var in ("EINJIT_DUMP_DIR", "EINJIT_DEBUG", "EINJIT_PROFILE"):
        env.pop(var, None)
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(here=str(HERE), lr=lr)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_skips_the_passes_and_computes_the_same(tmp_path):
    first = run(tmp_path)
    second = run(tmp_path)
    assert (first["hits"], first["stores"]) == (0, 1) and first["passes"] >= 1
    # The hit runs no pass and no gcc for the step; its profiler lowers on demand (one pass run).
    assert (second["hits"], second["stores"], second["gcc"]) == (1, 0, 1) and second["passes"] == 1
    assert second["losses"] == first["losses"] and first["losses"][-1] < first["losses"][0]
    assert (second["kept"], second["local"], second["nests"]) == (first["kept"], first["local"], first["nests"])


def test_another_constant_misses(tmp_path):
    run(tmp_path)
    other = run(tmp_path, lr=0.05)
    assert (other["hits"], other["stores"]) == (0, 1)


class _Payload:
    """Unpickling this touches a file: what loading a pickled record would run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_records_are_data_a_planted_pickle_or_a_forged_record_is_a_miss(tmp_path):
    first = run(tmp_path)
    (record,) = (tmp_path / "program").iterdir()
    signed = cache.load_record("program", record.stem, record)
    assert json.loads(signed)["nodes"] > 0
    marker = tmp_path / "pwned"
    record.write_bytes(pickle.dumps(_Payload(marker)))
    planted = run(tmp_path)
    assert not marker.exists()
    assert (planted["hits"], planted["stores"]) == (0, 1) and planted["losses"] == first["losses"]
    forged = json.loads(signed)
    forged["inputs"] = [["g", -1]]  # a negative position would wrap around to another node
    cache.store_record("program", record.stem, record, json.dumps(forged).encode())  # signed: decoding refuses it
    again = run(tmp_path)
    assert (again["hits"], again["stores"]) == (0, 1) and again["losses"] == first["losses"]


GATHER_SCRIPT = """
import json
import numpy as np
import einjit as ej
from einjit import nn, train
from einjit.backends.cc import program_cache
from einjit.models import GPT, GPTConfig
model = GPT(GPTConfig(vocab_size=50, block_size=8, n_layer=2, n_head=2, d_model=16), label="g")
x = ej.input("tokens", batch_dims=[2, 8], prec="int32")
y = ej.input("targets", batch_dims=[2, 8], prec="int32")
loss = nn.cross_entropy(model(x), y)
train.init_params(loss, seed=0)
step = train.to_routine([train.grad_update(loss), train.sgd_update(loss, 0.1)], name="gstep")
ids = np.random.default_rng(0).integers(0, 50, (2, 9)).astype(np.int32)
x.value_tn.host_array()[...] = ids[:, :-1].reshape(x.value_tn.host_array().shape)
y.value_tn.host_array()[...] = ids[:, 1:].reshape(y.value_tn.host_array().shape)
losses = []
for _ in range(3):
    step()
    losses.append(float(loss.value_tn.host_array().reshape(-1)[0]))
print(json.dumps({"hits": program_cache.stats.hits, "stores": program_cache.stats.stores, "losses": losses}))
"""


def test_a_program_gathering_by_ids_is_cached_and_computes_the_same(tmp_path):
    """The ids of a gather appear only inside its projections, not among the nodes the
    assignments read: the record must still find them."""
    env = {**os.environ, "EINJIT_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(HERE.parents[1] / "src")}
    for var in ("EINJIT_DUMP_DIR", "EINJIT_DEBUG", "EINJIT_PROFILE"):
        env.pop(var, None)
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", GATHER_SCRIPT], env=env, capture_output=True, text=True,
                              timeout=600, check=False)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert (first["hits"], first["stores"], second["hits"], second["stores"]) == (0, 1, 1, 0)
    assert second["losses"] == first["losses"] and first["losses"][-1] < first["losses"][0]
