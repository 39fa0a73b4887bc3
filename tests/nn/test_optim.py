"""Optimizers against NumPy transcriptions of PyTorch's update rules, over several steps of one
compiled routine whose learning rate follows a schedule without recompiling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tiny_mlp import tiny_mlp

import einjit as ej
from einjit import train
from einjit.ir import ops
from einjit.nn import optim, schedules
from einjit.tensor.notation import cd
from einjit.tensor.state import state

X = np.array([[0.5, -1.0, 2.0], [1.5, 0.3, -0.7]])
Y = np.array([1.0, -2.0])
W0 = np.array([0.2, -0.4, 0.9])


def _grad(w):
    """d/dw of sum((X @ w - Y)^2)."""
    return 2 * X.T @ (X @ w - Y)


def _sgd_ref(lrs, momentum=0.0, nesterov=False, wd=0.0):
    w, buf = W0.copy(), None
    for lr in lrs:
        g = _grad(w) + wd * w
        if momentum:
            buf = g if buf is None else momentum * buf + g
            g = g + momentum * buf if nesterov else buf
        w = w - lr * g
    return w


def _adam_ref(lrs, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, decoupled=False):
    w, m, v = W0.copy(), np.zeros(3), np.zeros(3)
    for t, lr in enumerate(lrs, start=1):
        g = _grad(w)
        if wd and not decoupled:
            g = g + wd * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        step = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        w = w - lr * (step + (wd * w if decoupled else 0))
    return w


def _train(make_opt, steps):
    with ej.default_precision("double"):
        w = ej.param("w", values=W0)
        x = ej.ndarray(X, batch_axes=1)
        y = ej.ndarray(Y[:, None], batch_axes=1)
        pred = ej.einsum("b|->i; i => b|->0", x, w)
        loss = ej.sum((pred - y) * (pred - y))
        train.init_params(loss)
        opt = make_opt(loss)
        routine = train.to_routine([train.grad_update(loss), opt.update()], name="opt_step")
        lrs = []
        for _ in range(steps):
            lrs.append(opt.step())
            routine()
        return w.value.numpy(), lrs


SCHEDULE = schedules.linear_warmup(schedules.cosine(0.05, 6), 3)
CASES = {
    "sgd": (lambda loss: optim.SGD(loss, SCHEDULE), lambda lrs: _sgd_ref(lrs)),
    "sgd_momentum_wd": (lambda loss: optim.SGD(loss, SCHEDULE, momentum=0.9, weight_decay=0.01),
                        lambda lrs: _sgd_ref(lrs, momentum=0.9, wd=0.01)),
    "sgd_nesterov": (lambda loss: optim.SGD(loss, 0.02, momentum=0.8, nesterov=True),
                     lambda lrs: _sgd_ref(lrs, momentum=0.8, nesterov=True)),
    "adam": (lambda loss: optim.Adam(loss, SCHEDULE), lambda lrs: _adam_ref(lrs)),
    "adam_l2": (lambda loss: optim.Adam(loss, 0.05, weight_decay=0.1), lambda lrs: _adam_ref(lrs, wd=0.1)),
    "adamw": (lambda loss: optim.AdamW(loss, schedules.step_decay(0.05, 2, 0.5), weight_decay=0.1),
              lambda lrs: _adam_ref(lrs, wd=0.1, decoupled=True)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_optimizer_matches_reference(name):
    make, ref = CASES[name]
    got, lrs = _train(make, 7)
    assert len(set(lrs)) > 1 or name in ("sgd_nesterov", "adam_l2")
    np.testing.assert_allclose(got, ref(lrs), rtol=1e-10, atol=1e-12)


def test_schedules():
    assert [schedules.step_decay(1.0, 2, 0.5)(k) for k in range(5)] == [1.0, 1.0, 0.5, 0.5, 0.25]
    cos = schedules.cosine(1.0, 4, 0.2)
    np.testing.assert_allclose([cos(k) for k in (0, 2, 4, 9)], [1.0, 0.6, 0.2, 0.2])
    warm = schedules.linear_warmup(2.0, 4)
    assert [warm(k) for k in range(6)] == [0.5, 1.0, 1.5, 2.0, 2.0, 2.0]
    assert math.isclose(SCHEDULE(0), 0.05 / 3)


def test_optimizer_without_parameters_is_an_error():
    with pytest.raises(ej.TensorError, match="no parameters"):
        optim.SGD([], 0.1)


NET = tiny_mlp(seed=1, batch=5, inputs=3, hidden=4)
XS, YS, W1, W2 = NET.xs, NET.ys, NET.w1, NET.w2
_mlp = NET.build


def _per_parameter_adamw(p, lr: float, step, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    """AdamW as if `train.adam_one` had no shared scalars (`train.adam_scalars`): every parameter
    computes its own `1 - b1`, step size `lr / (1 - b1 ** step)`, ..., one operation per
    assignment."""
    text = ('"adam_m" =: b1 * adam_m + (1 - b1) * p.grad; "adam_v" =: b2 * adam_v + (1 - b2) * (p.grad * p.grad); '
            '"step_size" =: lr / (1 - b1 ** step); "rbc2" =: 1 / sqrt(1 - b2 ** step); "lr_wd" =: lr * wd; '
            '"denom" =: sqrt(adam_v) * rbc2 + eps; "ratio" =: adam_m / denom; '
            'p =- lr_wd * p + step_size * ratio ~logic:"."')
    return cd(text, p=p, lr=lr, b1=b1, b2=b2, eps=eps, wd=wd, step=step).asgns


def test_adamw_shared_scalars_are_bit_identical_to_per_parameter_scalars():
    """Sharing the update's scalars over the parameters changes no bit of the parameters after
    several steps (float32, a matrix and a vector parameter)."""
    loss, shared_params = _mlp("s")
    opt = optim.AdamW(loss, 0.05, weight_decay=0.01)
    shared = train.to_routine([train.grad_update(loss), opt.update()], name="adamw_shared")
    loss_ref, ref_params = _mlp("r")
    count = state(["adamw_ref", "step"], 0.0, prec=ops.double)
    ref_update = [cd("n =+ 1", n=count.value).asgns, *[_per_parameter_adamw(p, 0.05, count) for p in ref_params]]
    ref = train.to_routine([train.grad_update(loss_ref), *ref_update], name="adamw_per_parameter")
    for _ in range(6):
        opt.step()
        shared()
        ref()
    for got, want in zip(shared_params, ref_params, strict=True):
        assert np.array_equal(got.value.numpy(), want.value.numpy())
    assert not np.array_equal(shared_params[0].value.numpy(), W1)


def test_adamw_matches_torch_over_several_steps():
    """`nn.AdamW` (shared scalars, float32) against `torch.optim.AdamW` on the same net, six steps."""
    torch = pytest.importorskip("torch")
    loss, params = _mlp("t")
    opt = optim.AdamW(loss, 0.05, weight_decay=0.1)
    step = train.to_routine([train.grad_update(loss), opt.update()], name="adamw_torch")
    tw1, tw2 = (torch.tensor(w, requires_grad=True) for w in (W1, W2))
    topt = torch.optim.AdamW([tw1, tw2], 0.05, weight_decay=0.1)
    for _ in range(6):
        opt.step()
        step()
        topt.zero_grad()
        pred = torch.tanh(torch.from_numpy(XS) @ tw1.T) @ tw2
        ((pred - torch.from_numpy(YS)) ** 2).sum().backward()
        topt.step()
    for got, want in zip(params, (tw1, tw2), strict=True):
        np.testing.assert_allclose(got.value.numpy(), want.detach().numpy(), rtol=2e-5, atol=2e-6)
    assert not np.allclose(params[0].value.numpy(), W1, atol=0.1)
