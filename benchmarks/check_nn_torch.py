"""einjit.nn against PyTorch: every layer and loss on random inputs, forward values and gradients.

For each case einjit builds `loss = sum(out * r)` (or the loss itself) in float32, runs forward
and backprop in one compiled routine, copies its initial parameters into the PyTorch module, and
prints the largest absolute and relative differences of the output and of every gradient (the
input's included). Needs torch (installed for benchmarks only; einjit never imports it):

    PYTHONPATH=src python benchmarks/check_nn_torch.py [--tolerance 1e-5]

Exits 1 when a difference exceeds the tolerance (relative, against the larger magnitude).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    raise SystemExit("check_nn_torch: needs PyTorch (pip install torch)") from None

import einjit as ej
from einjit import nn, train


@dataclass
class Case:
    name: str
    input_shape: tuple[int, ...]
    layer: Callable[[], object]
    #: PyTorch's function of (input, einjit layer, einjit parameter arrays) -> (output, torch parameters).
    torch_fn: Callable
    is_loss: bool = False
    #: PyTorch's side needs einjit's dropout mask (its random numbers are drawn differently).
    needs_mask: bool = False


def _errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    scale = np.maximum(np.abs(want).max(initial=0.0), 1e-30)
    return float(diff.max(initial=0.0)), float(diff.max(initial=0.0) / scale)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(np.ascontiguousarray(a), dtype=torch.float32, requires_grad=True)


def _conv_torch(stride=1, padding=0, dilation=1):
    def run(x, layer, ps):
        w, b = (_tensor(p) for p in ps)
        return F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation), [w, b]
    return run


def _batch_norm_torch(training: bool):
    def run(x, layer, ps):
        gamma, beta = (_tensor(p) for p in ps)
        rm = torch.zeros(layer.num_features, dtype=torch.float32)
        rv = torch.ones(layer.num_features, dtype=torch.float32)
        if not training:  # the same running statistics einjit's eval reads: a few batches of training first
            rm, rv = torch.tensor(layer.running_mean.value.numpy()), torch.tensor(layer.running_var.value.numpy())
        return F.batch_norm(x, rm, rv, gamma, beta, training=training, momentum=layer.momentum, eps=layer.eps), \
            [gamma, beta]
    return run


LABELS = np.array([3, 0, 9, 4, 4, 1])
TARGET01 = (np.random.default_rng(7).uniform(size=(6, 10)) > 0.5).astype(np.float32)
TARGET_PM1 = 2 * TARGET01 - 1


CASES = [
    Case("Linear", (6, 20), lambda: nn.Linear(20, 7, label="t_fc"),
         lambda x, layer, ps: (lambda w, b: (F.linear(x, w, b), [w, b]))(*(_tensor(p) for p in ps))),
    Case("Conv2d 3x3", (2, 3, 9, 8), lambda: nn.Conv2d(3, 4, 3, label="t_conv"), _conv_torch()),
    Case("Conv2d stride 2 padding 1", (2, 3, 9, 8), lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1, label="t_convs"),
         _conv_torch(stride=2, padding=1)),
    Case("Conv2d dilation 2", (2, 3, 9, 8), lambda: nn.Conv2d(3, 2, 2, dilation=2, label="t_convd"),
         _conv_torch(dilation=2)),
    Case("MaxPool2d 2", (2, 3, 8, 8), lambda: nn.MaxPool2d(2), lambda x, layer, ps: (F.max_pool2d(x, 2), [])),
    Case("MaxPool2d 3 stride 2", (2, 3, 9, 9), lambda: nn.MaxPool2d(3, 2),
         lambda x, layer, ps: (F.max_pool2d(x, 3, 2), [])),
    Case("AvgPool2d 2", (2, 3, 8, 8), lambda: nn.AvgPool2d(2), lambda x, layer, ps: (F.avg_pool2d(x, 2), [])),
    Case("AvgPool2d 3 stride 1", (2, 3, 7, 7), lambda: nn.AvgPool2d(3, 1),
         lambda x, layer, ps: (F.avg_pool2d(x, 3, 1), [])),
    Case("Flatten", (3, 4, 5, 6), lambda: nn.Flatten(), lambda x, layer, ps: (torch.flatten(x, 1), [])),
    Case("ReLU", (4, 9), lambda: nn.ReLU(), lambda x, layer, ps: (F.relu(x), [])),
    Case("LayerNorm", (4, 3, 10), lambda: nn.LayerNorm(10, label="t_ln"),
         lambda x, layer, ps: (lambda g, b: (F.layer_norm(x, (10,), g, b, eps=layer.eps), [g, b]))(
             *(_tensor(p) for p in ps))),
    Case("BatchNorm (train)", (8, 3, 4, 4), lambda: nn.BatchNorm(3, label="t_bn"), _batch_norm_torch(True)),
    Case("BatchNorm (eval)", (8, 3, 4, 4), lambda: nn.BatchNorm(3, label="t_bne"), _batch_norm_torch(False)),
    Case("Dropout (eval)", (4, 9), lambda: nn.Dropout(0.4, label="t_drop").eval(),
         lambda x, layer, ps: (F.dropout(x, 0.4, training=False), [])),
    Case("Dropout (train, einjit's mask)", (40, 50), lambda: nn.Dropout(0.4, label="t_dropt"),
         lambda x, layer, ps, mask: (x * torch.tensor(mask) / (1 - 0.4), []), needs_mask=True),
    Case("softmax", (4, 9), lambda: ej.softmax, lambda x, layer, ps: (F.softmax(x, -1), [])),
    Case("log_softmax", (4, 9), lambda: ej.log_softmax, lambda x, layer, ps: (F.log_softmax(x, -1), [])),
    Case("logsumexp", (4, 9), lambda: ej.logsumexp, lambda x, layer, ps: (torch.logsumexp(x, -1), [])),
    Case("softplus", (4, 9), lambda: ej.softplus, lambda x, layer, ps: (F.softplus(x), [])),
    Case("gelu", (4, 9), lambda: ej.gelu, lambda x, layer, ps: (F.gelu(x), [])),
    Case("leaky_relu", (4, 9), lambda: ej.leaky_relu, lambda x, layer, ps: (F.leaky_relu(x, 0.01), [])),
    Case("cross_entropy (labels, mean)", (6, 10), lambda: (lambda z: nn.cross_entropy(z, LABELS)),
         lambda x, layer, ps: (F.cross_entropy(x, torch.tensor(LABELS)), []), is_loss=True),
    Case("cross_entropy (labels, sum)", (6, 10), lambda: (lambda z: nn.cross_entropy(z, LABELS, reduction="sum")),
         lambda x, layer, ps: (F.cross_entropy(x, torch.tensor(LABELS), reduction="sum"), []), is_loss=True),
    Case("cross_entropy (logits x1e4)", (6, 10), lambda: (lambda z: nn.cross_entropy(z * 1e4, LABELS)),
         lambda x, layer, ps: (F.cross_entropy(x * 1e4, torch.tensor(LABELS)), []), is_loss=True),
    Case("mse", (6, 10), lambda: (lambda z: nn.mse(z, ej.ndarray(TARGET01, batch_axes=1))),
         lambda x, layer, ps: (F.mse_loss(x, torch.tensor(TARGET01)), []), is_loss=True),
    Case("bce_with_logits", (6, 10), lambda: (lambda z: nn.bce_with_logits(z, ej.ndarray(TARGET01, batch_axes=1))),
         lambda x, layer, ps: (F.binary_cross_entropy_with_logits(x, torch.tensor(TARGET01)), []), is_loss=True),
    Case("hinge", (6, 10), lambda: (lambda z: nn.hinge(z, ej.ndarray(TARGET_PM1, batch_axes=1))),
         lambda x, layer, ps: (torch.clamp(1 - torch.tensor(TARGET_PM1) * x, min=0).mean(), []), is_loss=True),
]


def _warm_running_statistics(layer, shape: tuple[int, ...], rng: np.random.Generator) -> None:
    """A few training batches, so that the eval case reads non-trivial running statistics."""
    x = ej.input("warm_x", batch_dims=[shape[0]], output_dims=list(shape[1:]))
    out = layer(x)
    train.init_params(out, seed=3)
    step = ej.fit.forward_step(out, inputs=[x], name="warm")
    for _ in range(3):
        step(rng.standard_normal(shape).astype(np.float32) * 2 + 1)
    layer.eval()


def check(case: Case, rng: np.random.Generator) -> list[tuple[str, float, float]]:
    x_np = (rng.standard_normal(case.input_shape) * 2).astype(np.float32)
    layer = case.layer()
    if case.name == "BatchNorm (eval)":
        _warm_running_statistics(layer, case.input_shape, rng)
    xp = ej.param(f"x_{len(case.name)}_{rng.integers(1 << 30)}", values=x_np, output_dims=list(case.input_shape))
    axes = ", ".join(f"a{k}" for k in range(1, len(case.input_shape)))
    x = ej.einsum(f"b, {axes} => b | -> {axes}", xp)
    out = layer(x)
    r_np = None
    if case.is_loss:
        loss = out
    else:
        ej.shape.finish_inference()
        r_np = rng.standard_normal(out.dims).astype(np.float32)
        loss = ej.sum(out.hosted() * ej.ndarray(r_np, batch_axes=1), label="check_loss")
    train.init_params(loss, seed=int(rng.integers(1 << 30)))
    train.to_routine(train.grad_update(loss), name="check")()
    params = [p for p in loss.params() if p is not xp]
    got_out = (loss if case.is_loss else out).value.numpy()

    xt = _tensor(x_np)
    extra = [got_out.reshape(case.input_shape) != 0] if case.needs_mask else []
    want_out, torch_params = case.torch_fn(xt, layer, [p.value.numpy() for p in params], *extra)
    torch_loss = want_out if case.is_loss else (want_out * torch.tensor(r_np)).sum()
    torch_loss.backward()
    rows = [("forward", *_errors(got_out.reshape(want_out.shape), want_out.detach().numpy()))]
    rows.append(("grad input", *_errors(xp.grad.numpy(), xt.grad.numpy())))
    for p, tp in zip(params, torch_params, strict=True):
        rows.append((f"grad {p.label_str}", *_errors(p.grad.numpy(), tp.grad.numpy())))
    return rows


def check_embedding(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    """Indices are not differentiable: the output and the table's gradient."""
    emb = nn.Embedding(11, 5, label="t_emb")
    idx = rng.integers(0, 11, (4, 6))
    out = emb(idx).hosted()
    ej.shape.finish_inference()
    r_np = rng.standard_normal(out.dims).astype(np.float32)
    loss = ej.sum(out * ej.ndarray(r_np, batch_axes=2), label="check_emb_loss")
    train.init_params(loss, seed=5)
    train.to_routine(train.grad_update(loss), name="check_emb")()
    (table,) = emb.params()
    weight = _tensor(table.value.numpy().T)
    want = F.embedding(torch.tensor(idx), weight)
    (want * torch.tensor(r_np)).sum().backward()
    return [("forward", *_errors(out.value.numpy(), want.detach().numpy())),
            (f"grad {table.label_str}", *_errors(table.grad.numpy().T, weight.grad.numpy()))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tolerance", type=float, default=1e-5, help="largest relative difference accepted")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    print(f"einjit.nn vs PyTorch {torch.__version__}, float32; max |einjit - torch|, and relative to max |torch|")
    print(f"{'case':32s} {'quantity':22s} {'max abs':>10s} {'max rel':>10s}")
    worst = 0.0
    results = [(case.name, check(case, rng)) for case in CASES] + [("Embedding", check_embedding(rng))]
    for name, rows in results:
        for what, abs_err, rel_err in rows:
            worst = max(worst, rel_err)
            flag = "" if rel_err <= args.tolerance else "  <-- over tolerance"
            print(f"{name:32s} {what:22s} {abs_err:10.2e} {rel_err:10.2e}{flag}")
    print(f"worst relative difference {worst:.2e} (tolerance {args.tolerance:.0e})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
