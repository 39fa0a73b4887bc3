"""Optimizers as objects over a model's parameters. `update()` is the `%cd` code of
`einjit.train` (the one home of each optimizer's update), which goes into the same routine as
the gradient code, so one compiled call does forward, backprop and the update. The learning
rate is a hosted scalar set from the schedule before each call of a step: changing it needs no
recompilation. A step compiled by `fit.train_step` advances the schedule itself, once per call,
so `fit.fit` follows it; `step()` does it by hand for routines run otherwise (and a call right
after a `step()` does not advance it again). Adam's step count is a state tensor that the
routine increments.

`state_tensors()` is everything a resumed run needs — learning rate, schedule position, step
count, moments — for `einjit.save(model, path, optimizer=opt)`.
"""

from __future__ import annotations

from collections.abc import Iterable

from einjit import memory
from einjit import shape as sh
from einjit.ir import assignments as asg
from einjit.ir import ops
from einjit.nn.schedules import Schedule, constant
from einjit.tensor.inputs import scalar
from einjit.tensor.notation import Code, cd
from einjit.tensor.state import drive, state
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
        self.position = state([name, "schedule_step"], 0.0, prec=ops.double)
        self._moments: dict[str, Tensor] = {}
        self._code: asg.Asgns | None = None
        self._set_by_hand = False
        drive(self.lr, self.before_run)

    @property
    def steps(self) -> int:
        """Steps taken so far: the schedule's position (saved with the optimizer's state)."""
        return int(self.position.value.read()[0])

    def step(self) -> float:
        """Set the learning rate of the next routine call from the schedule; returns it."""
        value = self.schedule(self.steps)
        self.lr.set_values(value)
        self.position.set_values(self.steps + 1)
        self._set_by_hand = True
        return value

    def before_run(self) -> None:
        """Called by a compiled step before each run: advance the schedule, unless `step()`
        already did for this run."""
        if not self._set_by_hand:
            self.step()
        self._set_by_hand = False

    def state_tensors(self) -> dict[str, Tensor]:
        """Learning rate, schedule position and the update's moments (zeros before the first
        step, as the routine starts them)."""
        self.update()
        sh.finish_inference()
        for t in self._moments.values():
            if t.value_tn.array is None:
                t.set_values(0.0)
        return {self.lr.label_str: self.lr, self.position.label_str: self.position, **self._moments}

    def update(self) -> asg.Asgns:
        """The update code, built once: every routine compiled with it shares the moments, and
        a checkpoint can be loaded into them before any routine is compiled."""
        if self._code is None:
            with memory.collector_paused():
                self._code = self._update()
        return self._code

    def _keep(self, p: Tensor, code: Code, *names: str) -> Code:
        """Keep the moments `names` the code declared for `p`, hosted so that they can be saved."""
        for name in names:
            self._moments[f"{self.name}.{p.label_str}.{name}"] = getattr(code, name).hosted()
        return code

    def _update(self) -> asg.Asgns:
        raise NotImplementedError


class SGD(Optimizer):
    """SGD with optional (Nesterov) momentum and L2 weight decay, as PyTorch's."""

    def __init__(self, params, lr: float | Schedule = 0.01, *, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0):
        super().__init__(params, lr, "sgd")
        if nesterov and momentum <= 0.0:
            raise TensorError("einjit: Nesterov momentum needs momentum > 0")
        self.momentum, self.nesterov, self.weight_decay = momentum, nesterov, weight_decay

    def _update(self) -> asg.Asgns:
        moments = ("sgd_momentum",) if self.momentum > 0.0 else ()
        return asg.sequence(*[self._keep(p, train.sgd_one(p, self.lr, weight_decay=self.weight_decay,
                                                          momentum=self.momentum, nesterov=self.nesterov),
                                         *moments).asgns for p in self.params])


class Adam(Optimizer):
    """Adam; `weight_decay` adds L2 to the gradient (coupled), as PyTorch's Adam."""

    decoupled = False

    def __init__(self, params, lr: float | Schedule = 1e-3, *, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr, type(self).__name__.lower())
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        self.count = state([self.name, "step"], 0.0, prec=ops.double)

    def state_tensors(self) -> dict[str, Tensor]:
        return {**super().state_tensors(), self.count.label_str: self.count}

    def _update(self) -> asg.Asgns:
        b1, b2 = self.betas
        scalars = train.adam_scalars(self.count, self.lr, beta1=b1, beta2=b2, eps=self.eps,
                                     weight_decay=self.weight_decay)
        out = [cd("n =+ 1", n=self.count.value).asgns, scalars.asgns]
        for p in self.params:
            code = train.adam_one(p, self.lr, step=self.count, beta1=b1, beta2=b2, eps=self.eps,
                                  weight_decay=self.weight_decay, decoupled=self.decoupled, scalars=scalars)
            out.append(self._keep(p, code, "adam_m", "adam_v").asgns)
        return asg.sequence(*out)


class AdamW(Adam):
    """Adam with decoupled weight decay (`p -= lr * wd * p`), as PyTorch's AdamW (default 0.01)."""

    decoupled = True

    def __init__(self, params, lr: float | Schedule = 1e-3, *, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        super().__init__(params, lr, betas=betas, eps=eps, weight_decay=weight_decay)
