"""What the demos of `python -m einjit demo` share: argument checks, run before any training so
a bad argument fails at once with a message naming its flag, and the per-epoch progress line."""

from __future__ import annotations

import os
import sys
from typing import Any

MOONS_POINTS = 400
"""The moons demo's data set size, which its batch sizes must divide."""


class ArgumentProblem(ValueError):
    """A bad command-line argument; the message names the flag."""


def at_least(flag: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ArgumentProblem(f"{flag} must be at least {minimum}, got {value}")


def valid_batch_sizes(n_points: int, replicas: int) -> list[int]:
    """The batch sizes that split `n_points` into whole batches, `replicas` batches per step."""
    return [b for b in range(1, n_points // replicas + 1) if n_points % (b * replicas) == 0]


def check_batch_size(batch_size: int, replicas: int, n_points: int, replicas_flag: str = "--devices") -> None:
    """`replicas_flag` names where the number of replicas came from (`mpiexec -n` under MPI)."""
    if n_points % replicas:
        raise ArgumentProblem(f"{replicas_flag} {replicas}: the {n_points} points do not split evenly among {replicas} "
                              f"replicas; use a number of replicas that divides {n_points}")
    if n_points % (batch_size * replicas):
        per = f" with {replicas} replicas" if replicas > 1 else ""
        sizes = ", ".join(map(str, valid_batch_sizes(n_points, replicas)))
        raise ArgumentProblem(f"--batch-size {batch_size}: the {n_points} points do not split into whole batches of "
                              f"{batch_size}{per}; valid batch sizes: {sizes}")


def check_plot_path(path: str | None) -> None:
    """`--plot FILE`: matplotlib (the `plot` extra) is installed, the folder exists and is
    writable, and matplotlib can write the file's format."""
    if path is None:
        return
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ArgumentProblem("--plot needs matplotlib: pip install 'einjit[plot]'") from None
    if os.path.isdir(path):
        raise ArgumentProblem(f"--plot {path}: is a folder; give a file name such as {os.path.join(path, 'plot.png')}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ArgumentProblem(f"--plot {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ArgumentProblem(f"--plot {path}: the folder {folder} is not writable")
    formats = Figure().canvas.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in formats:
        raise ArgumentProblem(f"--plot {path}: unknown image format {ext or '(no extension)'!r}; use one of "
                              f"{', '.join('.' + f for f in sorted(formats))}")


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (demos plot to files, never a window)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("einjit demo: --plot needs matplotlib: pip install 'einjit[plot]'") from None
    return plt


def check_checkpoint_path(path: str) -> None:
    """`--checkpoint FILE`: a file name in an existing, writable folder."""
    if os.path.isdir(path):
        raise ArgumentProblem(f"--checkpoint {path}: is a folder; give a file name such as "
                              f"{os.path.join(path, 'model.safetensors')}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ArgumentProblem(f"--checkpoint {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ArgumentProblem(f"--checkpoint {path}: the folder {folder} is not writable")


class EpochProgress:
    """tqdm when installed, else one plain line per epoch: the loss and one metric, shown as
    `key` in the bar (with `bar_digits` decimals) and as `label` in the line."""

    def __init__(self, epochs: int, quiet: bool, key: str, label: str, bar_digits: int = 4,
                 desc: str | None = None):
        self.epochs, self.quiet, self.bar = epochs, quiet, None
        self.key, self.label, self.bar_digits = key, label, bar_digits
        if not quiet:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=epochs, unit="epoch", file=sys.stderr, desc=desc)
            except ImportError:
                pass

    def update(self, epoch: int, loss: float, metric: float) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.set_postfix({"loss": f"{loss:.4f}", self.key: f"{metric:.{self.bar_digits}f}"})
            self.bar.update(1)
        else:
            print(f"epoch {epoch + 1:3d}/{self.epochs}  loss {loss:.5f}  {self.label} {metric:.4f}", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
