"""The third demo: a character-level GPT on the text of Python's own help topics.

The corpus is `pydoc_data.topics` (the documentation `help("topic")` prints), which ships with
Python, so nothing is downloaded. Characters outside printable ASCII become `?`. The first 90%
is for training, the rest for validation. A batch is `batch_size` windows of `block_size + 1`
characters at offsets drawn from a seeded generator (`batch_offsets`), so PyTorch can be
trained on exactly the same batches (`benchmarks/bench_gpt.py`). The model is
`models.GPT` (pre-LayerNorm blocks, causal attention, tied head) trained with AdamW; the
whole step — forward, backprop, update — is one compiled routine. Validation runs a second
compiled routine of the same model on fixed validation windows; after training the weights
are saved as a safetensors checkpoint and a sample is generated.
"""

from __future__ import annotations

import json
import string
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

import einjit as ej
from einjit import nn
from einjit.demos.cli import EpochProgress, pyplot
from einjit.models import GPT, GPTConfig
from einjit.models.generate import Generator
from einjit.training import checkpoint, fit, train

ALPHABET = "\n" + string.printable[:95]
UNKNOWN = "?"


@dataclass(frozen=True)
class GPTDemoConfig:
    """The defaults train in about a minute per epoch on two cores."""

    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    block_size: int = 32
    batch_size: int = 32
    steps_per_epoch: int = 100
    epochs: int = 4
    lr: float = 3e-3
    weight_decay: float = 0.01
    val_batches: int = 4
    seed: int = 0


@dataclass
class GPTDemoResult:
    val_loss: float
    train_loss: float
    epochs: int
    steps: int
    params: int
    seconds: float
    compile_seconds: float
    seconds_per_step: float
    sample: str
    checkpoint: str | None
    train_losses: list[float] = field(repr=False)
    val_losses: list[float] = field(repr=False)


def corpus() -> str:
    """The help topics in sorted order, one string."""
    from pydoc_data.topics import topics
    return "".join(topics[k] for k in sorted(topics))


def encode(text: str) -> np.ndarray:
    index = {c: k for k, c in enumerate(ALPHABET)}
    unknown = index[UNKNOWN]
    return np.array([index.get(c, unknown) for c in text], dtype=np.int64)


def decode(ids) -> str:
    return "".join(ALPHABET[int(i)] for i in ids)


