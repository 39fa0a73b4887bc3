"""Data-parallel training (float64) equals single-device training on the union batch: over
multicore devices through merge buffers, and over in-process communicator ranks."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import dataclass

import numpy as np
import pytest

import einjit as ej
from einjit import datasets, train
from einjit.backends.cc.backend import CcBackend
from einjit.backends.cc.multicore import MulticoreBackend
from einjit.demos.moons import run_moons
from einjit.ir import bf16, ops
from einjit.ir.indexing import IntRef, StaticSymbol, get_static_symbol
from einjit.training import parallel
from einjit.training.comm import Communicator, InProcessGroup

N_POINTS, SHARD, STEPS = 96, 6, 5
RTOL, ATOL = 1e-12, 1e-15


@dataclass
class Setup:
    loss: ej.Tensor
    params: list[ej.Tensor]
    update: object
    batch: StaticSymbol
    step: StaticSymbol
    union_batches: int


def build(replicas: int, batch: int, momentum: float, prec: str = "double") -> Setup:
    """A 2 → 8 → 8 → 1 hinge-loss MLP on moons points in batches of `batch`, the loss divided by
    the union batch `replicas * batch`; SGD with a step-dependent learning rate."""
    coords, labels = datasets.shuffled(*datasets.half_moons(N_POINTS // 2, seed=3), seed=3)
    n_batches = N_POINTS // batch
    with ej.default_precision(prec):
        batch_n, step_n = get_static_symbol(n_batches, "batch"), get_static_symbol(None, "step")
        x = ej.batch_slice(ej.ndarray(coords.reshape(n_batches, batch, 2), batch_axes=2), batch_n)
        y = ej.batch_slice(ej.ndarray(labels.reshape(n_batches, batch, 1), batch_axes=2), batch_n)
        w1, b1 = ej.param("w1", output_dims=[8]), ej.param("b1", output_dims=[8], init="uniform")
        w2, b2 = ej.param("w2", output_dims=[8]), ej.param("b2", output_dims=[8], init="uniform")
        w3, b3 = ej.param("w3", output_dims=[1]), ej.param("b3", output_dims=[1], init="uniform")
        out = b3 + w3 @ ej.relu(b2 + w2 @ ej.relu(b1 + w1 @ x))
        loss = ej.div(ej.sum(ej.relu(1 - y * out), "...|... => 0"), replicas * batch)
        lr = ej.mul(0.2, (2 * STEPS - ej.embed_symbol(step_n)) / STEPS)
        train.init_params(loss, seed=5)
        update = train.sgd_update(loss, lr, weight_decay=1e-3, momentum=momentum)
    return Setup(loss, [w1, b1, w2, b2, w3, b3], update, batch_n, step_n, N_POINTS // (replicas * batch))


def single_device(replicas: int, momentum: float, steps: int = STEPS, prec: str = "double"
                  ) -> tuple[list[np.ndarray], float]:
    """The reference: one fused routine on the union batches; final parameters and loss."""
    s = build(1, replicas * SHARD, momentum, prec)
    refs = {s.batch: IntRef(0), s.step: IntRef(0)}
    routine = train.to_routine([train.grad_update(s.loss), s.update], bindings=refs, name="reference_step")
    for k in range(steps):
        refs[s.batch].value, refs[s.step].value = k % s.union_batches, k
        routine()
    return [p.value.numpy() for p in s.params], float(s.loss.value.numpy().reshape(-1)[0])


def assert_params_equal(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{what}: parameter {k}")


def rank_training(replica: parallel.CommDataParallel, s: Setup, steps: int = STEPS) -> list[float]:
    """What every rank runs: start from rank 0's parameters, then the steps; the losses."""
    replica.broadcast_params()
    losses = []
    for k in range(steps):
        replica.bindings[s.batch].value, replica.bindings[s.step].value = k % s.union_batches, k
        replica.step()
        losses.append(replica.loss())
    return losses


# ---------------------------------------------------------------- devices and merge buffers


