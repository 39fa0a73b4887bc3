"""Training: gradient and update code, parameter initialization, compiling to routines, loops.

Everything a step needs — forward, zeroing gradients, backprop, the optimizer update — is
assignments, so `to_routine` compiles a whole training step into one routine of a backend
(`einjit.backends.get`): on the C backend, one ctypes call per step, no Python in the loop body.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Callable, Iterable, Mapping, Sequence, cast

import numpy as np

from einjit import backends, config
from einjit import shape as sh
from einjit.backends.interface import (
    Routine,
    default_context,
    load_inputs,
    low_level_of,
    lower_assignments,
)
from einjit.ir import assignments as asg
from einjit.ir import low_level as ll
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.naming import node_base, stable_names
from einjit.ir.optimize import VirtualizeSettings
from einjit.tensor.notation import Code, as_asgns, cd
from einjit.tensor.operation import copy_value
from einjit.tensor.tensor import (
    Tensor,
    TensorError,
    consume_backprop_code,
    consume_forward_code,
    is_forward_root,
)

Asgns = asg.Asgns


def forward(t: Tensor) -> Asgns:
    """The forward code of `t`'s subtree; `t`'s value becomes readable from the host."""
    t.hosted()
    return asg.BlockComment(f"forward {t.label_str}", consume_forward_code(t))


def grad_update(loss: Tensor) -> Asgns:
    """Forward, zero the gradients, `loss.grad =: 1`, backprop — the seed's order."""
    if loss.grad_tn is None:
        raise TensorError(f"einjit: grad_update needs a differentiable loss; {loss.label_str} has no "
                          f"parameters under it")
    loss.hosted()
    fwd = consume_forward_code(loss)
    zeros = [asg.Fetch(t.grad_tn, asg.FetchConstant(0.0)) for t in loss.subtree() if t.grad_tn is not None]
    bprop = consume_backprop_code(loss)
    return asg.sequence(
        asg.BlockComment(f"forward {loss.label_str}", fwd),
        asg.BlockComment("zero gradients", asg.sequence(*zeros)),
        asg.BlockComment(f"backprop {loss.label_str}", asg.sequence(
            cd("g =: 1", g=loss.grad).asgns, bprop)))


def _params_of(x: "Tensor | Iterable[Tensor]") -> list[Tensor]:
    if isinstance(x, Tensor):
        ps = x.params()
        if not ps:
            raise TensorError(f"einjit: tensor {x.label_str} has no parameters to update")
        return ps
    return list(x)


def sgd_one(p: Tensor, learning_rate: Tensor | float, *, weight_decay: float = 0.0, momentum: float = 0.0,
            nesterov: bool = False) -> Code:
    """One parameter's SGD step in `%cd`: decoupled from the loss so it fuses into the step."""
    text = ['"sgd_delta" =: p.grad + wd * p']
    if momentum > 0.0:
        text.append('"sgd_momentum" =: mom * sgd_momentum + sgd_delta')
        text.append("sgd_delta =+ mom * sgd_momentum" if nesterov else "sgd_delta =: sgd_momentum")
    text.append('p =- lr * sgd_delta ~logic:"."')
    body = "; ".join(text)
    return cd(f'~~("sgd {p.label_str}"; {body})', p=p, lr=learning_rate, wd=weight_decay, mom=momentum)


def sgd_update(loss_or_params: "Tensor | Iterable[Tensor]", learning_rate: Tensor | float, *,
               weight_decay: float = 0.0, momentum: float = 0.0, nesterov: bool = False) -> Asgns:
    """SGD over all parameters under a loss (or the given parameters)."""
    if nesterov and momentum <= 0.0:
        raise TensorError("einjit: Nesterov momentum needs momentum > 0")
    return asg.sequence(*[sgd_one(p, learning_rate, weight_decay=weight_decay, momentum=momentum,
                                  nesterov=nesterov).asgns for p in _params_of(loss_or_params)])


def adam_update(loss_or_params: "Tensor | Iterable[Tensor]", learning_rate: Tensor | float, *, step: Tensor,
                beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0) -> Asgns:
    """Adam (with decoupled weight decay when `weight_decay` > 0); `step` counts from 1."""
    out = []
    for p in _params_of(loss_or_params):
        c = cd(f'~~("adam {p.label_str}"; '
               '"adam_m" =: b1 * adam_m + (1 - b1) * p.grad; '
               '"adam_v" =: b2 * adam_v + (1 - b2) * (p.grad * p.grad); '
               '"m_hat" =: adam_m / (1 - b1 ** step); '
               '"v_hat" =: adam_v / (1 - b2 ** step); '
               'p =- lr * (m_hat / (sqrt(v_hat) + eps) + wd * p) ~logic:".")',
               p=p, lr=learning_rate, b1=beta1, b2=beta2, eps=eps, wd=weight_decay, step=step)
        out.append(c.asgns)
    return asg.sequence(*out)


