"""The second demo: a small convnet on scikit-learn's 8x8 handwritten digits (no download).

conv3x3(16, padding 1) → batchnorm → relu → maxpool2 → conv3x3(32, padding 1) → batchnorm →
relu → maxpool2 → flatten → dropout(0.1) → linear(128, 10) → cross-entropy, trained with Adam
under a cosine learning-rate schedule. The whole step — forward, backprop, update — is one
compiled routine reading `ej.input` batches; the evaluation graph is built on a second input
holding the test set, and `model.train()` / `model.eval()` switch the dropout and batch norms
of both compiled routines between epochs and evaluations. The train/test split is fixed
(seed 0) whatever `--seed` is, which only moves initialization, dropout and batch order.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import numpy as np

import einjit as ej
from einjit import nn
from einjit.demos.cli import EpochProgress, pyplot
from einjit.nn import schedules
from einjit.training import data, fit, train

N_CLASSES = 10
#: Defaults chosen for margin (with the batch norms): seeds 0-3 reach 355, 356, 354 and 356 of
#: the 359 test images (>= 0.986); without them, 15 epochs of 32 left seed 0 at 353 (0.983).
EPOCHS = 25
BATCH_SIZE = 64


@dataclass
class DigitsResult:
    test_accuracy: float
    final_loss: float
    epochs: int
    steps: int
    seconds: float
    compile_seconds: float
    seconds_per_step: float
    train_losses: list[float] = field(repr=False)
    test_losses: list[float] = field(repr=False)
    confusion: list[list[int]] = field(repr=False)


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """Images as `(n, 1, 8, 8)` float32 in [0, 1] and integer labels."""
    try:
        from sklearn.datasets import load_digits as sk_load
    except ImportError:
        raise SystemExit("einjit demo digits: needs scikit-learn for the digits dataset: "
                         "pip install 'einjit[datasets]'") from None
    bunch = sk_load()
    return (bunch.images / 16.0).astype(np.float32)[:, None], bunch.target.astype(np.int64)


def make_model(seed: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, label="conv1"), nn.BatchNorm(16, label="bn1"), nn.ReLU(),
        nn.MaxPool2d(2, label="pool1"),
        nn.Conv2d(16, 32, 3, padding=1, label="conv2"), nn.BatchNorm(32, label="bn2"), nn.ReLU(),
        nn.MaxPool2d(2, label="pool2"),
        nn.Flatten(), nn.Dropout(0.1, seed=seed, label="drop"), nn.Linear(128, N_CLASSES, label="fc"))


def run_digits(*, epochs: int = EPOCHS, batch_size: int = BATCH_SIZE, lr: float = 0.01, seed: int = 0,
               quiet: bool = False, plot: str | None = None) -> DigitsResult:
    images, labels = load_digits()
    (x_train, y_train), (x_test, y_test) = data.split(images, labels, test_fraction=0.2, seed=0)
    hot_train = nn.one_hot(y_train, N_CLASSES)
    hot_test = nn.one_hot(y_test, N_CLASSES)

    t0 = time.perf_counter()
    model = make_model(seed)
    x = ej.input("images", batch_dims=[batch_size], output_dims=[1, 8, 8])
    y = ej.input("labels", batch_dims=[batch_size], output_dims=[N_CLASSES])
    loss = nn.cross_entropy(model(x), y, label="loss")
    loader = data.Loader(x_train, hot_train, batch_size=batch_size, seed=seed)
    steps_per_epoch = len(loader)
    opt = nn.Adam(loss, schedules.cosine(lr, epochs * steps_per_epoch, lr / 20))
    train.init_params(loss, seed=seed)
    step = fit.train_step(loss, opt.update(), inputs=[x, y], name="digits_train_step")

    xt = ej.input("test_images", batch_dims=[len(x_test)], output_dims=[1, 8, 8])
    yt = ej.input("test_labels", batch_dims=[len(x_test)], output_dims=[N_CLASSES])
    test_logits = model(xt)
    test_loss = nn.cross_entropy(test_logits, yt, label="test_loss")
    evaluate = fit.forward_step([test_logits, test_loss], inputs=[xt, yt], name="digits_eval")
    compile_seconds = time.perf_counter() - t0

    train_losses: list[float] = []
    test_losses: list[float] = []
    progress = EpochProgress(epochs, quiet, "test_acc", "test accuracy", bar_digits=3, desc="digits")
    t1 = time.perf_counter()
    logits = np.zeros((len(x_test), N_CLASSES))
    for epoch in range(epochs):
        total = 0.0
        model.train()
        for xb, yb in loader:
            opt.step()
            step(xb, yb)
            total += step.loss_value()
        train_losses.append(total / steps_per_epoch)
        model.eval()
        logits, tl = evaluate(x_test, hot_test)
        test_losses.append(float(tl.reshape(-1)[0]))
        progress.update(epoch, train_losses[-1], float(np.mean(logits.argmax(-1) == y_test)))
    progress.close()
    seconds = time.perf_counter() - t1

    predicted = logits.argmax(-1)
    confusion = np.zeros((N_CLASSES, N_CLASSES), dtype=int)
    np.add.at(confusion, (y_test, predicted), 1)
    result = DigitsResult(float(np.mean(predicted == y_test)), train_losses[-1], epochs, epochs * steps_per_epoch,
                          seconds, compile_seconds, seconds / max(1, epochs * steps_per_epoch), train_losses,
                          test_losses, confusion.tolist())
    if plot:
        _plot(result, plot)
    return result


def _plot(result: DigitsResult, path: str) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    epochs = np.arange(1, result.epochs + 1)
    ax1.plot(epochs, result.train_losses, label="train (mean over the epoch)")
    ax1.plot(epochs, result.test_losses, label="test")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("cross-entropy")
    ax1.set_yscale("log")
    ax1.legend()
    ax1.set_title("einjit: digits convnet loss")
    conf = np.array(result.confusion)
    ax2.imshow(conf, cmap="Blues")
    for i in range(N_CLASSES):
        for j in range(N_CLASSES):
            if conf[i, j]:
                ax2.text(j, i, str(conf[i, j]), ha="center", va="center", fontsize=8,
                         color="white" if conf[i, j] > conf.max() / 2 else "black")
    ax2.set_xticks(range(N_CLASSES))
    ax2.set_yticks(range(N_CLASSES))
    ax2.set_xlabel("predicted")
    ax2.set_ylabel("true")
    ax2.set_title(f"test confusion matrix (accuracy {100 * result.test_accuracy:.2f}%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main_digits(args) -> int:
    result = run_digits(epochs=args.epochs, batch_size=args.batch_size, seed=args.seed, quiet=args.json,
                        plot=args.plot)
    if args.json:
        out = asdict(result)
        for key in ("train_losses", "test_losses"):
            out.pop(key)
        print(json.dumps(out))
    else:
        print(f"test accuracy {100 * result.test_accuracy:.2f}%, final training loss {result.final_loss:.4f} "
              f"({result.steps} steps in {result.seconds:.2f} s, {1e3 * result.seconds_per_step:.2f} ms/step; "
              f"compiled in {result.compile_seconds:.2f} s)")
        if args.plot:
            print(f"loss curves and confusion matrix written to {args.plot}")
    return 0
