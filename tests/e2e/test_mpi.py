"""Data-parallel training across MPI processes (`mpiexec -n 2`) equals single-device training on
the union batch. Needs the `mpi` extra (mpi4py + mpich, which provides `mpiexec`)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from einjit.demos.moons import run_moons
from test_parallel import ATOL, RTOL, single_device

E2E = Path(__file__).resolve().parent


def find_mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


MPIEXEC = find_mpiexec()
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
                                reason="needs mpi4py and mpiexec: pip install 'einjit[mpi]'")

RANK_SCRIPT = """
import sys
sys.path.insert(0, {e2e!r})
import numpy as np
from einjit.training import parallel
from einjit.training.comm import MpiCommunicator
import test_parallel as tp

comm = MpiCommunicator()
s = tp.build(comm.size, tp.SHARD, 0.9)
replica = parallel.comm_parallel_update(s.loss, s.update, comm=comm, bindings=[s.batch, s.step], shard=s.batch)
losses = tp.rank_training(replica, s)
arrays = {{f"p{{k}}": v for k, v in enumerate(replica.param_values())}}
np.savez(sys.argv[1] + f"/rank{{comm.rank}}.npz", losses=np.array(losses), **arrays)
"""


def mpiexec(n: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *args], capture_output=True, text=True,
                          timeout=120, check=True)


def test_two_mpi_processes_train_as_one_device_on_the_union_batch(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(e2e=str(E2E)))
    mpiexec(2, str(script), str(tmp_path))
    want, want_loss = single_device(2, 0.9)
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    for r, got in enumerate(ranks):
        params = [got[f"p{k}"] for k in range(len(want))]
        for k, (g, w) in enumerate(zip(params, want, strict=True)):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"rank {r}: parameter {k}")
        assert got["losses"][-1] == pytest.approx(want_loss, rel=RTOL)
    for k in range(len(want)):
        np.testing.assert_array_equal(ranks[0][f"p{k}"], ranks[1][f"p{k}"])


def test_demo_under_mpiexec():
    out = mpiexec(2, "-m", "einjit", "demo", "moons", "--mpi", "--json", "--epochs", "4")
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, "only rank 0 reports"
    result = json.loads(lines[0])
    assert result["ranks"] == 2 and result["devices"] == 1 and result["steps"] == 4 * 20
    one = run_moons(epochs=4, batch_size=20, quiet=True)
    assert result["final_loss"] == pytest.approx(one.final_loss, rel=1e-5)
    assert result["accuracy"] == one.accuracy
