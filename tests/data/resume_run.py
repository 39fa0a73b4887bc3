"""Run as a script: build the shared MLP, optionally load a checkpoint, train some epochs,
save a checkpoint. `python resume_run.py START EPOCHS OUT [IN]`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from mlp_model import build, dataset

import einjit as ej
from einjit import data, fit, train


def run(start: int, epochs: int, out: str, source: str | None) -> None:
    xs, ys = dataset(1000)
    with ej.default_precision("double"):
        mlp, inputs, loss, lr = build(64, weighted=True, init=source is None)
        state = [*loss.params(), lr]
        if source is not None:
            ej.load(state, source)
        step = fit.train_step(loss, train.sgd_update(loss, lr, momentum=0.0), inputs=inputs)
        loader = data.Loader(xs, ys, batch_size=64, seed=11, drop_last=False, weights=True)
        fit.fit(step, loader, epochs=epochs, start_epoch=start, progress=False,
                on_epoch=lambda e, _: lr.set_values(0.1 / (2 + e)))
        ej.save(state, out)


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
