"""The main job: the seed's half-moons classifier, one compiled C routine per training step.

2 → 16 → 16 → 1 MLP with ReLU, hinge loss `relu(1 - y * mlp(x))` averaged over the batch, SGD
with the learning rate `0.1 * (2*steps - step) / steps` and weight decay 1e-4. The dataset
lives in one constant tensor with batch axes `[n_batches, batch_size]`; each step slices its
batch with the static symbol `batch`, and the step counter `step` is a static symbol too, so
the routine's arguments never change and no Python runs inside a step.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

import einjit as ej
from einjit import datasets, train
from einjit.ir.indexing import IntRef, get_static_symbol


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


class _Progress:
    """tqdm when installed, else one plain line per epoch."""

    def __init__(self, epochs: int, quiet: bool):
        self.quiet, self.bar = quiet, None
        if not quiet:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=epochs, unit="epoch", file=sys.stderr)
            except ImportError:
                pass

    def update(self, epoch: int, epochs: int, loss: float, lr: float) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.4f}")
            self.bar.update(1)
        else:
            print(f"epoch {epoch + 1:3d}/{epochs}  loss {loss:.5f}  lr {lr:.4f}", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _predict(mlp, points: np.ndarray, name: str) -> np.ndarray:
    out = mlp(ej.ndarray(points.astype(np.float32), batch_axes=1, label=name))
    routine = train.to_routine(train.forward(out), name=f"eval_{name}")
    routine()
    return out.value.numpy().reshape(-1)


def run_moons(*, epochs: int = 80, batch_size: int = 10, seed: int = 0, n_points: int = 400,
              quiet: bool = False, plot: str | None = None) -> MoonsResult:
    if n_points % batch_size:
        raise ValueError(f"einjit demo: {n_points} points do not split into batches of {batch_size}")
    coords, labels = datasets.shuffled(*datasets.half_moons(n_points // 2, seed=seed), seed=seed)
    n_batches = n_points // batch_size
    steps = epochs * n_batches
    batch_n = get_static_symbol(n_batches, "batch")
    step_n = get_static_symbol(None, "step")

    flat = ej.ndarray(coords.reshape(n_batches, batch_size, 2), batch_axes=2, label="moons_flat")
    classes = ej.ndarray(labels.reshape(n_batches, batch_size, 1), batch_axes=2, label="moons_classes")
    mlp = make_mlp()
    x, y = ej.batch_slice(flat, batch_n, label="moons_input"), ej.batch_slice(classes, batch_n, label="moons_class")
    margin = ej.relu(1 - y * mlp(x), label="margin_loss")
    loss = ej.div(ej.sum(margin, "...|... => 0"), batch_size, label="scalar_loss")
    learning_rate = ej.mul(0.1, (2 * steps - ej.embed_symbol(step_n)) / steps, label="learning_rate")

    train.init_params(loss, seed=seed)
    t0 = time.perf_counter()
    update = train.grad_update(loss)
    sgd = train.sgd_update(loss, learning_rate, weight_decay=1e-4)
    refs = {batch_n: IntRef(0), step_n: IntRef(0)}
    routine = train.to_routine([update, sgd], bindings=refs, name="moons_train_step")
    compile_seconds = time.perf_counter() - t0

    losses: list[float] = []
    loss_cell = loss.value_tn.array.reshape(-1)
    progress = _Progress(epochs, quiet)
    t1 = time.perf_counter()
    step_ref = refs[step_n]
    for epoch in range(epochs):
        total = 0.0

        def step() -> None:
            nonlocal total
            routine()
            total += float(loss_cell[0])
            step_ref.value += 1

        train.sequential_loop({batch_n: refs[batch_n]}, step)
        losses.append(total / n_batches)
        progress.update(epoch, epochs, losses[-1], 0.1 * (2 * steps - step_ref.value) / steps)
    progress.close()
    seconds = time.perf_counter() - t1

    scores = _predict(mlp, coords, "all_points")
    accuracy = float(np.mean(np.sign(scores) == labels.reshape(-1)))
    if plot:
        _plot(mlp, coords, labels, losses, plot)
    return MoonsResult(losses[-1], accuracy, epochs, steps, seconds, compile_seconds, seconds / max(1, steps), losses)


def _plot(mlp, coords: np.ndarray, labels: np.ndarray, losses: list[float], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("einjit demo: --plot needs matplotlib: pip install 'einjit[plot]'") from None
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
    result = run_moons(epochs=args.epochs, batch_size=args.batch_size, seed=args.seed, quiet=args.json,
                       plot=args.plot)
    if args.json:
        out = asdict(result)
        out.pop("losses")
        print(json.dumps(out))
    else:
        print(f"final loss {result.final_loss:.5f}, training accuracy {100 * result.accuracy:.2f}% "
              f"({result.steps} steps in {result.seconds:.2f} s, {1e6 * result.seconds_per_step:.1f} µs/step; "
              f"compiled in {result.compile_seconds:.2f} s)")
        if args.plot:
            print(f"decision boundary and loss curve written to {args.plot}")
    return 0