@pytest.mark.parametrize("devices,momentum", [(2, 0.0), (2, 0.9), (4, 0.9)])
def test_devices_train_as_one_device_on_the_union_batch(devices, momentum):
    want, want_loss = single_device(devices, momentum)
    s = build(devices, SHARD, momentum)
    with parallel.parallel_update(s.loss, s.update, num_devices=devices, bindings=[s.batch, s.step],
                               shard=s.batch) as dp:
        for k in range(STEPS):
            dp.bindings[s.batch].value, dp.bindings[s.step].value = k % s.union_batches, k
            dp.step()
        losses = dp.sync()
    assert len(losses) == devices
    assert sum(losses) == pytest.approx(want_loss, rel=RTOL)
    assert_params_equal([p.value.numpy() for p in s.params], want, f"{devices} devices")


def test_bf16_devices_report_losses_as_numbers():
    """A bf16 loss's cell is a bit pattern; `losses()` reads it as the number it stands for."""
    want, want_loss = single_device(2, 0.9, prec="bf16")
    s = build(2, SHARD, 0.9, prec="bf16")
    with parallel.parallel_update(s.loss, s.update, num_devices=2, bindings=[s.batch, s.step],
                                  shard=s.batch) as dp:
        for k in range(STEPS):
            dp.bindings[s.batch].value, dp.bindings[s.step].value = k % s.union_batches, k
            dp.step()
        losses = dp.sync()
    assert sum(losses) == pytest.approx(want_loss, rel=2e-2)
    for p, w in zip(s.params, want, strict=True):
        np.testing.assert_allclose(p.value.numpy(), w, atol=1e-2)


def test_steps_are_scheduled_without_waiting_and_devices_stay_equal():
    """Many steps scheduled back to back, then one sync: every device holds device 0's params."""
    s = build(2, SHARD, 0.9)
    backend = MulticoreBackend(CcBackend(), num_devices=3)
    with backend:
        dp = parallel.parallel_update(s.loss, s.update, num_devices=2, bindings={s.batch: IntRef(0),
                                                                                 s.step: IntRef(0)},
                                      shard=s.batch, backend=backend)
        for k in range(40):
            dp.bindings[s.batch].value = k % s.union_batches
            dp.step()
        dp.sync()
        device0 = [p.value.numpy() for p in s.params]
        for p in s.params:
            backend.to_host(dp.contexts[1], p.value_tn)
    for p, v in zip(s.params, device0, strict=True):
        np.testing.assert_array_equal(p.value.numpy(), v)


def test_data_parallel_misuse_is_reported():
    s = build(2, SHARD, 0.0)
    with MulticoreBackend(CcBackend(), num_devices=1) as backend:
        with pytest.raises(ValueError, match=r"has 1 devices, 2 requested"):
            parallel.parallel_update(s.loss, s.update, num_devices=2, bindings=[s.step], shard=s.batch,
                                     backend=backend)
    with ej.default_precision("double"):
        constant = ej.sum(ej.ndarray(np.ones(3)), "...|...->... => 0")
    with pytest.raises(ej.TensorError, match="needs parameters"):
        parallel.parallel_update(constant, train.sgd_update([], 0.1), num_devices=1, bindings=[s.step],
                                 shard=s.batch)


def test_demo_on_two_devices_equals_the_demo_on_twice_the_batch():
    """`--devices 2` with batches of 10 is the single-device demo with batches of 20."""
    two = run_moons(epochs=4, batch_size=10, devices=2, quiet=True)
    one = run_moons(epochs=4, batch_size=20, quiet=True)
    assert (two.devices, two.steps, one.steps) == (2, 80, 80)
    np.testing.assert_allclose(two.losses, one.losses, rtol=1e-5)
    assert two.accuracy == one.accuracy


def test_demo_command_line_devices_json():
    out = subprocess.run([sys.executable, "-m", "einjit", "demo", "moons", "--devices", "2", "--json", "--epochs", "5"],
                         capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["devices"] == 2 and result["ranks"] == 1 and result["steps"] == 5 * 20
    assert 0.0 <= result["accuracy"] <= 1.0


# ---------------------------------------------------------------- communicators


def run_ranks(n: int, body) -> list:
    """Run `body(comm)` on n threads joined by an in-process group; their results by rank."""
    results: list = [None] * n
    errors: list[BaseException] = []

    def main(comm: Communicator) -> None:
        try:
            results[comm.rank] = body(comm)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=main, args=(c,)) for c in InProcessGroup(n, timeout=30).communicators]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_in_process_ranks_train_as_one_device_on_the_union_batch():
    want, want_loss = single_device(2, 0.9)
    s = build(2, SHARD, 0.9)
    backend = CcBackend()
    code = parallel.compile_step(backend, s.loss, s.update, bindings=[s.batch, s.step], shard=s.batch)
    replicas = {}

    def body(comm: Communicator):
        replicas[comm.rank] = replica = parallel.CommDataParallel(code, comm, backend=backend)
        return rank_training(replica, s), replica.param_values()

    (losses0, params0), (losses1, params1) = run_ranks(2, body)
    assert losses0 == losses1 and losses0[-1] == pytest.approx(want_loss, rel=RTOL)
    for a, b in zip(params0, params1, strict=True):
        np.testing.assert_array_equal(a, b)
    replicas[0].sync()
    assert_params_equal([p.value.numpy() for p in s.params], want, "2 in-process ranks")


