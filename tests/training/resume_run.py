"""Run as a script: build the shared MLP, optionally load a checkpoint, train some epochs,
save a checkpoint. `python resume_run.py START EPOCHS MOMENTUM OUT [IN]`.

With momentum, the optimizer's momentum buffers are part of the training state: they are
made hosted before compiling and saved next to the parameters and the learning rate."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import einjit as ej
from einjit import data, fit, train
from mlp_model import build, dataset


def run(start: int, epochs: int, momentum: float, out: str, source: str | None) -> None:
    xs, ys = dataset(1000)
    with ej.default_precision("double"):
        _, inputs, loss, lr = build(64, weighted=True, init=source is None)
        state = {p.label_str: p for p in loss.params()} | {"lr": lr}
        updates = []
        for p in loss.params():
            code = train.sgd_one(p, lr, momentum=momentum)
            updates.append(code.asgns)
            if momentum:
                state[f"{p.label_str}.momentum"] = code.sgd_momentum.hosted()
        if source is not None:
            ej.load(state, source)
        step = fit.train_step(loss, updates, inputs=inputs)
        loader = data.Loader(xs, ys, batch_size=64, seed=11, drop_last=False, weights=True)
        fit.fit(step, loader, epochs=epochs, start_epoch=start, progress=False,
                on_epoch=lambda e, _: lr.set_values(0.1 / (2 + e)))
        ej.save(state, out)


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