def split(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cut = int(0.9 * len(ids))
    return ids[:cut], ids[cut:]


def batch_offsets(n_ids: int, block_size: int, batch_size: int, steps: int, seed: int) -> np.ndarray:
    """`(steps, batch_size)` window starts, the data order of a run (PyTorch uses the same)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_ids - block_size - 1, (steps, batch_size))


def windows(ids: np.ndarray, offsets: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and next-character targets `(batch, block_size)` at `offsets`."""
    idx = offsets[:, None] + np.arange(block_size)[None, :]
    return ids[idx].astype(np.int32), ids[idx + 1].astype(np.int32)


def val_offsets(n_ids: int, cfg: GPTDemoConfig) -> np.ndarray:
    return batch_offsets(n_ids, cfg.block_size, cfg.batch_size, cfg.val_batches, seed=10_000 + cfg.seed)


def model_config(cfg: GPTDemoConfig) -> GPTConfig:
    return GPTConfig(vocab_size=len(ALPHABET), block_size=cfg.block_size, n_layer=cfg.n_layer, n_head=cfg.n_head,
                     d_model=cfg.d_model)


def run_gpt(cfg: GPTDemoConfig = GPTDemoConfig(), *, quiet: bool = False, plot: str | None = None,
            checkpoint_path: str | None = None, sample_chars: int = 200, prompt: str = "The ",
            on_init: Callable[[GPT], None] | None = None) -> GPTDemoResult:
    """Train, validate, save, sample. `on_init(model)` sees the initial weights (a benchmark
    copies them into PyTorch)."""
    train_ids, val_ids = split(encode(corpus()))
    mcfg = model_config(cfg)
    t0 = time.perf_counter()
    model = GPT(mcfg, seed=cfg.seed)
    dims = [cfg.batch_size, cfg.block_size]
    x, y = ej.input("tokens", batch_dims=dims, prec="int32"), ej.input("targets", batch_dims=dims, prec="int32")
    loss = nn.cross_entropy(model(x), y, label="loss")
    opt = nn.AdamW(model.params(), cfg.lr, weight_decay=cfg.weight_decay)
    train.init_params(loss, seed=cfg.seed)
    if on_init is not None:
        on_init(model)
    step = fit.train_step(loss, opt.update(), inputs=[x, y], name="gpt_train_step")
    xv = ej.input("val_tokens", batch_dims=dims, prec="int32")
    yv = ej.input("val_targets", batch_dims=dims, prec="int32")
    val_loss_t = nn.cross_entropy(model(xv), yv, label="val_loss")
    evaluate = fit.forward_step(val_loss_t, inputs=[xv, yv], name="gpt_val")
    generator = Generator(model, batch_size=1) if sample_chars else None
    compile_seconds = time.perf_counter() - t0

    offsets = batch_offsets(len(train_ids), cfg.block_size, cfg.batch_size, cfg.epochs * cfg.steps_per_epoch,
                            cfg.seed)
    vals = [windows(val_ids, o, cfg.block_size) for o in val_offsets(len(val_ids), cfg)]
    train_losses: list[float] = []
    val_losses: list[float] = []
    progress = EpochProgress(cfg.epochs, quiet, "val_loss", "validation loss", desc="gpt")
    t1 = time.perf_counter()
    for epoch in range(cfg.epochs):
        model.train()
        total = 0.0
        for k in range(cfg.steps_per_epoch):
            xb, yb = windows(train_ids, offsets[epoch * cfg.steps_per_epoch + k], cfg.block_size)
            opt.step()
            step(xb, yb)
            total += step.loss_value()
        train_losses.append(total / cfg.steps_per_epoch)
        model.eval()
        val_losses.append(float(np.mean([evaluate(a, b).reshape(-1)[0] for a, b in vals])))
        progress.update(epoch, train_losses[-1], val_losses[-1])
    progress.close()
    seconds = time.perf_counter() - t1
    if checkpoint_path:
        checkpoint.save(model.named_params(), checkpoint_path, metadata={"config": json.dumps(asdict(mcfg))})
    sample = "" if generator is None else decode(
        generator.generate(encode(prompt)[None], sample_chars, temperature=0.8, top_k=20, seed=cfg.seed)[0])
    steps = cfg.epochs * cfg.steps_per_epoch
    result = GPTDemoResult(val_losses[-1], train_losses[-1], cfg.epochs, steps, model.num_params(), seconds,
                           compile_seconds, seconds / steps, sample, checkpoint_path, train_losses, val_losses)
    if plot:
        _plot(result, plot)
    return result


def _plot(result: GPTDemoResult, path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    epochs = np.arange(1, result.epochs + 1)
    ax.plot(epochs, result.train_losses, label="train (mean over the epoch)")
    ax.plot(epochs, result.val_losses, label="validation")
    ax.set_xlabel("epoch")
    ax.set_ylabel("cross-entropy (nats per character)")
    ax.legend()
    ax.set_title(f"einjit: char-level GPT ({result.params} parameters)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main_gpt(args) -> int:
    cfg = GPTDemoConfig(n_layer=args.layers, d_model=args.d_model, block_size=args.block_size,
                        batch_size=args.batch_size, steps_per_epoch=args.steps, epochs=args.epochs, lr=args.lr,
                        seed=args.seed)
    result = run_gpt(cfg, quiet=args.json, plot=args.plot, checkpoint_path=args.checkpoint,
                     sample_chars=args.sample_chars)
    if args.json:
        out = asdict(result)
        for key in ("train_losses", "val_losses"):
            out.pop(key)
        print(json.dumps(out))
    else:
        print(f"validation loss {result.val_loss:.4f}, training loss {result.train_loss:.4f} ({result.steps} steps "
              f"in {result.seconds:.1f} s, {1e3 * result.seconds_per_step:.1f} ms/step; compiled in "
              f"{result.compile_seconds:.1f} s; {result.params} parameters)")
        if result.checkpoint:
            print(f"checkpoint written to {result.checkpoint}")
        if args.plot:
            print(f"loss curves written to {args.plot}")
        print("sample:")
        print(result.sample)
    return 0
