"""Gradient clipping by global norm, compiled into the step.

`clip_grad_norm(params, max_norm)` is `%cd` code placed between backprop and the optimizer's
update (`fit.train_step(loss, [nn.clip_grad_norm(loss, 1.0), opt.update()], ...)`): it sums
every gradient's squares into one hosted cell, then scales every gradient by
`min(1, max_norm / (norm + 1e-6))` — PyTorch's `clip_grad_norm_`, the 1e-6 included, so the
two agree to rounding. The norm before clipping stays readable (`clip.total_norm()`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from einjit.ir import assignments as asg
from einjit.tensor.notation import cd
from einjit.tensor.state import state
from einjit.tensor.tensor import Tensor, TensorError


class ClipGradNorm:
    """The clipping code of one set of parameters and the cell holding their squared norm."""

    def __init__(self, params: Tensor | Iterable[Tensor], max_norm: float, *, label: str = "clip"):
        self.params = params.params() if isinstance(params, Tensor) else list(params)
        if not self.params:
            raise TensorError(f"einjit: clip_grad_norm {label}: no parameters to clip")
        undiff = [p.label_str for p in self.params if p.grad_tn is None]
        if undiff:
            raise TensorError(f"einjit: clip_grad_norm {label}: {undiff} have no gradient")
        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0 \
                or not math.isfinite(max_norm):
            raise TensorError(f"einjit: clip_grad_norm {label}: max_norm must be a positive finite number, "
                              f"got {max_norm!r}")
        self.max_norm = float(max_norm)
        self.squared = state([label, "squared_norm"], 0.0, prec=self.params[0].value_tn.prec)

    def code(self) -> asg.Asgns:
        env = {f"p{k}": p for k, p in enumerate(self.params)}
        parts = ["sq =: 0"]
        parts += [f'sq =+ {k}.grad * {k}.grad ~logic:"...|...->...; ...|...->... => 0"' for k in env]
        parts.append('"clip_coef" =: where(mx < sqrt(sq) + 1e-6, mx / (sqrt(sq) + 1e-6), 1)')
        parts += [f"{k}.grad =: {k}.grad * clip_coef" for k in env]
        body = "; ".join(parts)
        return cd(f'~~("clip gradients to norm {self.max_norm!r}"; {body})', sq=self.squared, mx=self.max_norm,
                  **env).asgns

    def total_norm(self) -> float:
        """The gradients' global norm before clipping, at the last run."""
        return math.sqrt(float(self.squared.value.read()[0]))


def clip_grad_norm(params: Tensor | Iterable[Tensor], max_norm: float, *, label: str = "clip") -> asg.Asgns:
    """Code scaling the gradients of `params` (a loss's, or a list) to a global norm of at most
    `max_norm`, as `torch.nn.utils.clip_grad_norm_`."""
    return ClipGradNorm(params, max_norm, label=label).code()