def init_params(t: "Tensor | Iterable[Tensor]", *, seed: int = 0) -> None:
    """Give every parameter under `t` its initial values (in place, on the host)."""
    sh.finish_inference()
    rng = np.random.default_rng(seed)
    for p in _params_of(t) if isinstance(t, Tensor) else dict.fromkeys(q for x in t for q in _params_of(x)):
        assert p.init is not None  # `param` gives every parameter its initializer
        values = np.asarray(p.init(rng), dtype=p.value_tn.prec.dtype)
        host = p.value_tn.host_array()
        host[...] = values.reshape(host.shape)


def to_routine(code: "Code | Asgns | Sequence[Code | Asgns]", *,
               bindings: Mapping[StaticSymbol, IntRef] | Sequence[StaticSymbol] = (), name: str = "routine",
               backend: Any = None, context: Any = None, settings: VirtualizeSettings | None = None,
               options: Any = None) -> Routine:
    """Compile assignments into one routine linked into `context`.

    The backend is `backend` (an object or a registered name), else the context's, else
    `$EINJIT_BACKEND` or the C backend; the context defaults to the backend's default context
    (for the C backend, one computing in the host arrays). `options` are the C compiler's
    `CcOptions`. Calling the routine runs it to completion, and the host then sees the hosted
    nodes it wrote (on a context with its own arrays they are copied back); `schedule()` is
    the asynchronous form of the seed, which copies nothing.
    """
    if isinstance(code, (list, tuple)):
        code = asg.sequence(*[as_asgns(c) for c in code])
    one_code = cast("Code | Asgns", code)  # a list or tuple was sequenced just above
    refs = dict(bindings) if isinstance(bindings, Mapping) else {s: IntRef(0) for s in bindings}
    if backend is None and context is not None:
        backend = context.backend
    base = backends.resolve(backend)
    compiler = base if options is None else backends.with_options(base, options)
    start = time.perf_counter()
    with stable_names():
        _, lowered = lower_assignments(tuple(refs), as_asgns(one_code), name, settings=settings)
        compiled = compiler.compile(tuple(refs), lowered, shared=True, name=name)
    context = context if context is not None else default_context(base)
    load_inputs(context, compiled.inputs)
    routine = compiler.link(context, compiled, refs)
    if not getattr(context, "share_host_arrays", False):
        routine = _syncing_host(routine, lowered)
    config.debug(1, f"to_routine {name}: {1000 * (time.perf_counter() - start):.1f} ms")
    return routine


def _syncing_host(routine: Routine, lowered: Any) -> Routine:
    """On a context with its own arrays, calling the routine also copies the hosted nodes it
    writes back to the host, so `routine()` means the same on every backend: afterwards the
    host sees the results. `routine.schedule()` stays asynchronous and copies nothing."""
    written = {s.tn: None for s in ll.iter_stmts(low_level_of(lowered))
               if isinstance(s, (ll.Set, ll.SetFromVec, ll.ZeroOut)) and s.tn.is_hosted()}
    if not written:
        return routine
    context, wait = routine.context, routine.await_

    def await_and_sync() -> None:
        if wait is not None:
            wait()
        for tn in written:
            context.to_host(tn)

    return dataclasses.replace(routine, await_=await_and_sync, run_now=None)


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
    virtual) — a copy of `t` (`copy_value`), whose routine recomputes `t` on the way. Reading a
    result never fails because of where an earlier routine chose to keep it."""
    if t.value_tn.can_be_hosted():
        return t.hosted()
    return copy_value(t, label=[*t.label, "read"]).hosted()


def recompute(*outputs: Tensor) -> Asgns:
    """The forward code of `outputs`' subtrees, every tensor recomputed once, without consuming
    it (a routine compiled before may have used it); the outputs must be hosted (`readable`)."""
    seen: dict[int, Tensor] = {}
    for t in outputs:
        seen.update((x.id, x) for x in t.subtree())
    body = asg.sequence(*[seen[k].own_forward for k in sorted(seen)])
    return asg.BlockComment(f"forward {', '.join(t.label_str for t in outputs)}", body)


_once_cache: dict[int, tuple[Routine, Tensor]] = {}
_update_cache: dict[int, Routine] = {}


def forward_once(t: Tensor, *, backend: Any = None, context: Any = None) -> np.ndarray:
    """Compile (once) and run the forward code of `t`; return its value (read-only).

    A forward root's code is consumed, as `forward` does; the code of a tensor a routine has
    compiled already (a training step's output) is recomputed (`recompute`), through a copy
    when that routine kept the tensor inside itself (`readable`)."""
    cached = _once_cache.get(t.id)
    if cached is None:
        if any(p.value_tn.array is None for p in t.params()):
            init_params(t)
        if is_forward_root(t):
            target, code = t, forward(t)
        else:
            target = readable(t)
            code = recompute(target)
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