def test_bf16_gradients_are_summed_as_numbers_and_rounded_once():
    """bf16 cells are uint16 bit patterns: ranks all-reduce them widened to float32, so the sum is
    the bf16 rounding of the float32 sum (adding the patterns as integers gave garbage)."""
    want, want_loss = single_device(2, 0.9, prec="bf16")
    s = build(2, SHARD, 0.9, prec="bf16")
    assert all(p.value_tn.prec is ops.bf16 and p.grad_tn.prec is ops.bf16 for p in s.params)
    backend = CcBackend()
    code = parallel.compile_step(backend, s.loss, s.update, bindings=[s.batch, s.step], shard=s.batch)

    def body(comm: Communicator):
        replica = parallel.CommDataParallel(code, comm, backend=backend)
        replica.broadcast_params()
        replica.bindings[s.batch].value, replica.bindings[s.step].value = 0, 0
        replica._grad()
        grads = [np.array(bf16.as_values(replica.array(p.grad_tn), ops.bf16)) for p in s.params]
        for pack in replica._packs:
            pack.allreduce(comm)
        summed = [np.array(bf16.as_values(replica.array(p.grad_tn), ops.bf16)) for p in s.params]
        return grads, summed

    (grads0, summed0), (grads1, summed1) = run_ranks(2, body)
    for g0, g1, a, b in zip(grads0, grads1, summed0, summed1, strict=True):
        assert np.abs(g0).max() > 0 or np.abs(g1).max() > 0
        np.testing.assert_array_equal(a, bf16.round_to_bf16(g0 + g1))
        np.testing.assert_array_equal(a, b)
    losses = run_ranks(2, lambda comm: rank_training(parallel.CommDataParallel(code, comm, backend=backend), s))
    assert losses[0] == losses[1]
    assert losses[0][-1] == pytest.approx(want_loss, rel=2e-2)


def test_in_process_collectives():
    def body(comm: Communicator):
        a = np.arange(4.0) * (comm.rank + 1)
        comm.allreduce(a)
        m = np.array([comm.rank, -comm.rank], dtype=np.int64)
        comm.allreduce(m, op="max")
        b = np.full(2, float(comm.rank))
        comm.broadcast(b, root=2)
        comm.barrier()
        return a, m, b

    for a, m, b in run_ranks(3, body):
        np.testing.assert_array_equal(a, np.arange(4.0) * 6)
        np.testing.assert_array_equal(m, [2, 0])
        np.testing.assert_array_equal(b, [2.0, 2.0])


def test_in_process_collective_misuse_is_seen_by_every_rank():
    def mismatched(comm: Communicator):
        with pytest.raises(ValueError, match=r"allreduce: rank 1 passed float64\[3\] but rank 0 passed float64\[2\]"):
            comm.allreduce(np.zeros(2 + comm.rank))
        return True

    assert run_ranks(2, mismatched) == [True, True]
    comm = InProcessGroup(1).communicators[0]
    with pytest.raises(ValueError, match="unknown reduction 'mean'; use one of sum, prod, max, min"):
        comm.allreduce(np.zeros(2), op="mean")
    with pytest.raises(TypeError, match="writeable C-contiguous NumPy array"):
        comm.allreduce(np.zeros((4, 4))[:, 1])
    with pytest.raises(ValueError, match="root 3 is not a rank of a group of 1"):
        comm.broadcast(np.zeros(2), root=3)


def test_mpi_communicator_names_the_extra_when_mpi4py_is_missing(monkeypatch):
    from einjit.training.comm import MpiCommunicator

    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(ImportError, match=r"pip install 'einjit\[mpi\]'"):
        MpiCommunicator()
