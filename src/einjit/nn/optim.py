"""Optimizers as objects over a model's parameters. `update()` is `%cd` code (from
`einjit.train` where it exists) that goes into the same routine as the gradient code, so one
compiled call does forward, backprop and the update. The learning rate is a hosted scalar that
`step()` sets from the schedule before each call: changing it needs no recompilation. Adam's
step count is a state tensor that the routine increments itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from einjit.ir import assignments as asg
from einjit.ir import ops
from einjit.nn.schedules import Schedule, constant
from einjit.tensor.inputs import scalar
from einjit.tensor.notation import cd
from einjit.tensor.state import state
from einjit.tensor.tensor import Tensor, TensorError
from einjit.training import train


class Optimizer:
    def __init__(self, params: Tensor | Iterable[Tensor], lr: float | Schedule, name: str):
        self.params = params.params() if isinstance(params, Tensor) else list(params)
        if not self.params:
            raise TensorError(f"einjit: {name} has no parameters to update")
        self.schedule = constant(lr) if isinstance(lr, (int, float)) else lr
        self.name = name
        self.lr = scalar(self.schedule(0), label=f"{name}.lr")
        self.steps = 0

    def step(self) -> float:
        """Set the learning rate of the next routine call from the schedule; returns it."""
        value = self.schedule(self.steps)
        self.lr.set_values(value)
        self.steps += 1
        return value

    def update(self) -> asg.Asgns:
        raise NotImplementedError


class SGD(Optimizer):
    """SGD with optional (Nesterov) momentum and L2 weight decay, as PyTorch's."""

    def __init__(self, params, lr: float | Schedule = 0.01, *, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0):
        super().__init__(params, lr, "sgd")
        if nesterov and momentum <= 0.0:
            raise TensorError("einjit: Nesterov momentum needs momentum > 0")
        self.momentum, self.nesterov, self.weight_decay = momentum, nesterov, weight_decay

    def update(self) -> asg.Asgns:
        return train.sgd_update(self.params, self.lr, weight_decay=self.weight_decay, momentum=self.momentum,
                                nesterov=self.nesterov)


class Adam(Optimizer):
    """Adam; `weight_decay` adds L2 to the gradient (coupled), as PyTorch's Adam."""

    decoupled = False

    def __init__(self, params, lr: float | Schedule = 1e-3, *, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr, type(self).__name__.lower())
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        self.count = state([self.name, "step"], 0.0, prec=ops.double)

    def update(self) -> asg.Asgns:
        b1, b2 = self.betas
        tick = cd("n =+ 1", n=self.count.value).asgns
        if self.decoupled or self.weight_decay == 0.0:
            body = train.adam_update(self.params, self.lr, step=self.count, beta1=b1, beta2=b2, eps=self.eps,
                                     weight_decay=self.weight_decay)
            return asg.sequence(tick, body)
        out = [tick]
        for p in self.params:
            out.append(cd(f'~~("adam {p.label_str}"; '
                          '"adam_g" =: p.grad + wd * p; '
                          '"adam_m" =: b1 * adam_m + (1 - b1) * adam_g; '
                          '"adam_v" =: b2 * adam_v + (1 - b2) * (adam_g * adam_g); '
                          '"m_hat" =: adam_m / (1 - b1 ** n); '
                          '"v_hat" =: adam_v / (1 - b2 ** n); '
                          'p =- lr * (m_hat / (sqrt(v_hat) + eps)) ~logic:".")',
                          p=p, lr=self.lr, b1=b1, b2=b2, eps=self.eps, wd=self.weight_decay, n=self.count).asgns)
        return asg.sequence(*out)


class AdamW(Adam):
    """Adam with decoupled weight decay (`p -= lr * wd * p`), as PyTorch's AdamW (default 0.01)."""

    decoupled = True

    def __init__(self, params, lr: float | Schedule = 1e-3, *, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        super().__init__(params, lr, betas=betas, eps=eps, weight_decay=weight_decay)
