"""The main job: the seed's half-moons classifier, one compiled C routine per training step.

2 → 16 → 16 → 1 MLP with ReLU, hinge loss `relu(1 - y * mlp(x))` averaged over the batch, SGD
with the learning rate `0.1 * (2*steps - step) / steps` and weight decay 1e-4. The dataset
lives in one constant tensor with batch axes `[n_batches, batch_size]`; each step slices its
batch with the static symbol `batch`, and the step counter `step` is a static symbol too, so
the routine's arguments never change and no Python runs inside a step.

With `devices=N` (`--devices N`) a step trains data-parallel on N multicore devices, one batch
each (`einjit.training.parallel.DataParallel`); with a communicator (`--mpi`, under `mpiexec -n N`) on N
ranks. The hinge loss is then divided by the union batch size `N * batch_size`, so that summing
the replicas' gradients gives the gradient of the union batch: N-replica training is
single-device training on batches N times larger, with N times fewer steps per epoch.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

import einjit as ej
from einjit.demos import datasets
from einjit.demos.cli import MOONS_POINTS, EpochProgress, check_batch_size, pyplot
from einjit.ir.indexing import IntRef, StaticSymbol, get_static_symbol
from einjit.training import parallel, train
from einjit.training.comm import Communicator


@dataclass
class MoonsResult:
    final_loss: float
    accuracy: float
    epochs: int
    steps: int
    seconds: float
    compile_seconds: float
    seconds_per_step: float
    losses: list[float] = field(repr=False)
    devices: int = 1
    ranks: int = 1


def make_mlp(hidden: int = 16):
    """The seed's `let%op mlp x = "b3" + "w3" * relu("b2" + "w2" * relu("b1" + "w1" * x))`:
    parameters are declared inline, once for this definition, and shared by every call."""

    @ej.op
    def mlp(x: ej.Tensor) -> ej.Tensor:
        h1 = ej.relu(ej.param("b1", output_dims=[hidden], init="zeros") + ej.param("w1", output_dims=[hidden]) @ x,
                     label="h1")
        h2 = ej.relu(ej.param("b2", output_dims=[hidden], init="zeros") + ej.param("w2", output_dims=[hidden]) @ h1,
                     label="h2")
        return ej.add(ej.param("b3", output_dims=[1], init="zeros"), ej.param("w3", output_dims=[1]) @ h2,
                      label="mlp")

    return mlp


def _predict(mlp, points: np.ndarray, name: str) -> np.ndarray:
    out = mlp(ej.ndarray(points.astype(np.float32), batch_axes=1, label=name))
    routine = train.to_routine(train.forward(out), name=f"eval_{name}")
    routine()
    return out.value.numpy().reshape(-1)


def run_moons(*, epochs: int = 80, batch_size: int = 10, seed: int = 0, n_points: int = MOONS_POINTS,
              quiet: bool = False, plot: str | None = None, devices: int = 1,
              comm: Communicator | None = None) -> MoonsResult:
    replicas = comm.size if comm is not None else devices
    if replicas < 1:
        raise ValueError(f"einjit demo: training needs at least one device, got {devices}")
    if n_points % (batch_size * replicas):
        raise ValueError(f"einjit demo: {n_points} points do not split into {replicas} replica(s) x batches of "
                         f"{batch_size}")
    coords, labels = datasets.shuffled(*datasets.half_moons(n_points // 2, seed=seed, dtype=np.float32), seed=seed)
    n_batches = n_points // batch_size
    steps_per_epoch = n_batches // replicas
    steps = epochs * steps_per_epoch
    batch_n = get_static_symbol(n_batches, "batch")
    step_n = get_static_symbol(None, "step")

    flat = ej.ndarray(coords.reshape(n_batches, batch_size, 2), batch_axes=2, label="moons_flat")
    classes = ej.ndarray(labels.reshape(n_batches, batch_size, 1), batch_axes=2, label="moons_classes")
    mlp = make_mlp()
    x, y = ej.batch_slice(flat, batch_n, label="moons_input"), ej.batch_slice(classes, batch_n, label="moons_class")
    margin = ej.relu(1 - y * mlp(x), label="margin_loss")
    loss = ej.div(ej.sum(margin, "...|... => 0"), batch_size * replicas, label="scalar_loss")
    learning_rate = ej.mul(0.1, (2 * steps - ej.embed_symbol(step_n)) / steps, label="learning_rate")

    train.init_params(loss, seed=seed)
    t0 = time.perf_counter()
    sgd = train.sgd_update(loss, learning_rate, weight_decay=1e-4)
    refs = {batch_n: IntRef(0), step_n: IntRef(0)}
    step, finish = _trainer(loss, sgd, refs, batch_n, devices, comm)
    compile_seconds = time.perf_counter() - t0

    losses: list[float] = []
    progress = EpochProgress(epochs, quiet, "lr", "lr")
    t1 = time.perf_counter()
    batch_ref, step_ref = refs[batch_n], refs[step_n]
    for epoch in range(epochs):
        total = 0.0
        for union_batch in range(steps_per_epoch):
            batch_ref.value = union_batch
            total += step()
            step_ref.value += 1
        losses.append(total / steps_per_epoch)
        progress.update(epoch, losses[-1], 0.1 * (2 * steps - step_ref.value) / steps)
    finish()
    progress.close()
    seconds = time.perf_counter() - t1

    scores = _predict(mlp, coords, "all_points")
    accuracy = float(np.mean(np.sign(scores) == labels.reshape(-1)))
    if plot:
        _plot(mlp, coords, labels, losses, plot)
    return MoonsResult(losses[-1], accuracy, epochs, steps, seconds, compile_seconds, seconds / max(1, steps), losses,
                       devices=devices, ranks=1 if comm is None else comm.size)


def _trainer(loss: ej.Tensor, sgd: train.Asgns, refs: dict[StaticSymbol, IntRef], batch_n: StaticSymbol, devices: int,
             comm: Communicator | None) -> tuple[Callable[[], float], Callable[[], None]]:
    """Compile the training step; return `step() -> union batch loss` and `finish()`, which
    leaves the trained parameters in the host arrays."""
    if comm is not None:
        replica = parallel.comm_parallel_update(loss, sgd, comm=comm, bindings=refs, shard=batch_n,
                                                name="moons_train_step")
        replica.broadcast_params()

        def comm_step() -> float:
            replica.step()
            return replica.loss()

        return comm_step, replica.sync
    if devices > 1:
        dp = parallel.parallel_update(loss, sgd, num_devices=devices, bindings=refs, shard=batch_n,
                                      name="moons_train_step")

        def parallel_step() -> float:
            dp.step()
            return sum(dp.losses())

        def finish() -> None:
            dp.sync()
            dp.close()

        return parallel_step, finish
    routine = train.to_routine([train.grad_update(loss), sgd], bindings=refs, name="moons_train_step")
    # The loss is hosted: on the C backend the routine computes in its host array, on a device
    # calling the routine copies it back into the same array, which exists before the first copy.
    loss_cell = loss.value_tn.host_array().reshape(-1)

    def single_step() -> float:
        routine()
        return float(loss_cell[0])

    return single_step, lambda: None


def _plot(mlp, coords: np.ndarray, labels: np.ndarray, losses: list[float], path: str) -> None:
    plt = pyplot()
    lo, hi = coords.min(axis=0) - 0.3, coords.max(axis=0) + 0.3
    gx, gy = np.meshgrid(np.linspace(lo[0], hi[0], 120), np.linspace(lo[1], hi[1], 120))
    grid = np.stack([gx.ravel(), gy.ravel()], axis=1)
    z = _predict(mlp, grid, "grid").reshape(gx.shape)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    ax1.contourf(gx, gy, z, levels=[-1e9, 0, 1e9], colors=["#f4c7c3", "#c6dbef"], alpha=0.8)
    ax1.contour(gx, gy, z, levels=[0], colors="k", linewidths=1)
    ax1.scatter(coords[:, 0], coords[:, 1], c=labels.ravel(), cmap="coolwarm_r", s=10, edgecolors="none")
    ax1.set_title("einjit: half moons decision boundary")
    ax2.plot(np.arange(1, len(losses) + 1), losses)
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("mean hinge loss")
    ax2.set_yscale("symlog", linthresh=1e-4)
    ax2.set_title("training loss")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main_moons(args) -> int:
    devices, comm = getattr(args, "devices", 1), None
    if getattr(args, "mpi", False):
        if devices > 1:
            raise SystemExit("einjit demo: --mpi and --devices are exclusive: one device per MPI rank")
        from einjit.training.comm import MpiCommunicator
        try:
            comm = MpiCommunicator()
        except ImportError as e:
            raise SystemExit(str(e)) from None
        check_batch_size(args.batch_size, comm.size, MOONS_POINTS, "mpiexec -n")
    lead = comm is None or comm.rank == 0
    result = run_moons(epochs=args.epochs, batch_size=args.batch_size, seed=args.seed, quiet=args.json or not lead,
                       plot=args.plot if lead else None, devices=devices, comm=comm)
    if not lead:
        return 0
    if args.json:
        out = asdict(result)
        out.pop("losses")
        print(json.dumps(out))
    else:
        replicas = (f" on {result.devices} devices" if result.devices > 1
                    else f" on {result.ranks} MPI ranks" if result.ranks > 1 else "")
        print(f"final loss {result.final_loss:.5f}, training accuracy {100 * result.accuracy:.2f}% "
              f"({result.steps} steps{replicas} in {result.seconds:.2f} s, "
              f"{1e6 * result.seconds_per_step:.1f} µs/step; "
              f"compiled in {result.compile_seconds:.2f} s)")
        if args.plot:
            print(f"decision boundary and loss curve written to {args.plot}")
    return 0
