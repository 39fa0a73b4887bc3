"""Training code: gradients, the optimizers' updates, parameter initialization, small loops.

Everything a step needs — forward, zeroing gradients, backprop, the optimizer update — is
assignments, so `to_routine` (the one compile path, `training/step.py`) compiles a whole
training step into one routine of a backend (`einjit.backends.get`): on the C backend, one
ctypes call per step, no Python in the loop body. This module owns each optimizer's update
code (`sgd_update`, `adam_update`); `einjit.nn.optim` wraps them as objects.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from einjit import shape as sh
from einjit.backends.interface import Routine
from einjit.ir import assignments as asg
from einjit.ir import bf16
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.naming import node_base
from einjit.tensor.notation import Code, cd
from einjit.tensor.operation import copy_value
from einjit.tensor.tensor import (
    Tensor,
    TensorError,
    consume_backprop_code,
    consume_forward_code,
    is_forward_root,
)
from einjit.training import mixed_precision as mixed
from einjit.training.step import forward_code, to_routine

Asgns = asg.Asgns


def forward(t: Tensor) -> Asgns:
    """The forward code of `t`'s subtree; `t`'s value becomes readable from the host."""
    t.hosted()
    return asg.BlockComment(f"forward {t.label_str}", consume_forward_code(t))


def grad_update(loss: Tensor, *, mixed_precision: str | None = None) -> Asgns:
    """Forward, zero the gradients, `loss.grad =: 1`, backprop — the seed's order.
    `mixed_precision="bf16"`: the forward and backprop read bf16 copies of the parameters and
    store activations in bf16, and their contractions read bf16 copies of their other float32
    operands (inputs, gradients); parameters, gradients and the optimizers' updates stay float32
    (`einjit.training.mixed_precision`)."""
    storage = mixed.check_mode(mixed_precision)
    if loss.grad_tn is None:
        raise TensorError(f"einjit: grad_update needs a differentiable loss; {loss.label_str} has no "
                          f"parameters under it")
    loss.hosted()
    fwd = consume_forward_code(loss)
    zeros = [asg.Fetch(t.grad_tn, asg.FetchConstant(0.0)) for t in loss.subtree() if t.grad_tn is not None]
    bprop = consume_backprop_code(loss)
    code = asg.sequence(
        asg.BlockComment(f"forward {loss.label_str}", fwd),
        asg.BlockComment("zero gradients", asg.sequence(*zeros)),
        asg.BlockComment(f"backprop {loss.label_str}", asg.sequence(
            cd("g =: 1", g=loss.grad).asgns, bprop)))
    if storage is None:
        return code
    return mixed.parameter_copies(loss, mixed.bf16_operands(loss, mixed.bf16_activations(loss, code)))


def _params_of(x: "Tensor | Iterable[Tensor]") -> list[Tensor]:
    if isinstance(x, Tensor):
        ps = x.params()
        if not ps:
            raise TensorError(f"einjit: tensor {x.label_str} has no parameters to update")
        return ps
    return list(x)


def sgd_one(p: Tensor, learning_rate: Tensor | float, *, weight_decay: float = 0.0, momentum: float = 0.0,
            nesterov: bool = False) -> Code:
    """One parameter's SGD step in `%cd`: decoupled from the loss so it fuses into the step.
    One `~fused` group (one loop nest, no intermediate tensors): the momentum buffer, then
    the parameter."""
    delta = "(p.grad + wd * p)"
    text = []
    if momentum > 0.0:
        text.append(f'"sgd_momentum" =: mom * sgd_momentum + {delta}')
        delta = f"({delta} + mom * sgd_momentum)" if nesterov else "sgd_momentum"
    text.append(f"p =- lr * {delta}")
    fused = cd(f'~fused({"; ".join(text)})', p=p, lr=learning_rate, wd=weight_decay, mom=momentum)
    return Code(asg.BlockComment(f"sgd {p.label_str}", fused.asgns), fused.decls)


def sgd_update(loss_or_params: "Tensor | Iterable[Tensor]", learning_rate: Tensor | float, *,
               weight_decay: float = 0.0, momentum: float = 0.0, nesterov: bool = False) -> Asgns:
    """SGD over all parameters under a loss (or the given parameters)."""
    if nesterov and momentum <= 0.0:
        raise TensorError("einjit: Nesterov momentum needs momentum > 0")
    return asg.sequence(*[sgd_one(p, learning_rate, weight_decay=weight_decay, momentum=momentum,
                                  nesterov=nesterov).asgns for p in _params_of(loss_or_params)])


def adam_scalars(step: Tensor, learning_rate: Tensor | float, *, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.0) -> Code:
    """The scalars of Adam's update that do not depend on the parameter, computed once per step
    for an update of many parameters (`adam_one`'s `scalars`): the betas and `1 - beta`, the
    bias corrections `1 - beta ** step`, eps, and the scalars that fold the bias corrections and
    the learning rate as PyTorch's `_single_tensor_adam` does — the step size `lr / bc1`, the
    reciprocal `1 / sqrt(bc2)` and the decay `lr * wd`. Each element then needs one sqrt and
    one division (`adam_one`), where dividing by the bias corrections per element took three
    divisions and a sqrt, the divider's throughput bounding the whole update."""
    text = ['"adam_b1" =: b1', '"adam_b2" =: b2', '"adam_c1" =: 1 - b1', '"adam_c2" =: 1 - b2',
            '"adam_bc1" =: 1 - b1 ** step', '"adam_bc2" =: 1 - b2 ** step', '"adam_eps" =: eps',
            '"adam_wd" =: wd', '"adam_step_size" =: lr / adam_bc1', '"adam_rbc2" =: 1 / sqrt(adam_bc2)',
            '"adam_lr_wd" =: lr * wd']
    return cd(f'~~("adam scalars"; {"; ".join(text)})', b1=beta1, b2=beta2, eps=eps, wd=weight_decay, step=step,
              lr=learning_rate)


_ADAM_SCALARS = ("b1", "b2", "c1", "c2", "eps", "wd", "step_size", "rbc2", "lr_wd")


def adam_one(p: Tensor, learning_rate: Tensor | float, *, step: Tensor, beta1: float = 0.9, beta2: float = 0.999,
             eps: float = 1e-8, weight_decay: float = 0.0, decoupled: bool = True,
             scalars: Code | None = None) -> Code:
    """One parameter's Adam step in `%cd`. Weight decay is decoupled (`p -= lr * wd * p`, AdamW)
    or, with `decoupled=False`, added to the gradient as L2 (PyTorch's Adam). `scalars`: the
    `adam_scalars` of the same settings and learning rate, shared by the parameters of one
    update (without, the code computes its own first).

    One `~fused` group: the moments and the parameter of a cell in one loop nest, each right-hand
    side one expression. The parameter moves by `step_size * m / (sqrt(v) * rbc2 + eps)`, the
    bias-corrected `m / bc1 / (sqrt(v / bc2) + eps)` with the corrections folded into the
    scalars: one sqrt and one division per element, as PyTorch's update (whose
    `sqrt(v) / sqrt(bc2)` this multiplies by the reciprocal instead, the last bits aside)."""
    coupled = not decoupled and weight_decay != 0.0
    grad = "(p.grad + wd * p)" if coupled else "p.grad"
    step_of = "step_size * (adam_m / (sqrt(adam_v) * rbc2 + eps))"
    decay = decoupled and weight_decay != 0.0
    text = [f'"adam_m" =: b1 * adam_m + c1 * {grad}',
            f'"adam_v" =: b2 * adam_v + c2 * ({grad} * {grad})',
            f"p =- lr_wd * p + {step_of}" if decay else f"p =- {step_of}"]
    own = scalars is None
    if scalars is None:
        scalars = adam_scalars(step, learning_rate, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
    shared = {k: scalars[f"adam_{k}"] for k in _ADAM_SCALARS}
    # the comment outside the text: one text for every parameter, parsed once
    fused = cd(f'~fused({"; ".join(text)})', p=p, **shared)
    code = Code(asg.BlockComment(f"adam {p.label_str}", fused.asgns), fused.decls)
    # labelled after the parameter, as when the first tensor named was the gradient, not a scalar
    for name in ("adam_m", "adam_v"):
        code[name].relabel([name, *p.label], code[name].scope)
    return Code(asg.sequence(scalars.asgns, code.asgns), code.decls) if own else code


def adam_update(loss_or_params: "Tensor | Iterable[Tensor]", learning_rate: Tensor | float, *, step: Tensor,
                beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                decoupled: bool = True) -> Asgns:
    """Adam over all parameters under a loss (or the given parameters); `step` counts from 1.
    Weight decay as in `adam_one`; the scalars every parameter's update uses are computed
    once (`adam_scalars`)."""
    scalars = adam_scalars(step, learning_rate, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
    return asg.sequence(scalars.asgns, *[adam_one(p, learning_rate, step=step, beta1=beta1, beta2=beta2, eps=eps,
                                                  weight_decay=weight_decay, decoupled=decoupled,
                                                  scalars=scalars).asgns
                                         for p in _params_of(loss_or_params)])


def init_params(t: "Tensor | Iterable[Tensor]", *, seed: int = 0) -> None:
    """Give every parameter under `t` its initial values (in place, on the host)."""
    sh.finish_inference()
    rng = np.random.default_rng(seed)
    for p in _params_of(t) if isinstance(t, Tensor) else dict.fromkeys(q for x in t for q in _params_of(x)):
        assert p.init is not None  # `param` gives every parameter its initializer
        values = bf16.as_cells(p.init(rng), p.value_tn.prec)
        host = p.value_tn.host_array()
        host[...] = values.reshape(host.shape)


def run(routine: Routine) -> None:
    routine()


def sequential_loop(bindings: Mapping[StaticSymbol, IntRef], f: Callable[[], None]) -> None:
    """Call `f` for every combination of the ranged static symbols' values, the first symbol
    outermost; symbols without a range are left to the caller."""
    ranged = [(s, r) for s, r in bindings.items() if s.static_range is not None]
    limits = [s.static_range for s, _ in ranged if s.static_range is not None]  # all of them
    for values in itertools.product(*[range(n) for n in limits]):
        for (_, r), v in zip(ranged, values, strict=True):
            r.value = v
        f()


def readable(t: Tensor) -> Tensor:
    """A tensor with `t`'s value that the next routine can leave on the host: `t` made hosted,
    or — when a routine compiled before keeps `t`'s node only inside itself (routine-local or
    virtual) — a copy of `t` (`copy_value`), whose routine recomputes `t` on the way
    (`step.forward_code`). Reading a result never fails because of where an earlier routine
    chose to keep it."""
    if t.value_tn.can_be_hosted():
        return t.hosted()
    return copy_value(t, label=[*t.label, "read"]).hosted()


_once_cache: dict[int, tuple[Routine, Tensor]] = {}
_update_cache: dict[int, Routine] = {}


def forward_once(t: Tensor, *, backend: Any = None, context: Any = None) -> np.ndarray:
    """Compile (once) and run the forward code of `t`; return its value (read-only).

    A forward root's code is consumed, as `forward` does; the code of a tensor a routine has
    compiled already (a training step's output) is recomputed (`step.forward_code`), through a copy
    when that routine kept the tensor inside itself (`readable`)."""
    cached = _once_cache.get(t.id)
    if cached is None:
        if any(p.value_tn.array is None for p in t.params()):
            init_params(t)
        if is_forward_root(t):
            target, code = t, forward(t)
        else:
            target = readable(t)
            code = forward_code(target)
        cached = _once_cache[t.id] = (to_routine(code, name=f"forward_{node_base(t.value_tn.label)}",
                                                 backend=backend, context=context), target)
    routine, target = cached
    routine()
    return target.value.numpy()


def update_once(loss: Tensor, *, learning_rate: float = 0.1, backend: Any = None, context: Any = None) -> float:
    """Compile (once) and run one gradient + SGD step on `loss`; return the loss value."""
    routine = _update_cache.get(loss.id)
    if routine is None:
        if any(p.value_tn.array is None for p in loss.params()):
            init_params(loss)
        grads = grad_update(loss)
        routine = _update_cache[loss.id] = to_routine([grads, sgd_update(loss, learning_rate)],
                                                name=f"update_{node_base(loss.value_tn.label)}", backend=backend,
                                                context=context)
    routine()
    return float(loss.value.numpy().ravel()[0])
