"""Build and run one moons training step (the demo's model) in a fresh process.

`python moons_step.py [unrelated]`: with `unrelated`, first build tensors and symbols that
have nothing to do with the model, which shifts every process-global id. Prints the C
compiler's cache counters as JSON. Used by `test_stable_code.py` with `EINJIT_DUMP_DIR` set.
"""

from __future__ import annotations

import json
import sys

import numpy as np

import einjit as ej
from einjit import datasets, train
from einjit.backends.cc import toolchain as cc
from einjit.demos.moons import make_mlp
from einjit.ir.indexing import IntRef, get_static_symbol, get_symbol


def unrelated() -> None:
    for k in range(7):
        a = ej.ndarray(np.ones((3, k + 1)), label=f"noise{k}")
        train.forward(ej.relu(a * 2.0 + 1.0))
        get_symbol()
        get_static_symbol(5)


def main() -> None:
    if sys.argv[1:] == ["unrelated"]:
        unrelated()
    coords, labels = datasets.shuffled(*datasets.half_moons(20, seed=0, dtype=np.float32), seed=0)
    batch_n = get_static_symbol(4, "batch")
    step_n = get_static_symbol(None, "step")
    flat = ej.ndarray(coords.reshape(4, 10, 2), batch_axes=2, label="moons_flat")
    classes = ej.ndarray(labels.reshape(4, 10, 1), batch_axes=2, label="moons_classes")
    mlp = make_mlp()
    x, y = ej.batch_slice(flat, batch_n, label="moons_input"), ej.batch_slice(classes, batch_n, label="moons_class")
    margin = ej.relu(1 - y * mlp(x), label="margin_loss")
    loss = ej.div(ej.sum(margin, "...|... => 0"), 10, label="scalar_loss")
    learning_rate = ej.mul(0.1, (80 - ej.embed_symbol(step_n)) / 40, label="learning_rate")
    train.init_params(loss, seed=0)
    sgd = train.sgd_update(loss, learning_rate, weight_decay=1e-4)
    refs = {batch_n: IntRef(0), step_n: IntRef(0)}
    step = train.to_routine([train.grad_update(loss), sgd], bindings=refs, name="moons_train_step")
    losses = []
    for k in range(8):
        refs[batch_n].value, refs[step_n].value = k % 4, k
        step()
        losses.append(float(loss.value.numpy().ravel()[0]))
    print(json.dumps({"compiler_invocations": cc.stats.compiler_invocations, "cache_hits": cc.stats.cache_hits,
                      "losses": losses}))


if __name__ == "__main__":
    main()
