"""The digits MLP and the digits convnet (`einjit.demos.digits.make_model`), trained a few steps
on synthetic 8x8 images (scikit-learn's digits need not be installed), then put in evaluation
mode; and the helpers that build and run an exported C library."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

import einjit as ej
from einjit import data, fit, nn, train
from einjit.demos.digits import make_model

N_CLASSES = 10


def images(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Noisy class templates: learnable, so a few steps move the parameters somewhere real."""
    rng = np.random.default_rng(seed)
    templates = rng.random((N_CLASSES, 1, 8, 8)).astype(np.float32)
    labels = rng.integers(0, N_CLASSES, n)
    noise = 0.3 * rng.standard_normal((n, 1, 8, 8)).astype(np.float32)
    return templates[labels] + noise, labels


def make_mlp() -> nn.Sequential:
    return nn.Sequential(nn.Flatten(label="flat"), nn.Linear(64, 32, label="fc1"), nn.ReLU(),
                         nn.Linear(32, N_CLASSES, label="fc2"))


def trained(kind: str, steps: int = 4, batch: int = 16) -> nn.Sequential:
    """The model `kind` ("mlp" or "convnet") after `steps` Adam steps, in evaluation mode."""
    model = make_mlp() if kind == "mlp" else make_model(0)
    x = ej.input("images", batch_dims=[batch], output_dims=[1, 8, 8])
    y = ej.input("labels", batch_dims=[batch], output_dims=[N_CLASSES])
    loss = nn.cross_entropy(model(x), y, label="loss")
    opt = nn.Adam(loss, 0.01)
    train.init_params(loss, seed=0)
    step = fit.train_step(loss, opt.update(), inputs=[x, y], name=f"{kind}_train_step")
    xs, ys = images(steps * batch)
    for xb, yb in data.Loader(xs, nn.one_hot(ys, N_CLASSES), batch_size=batch, seed=0):
        opt.step()
        step(xb, yb)
    model.eval()
    return model


def build(directory: Path, *extra: str) -> None:
    """`make` with warnings as errors (`extra`: more make arguments or targets)."""
    proc = subprocess.run(["make", "-C", str(directory), "CFLAGS=-Wall -Wextra -Werror", *extra],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def run_main(directory: Path, inputs: np.ndarray, n_out: int, *args: str) -> np.ndarray:
    """The example program on `inputs` (rows of one call's inputs) -> its output records."""
    np.ascontiguousarray(inputs, dtype=np.float32).tofile(directory / "in.bin")
    proc = subprocess.run(["./main", "in.bin", "out.bin", *args], cwd=directory, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return np.fromfile(directory / "out.bin", dtype=np.float32).reshape(-1, n_out)
