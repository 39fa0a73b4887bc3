"""Run as a script: a model with every kind of state — parameters, BatchNorm running
statistics, a Dropout random counter — trained by `fit.fit` with Adam on a cosine schedule and
gradient clipping, checkpointed with its optimizer.

`python state_run.py train START EPOCHS OUT.safetensors PREDICTIONS.npy [IN.safetensors]`
trains (resuming from IN when given), saves model + optimizer state and the eval-mode
predictions on a held-out set. `python state_run.py predict IN.safetensors PREDICTIONS.npy`
builds the model afresh, loads IN (model only) and writes the eval-mode predictions."""

from __future__ import annotations

import sys

import numpy as np

import einjit as ej
from einjit import data, fit, nn, train
from einjit.nn import schedules

BATCH, EPOCHS_TOTAL = 32, 4


def dataset(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((n, 3)) * [1.0, 3.0, 0.5] + [0.5, -2.0, 1.0]
    return xs, np.where(xs[:, 0] * xs[:, 1] > 0, 1.0, -1.0)


def build():
    model = nn.Sequential(nn.Linear(3, 16, label="fc1"), nn.BatchNorm(16, label="bn"), nn.ReLU(),
                          nn.Dropout(0.25, seed=5, label="drop"), nn.Linear(16, 1, label="fc2"))
    x = ej.input("x", batch_dims=[BATCH], output_dims=[3])
    y = ej.input("y", batch_dims=[BATCH])
    loss = nn.hinge(model(x), y, label="loss")
    return model, x, y, loss


def predictions(model) -> np.ndarray:
    xs, _ = dataset(100, seed=9)
    model.eval()
    x_eval = ej.input("x_eval", batch_dims=[25], output_dims=[3])
    return fit.predict(fit.forward_step(model(x_eval), inputs=[x_eval]), xs)


def run_train(start: int, epochs: int, out: str, preds: str, source: str | None) -> None:
    model, x, y, loss = build()
    xs, ys = dataset(320, seed=1)
    opt = nn.Adam(loss, schedules.cosine(0.05, EPOCHS_TOTAL * (320 // BATCH), 0.005))
    if source is None:
        train.init_params(loss, seed=0)
    else:
        ej.load(loss, source, optimizer=opt)
    step = fit.train_step(loss, [nn.clip_grad_norm(loss, 0.5), opt.update()], inputs=[x, y])
    fit.fit(step, data.Loader(xs, ys, batch_size=BATCH, seed=4), epochs=epochs, start_epoch=start, progress=False)
    ej.save(loss, out, optimizer=opt)
    np.save(preds, predictions(model))


def run_predict(source: str, preds: str) -> None:
    model, _, _, loss = build()
    ej.load(loss, source, optimizer=nn.Adam(loss, schedules.cosine(0.05, EPOCHS_TOTAL * (320 // BATCH), 0.005)))
    np.save(preds, predictions(model))


if __name__ == "__main__":
    with ej.default_precision("double"):
        if sys.argv[1] == "train":
            run_train(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5],
                      sys.argv[6] if len(sys.argv) > 6 else None)
        else:
            run_predict(sys.argv[2], sys.argv[3])
