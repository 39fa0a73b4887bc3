"""Tensors: a value node, an optional gradient node, and the code that computes them.

Each tensor holds only its *own* forward assignment and its own backprop assignment. The code
of a whole expression is assembled when it is consumed (`consume_forward_code`,
`consume_backprop_code`): forward in increasing creation order, backprop in decreasing
creation order. Creation order is a topological order of the expression graph (children are
always created before parents), so this is correct even when a sub-tensor is shared between
branches — strictly more robust than splicing a child's code into its first consumer.

Rootness follows the seed: a tensor is a forward (and, if differentiable, backprop) root until
it is used as an argument of another tensor; only roots can be consumed, and consuming code
twice is an error.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
from typing import Callable, Sequence
from typing import Iterator as PyIterator

import numpy as np

from einjit import shape as sh
from einjit.errors import EinjitError
from einjit.ir import assignments as asg
from einjit.ir import ops
from einjit.ir.tnode import Tnode


class GradSpec(enum.Enum):
    REQUIRE_GRAD = "require"
    IF_NEEDED = "if_needed"
    PROHIBIT_GRAD = "prohibit"


class TensorError(EinjitError, ValueError):
    pass


_default_prec: list[ops.Prec] = [ops.single]


def default_prec() -> ops.Prec:
    return _default_prec[-1]


@contextlib.contextmanager
def default_precision(prec: ops.Prec | str) -> PyIterator[None]:
    """Tensors created inside the block get this value/gradient precision."""
    p = _precision(prec)
    _default_prec.append(p)
    try:
        yield
    finally:
        _default_prec.pop()


def set_default_precision(prec: ops.Prec | str) -> None:
    _default_prec[0] = _precision(prec)


def _precision(prec: ops.Prec | str) -> ops.Prec:
    if isinstance(prec, ops.Prec):
        return prec
    if isinstance(prec, str) and prec in ops.PRECISIONS:
        return ops.PRECISIONS[prec]
    raise TensorError(f"einjit: unknown precision {prec!r}; use one of {sorted(ops.PRECISIONS)}")


_ids = itertools.count(1)
_forward_roots: dict[int, "Tensor"] = {}
_backprop_roots: dict[int, "Tensor"] = {}


@contextlib.contextmanager
def unchanged_roots() -> PyIterator[None]:
    """The wildcard form: tensors built inside only add shape constraints; rootness of
    everything that existed before is restored afterwards, and new tensors are not roots."""
    fwd, bprop = dict(_forward_roots), dict(_backprop_roots)
    try:
        yield
    finally:
        _forward_roots.clear()
        _forward_roots.update(fwd)
        _backprop_roots.clear()
        _backprop_roots.update(bprop)


class NodeView:
    """`t.value` / `t.grad`: a tensor node seen with its tensor's shape, readable as NumPy."""

    __slots__ = ("tensor", "tn", "is_grad")

    def __init__(self, tensor: "Tensor", tn: Tnode, is_grad: bool):
        self.tensor, self.tn, self.is_grad = tensor, tn, is_grad

    @property
    def shape(self) -> sh.Shape:
        return self.tensor.shape

    def numpy(self) -> np.ndarray:
        """A copy of the node's current host values."""
        if self.tn.array is None:
            what = "gradient" if self.is_grad else "value"
            raise TensorError(
                f"einjit: the {what} of tensor {self.tensor.label_str} has no host array: it was not "
                f"computed by a routine yet, or it is not hosted (call .hosted() before compiling)")
        return self.tn.array.copy()

    def __repr__(self) -> str:
        return f"<{'grad' if self.is_grad else 'value'} of {self.tensor.label_str}: {self.tn!r}>"


class Tensor:
    __slots__ = ("id", "label", "op_label", "shape", "update_step", "children", "value_tn", "grad_tn",
                 "own_forward", "own_backprop", "projections", "is_param", "init", "_fwd_done", "_bprop_done",
                 "__weakref__")

    def __init__(self, *, label: list[str], op_label: str, shape: sh.Shape, update_step: sh.UpdateStep | None,
                 children: tuple["Tensor", ...], value_tn: Tnode, grad_tn: Tnode | None,
                 projections: asg.Lazy | None, is_param: bool = False):
        self.id = next(_ids)
        self.label, self.op_label = label, op_label
        self.shape, self.update_step = shape, update_step
        self.children = children
        self.value_tn, self.grad_tn = value_tn, grad_tn
        self.projections = projections
        self.own_forward: asg.Asgns = asg.Noop()
        self.own_backprop: asg.Asgns = asg.Noop()
        self.is_param = is_param
        self.init: Callable[[np.random.Generator], np.ndarray] | None = None
        self._fwd_done = False
        self._bprop_done = False

    # -------------------------------------------------------------- views

    @property
    def value(self) -> NodeView:
        return NodeView(self, self.value_tn, False)

    @property
    def grad(self) -> NodeView | None:
        return None if self.grad_tn is None else NodeView(self, self.grad_tn, True)

    @property
    def is_differentiable(self) -> bool:
        return self.grad_tn is not None

    @property
    def label_str(self) -> str:
        return ".".join(self.label)

    @property
    def dims(self) -> tuple[int, ...]:
        return self.value_tn.dims

    def numpy(self) -> np.ndarray:
        return self.value.numpy()

    def hosted(self) -> "Tensor":
        """Keep the value (and gradient) readable from the host after routines run."""
        from einjit.ir.tnode import MemoryType, hosted
        self.value_tn.update_memory_mode(hosted(MemoryType.CHANGED_ON_DEVICES), 60)
        if self.grad_tn is not None:
            self.grad_tn.update_memory_mode(hosted(MemoryType.CHANGED_ON_DEVICES), 61)
        return self

    # -------------------------------------------------------------- subtree

    def subtree(self) -> list["Tensor"]:
        """This tensor and everything under it, in creation (topological) order."""
        seen: dict[int, Tensor] = {}
        stack = [self]
        while stack:
            t = stack.pop()
            if t.id in seen:
                continue
            seen[t.id] = t
            stack.extend(t.children)
        return [seen[k] for k in sorted(seen)]

    def params(self) -> list["Tensor"]:
        return [t for t in self.subtree() if t.is_param]

    # -------------------------------------------------------------- printing

    def __repr__(self) -> str:
        return f"Tensor({self.label_str} : {self.shape} {'grad' if self.grad_tn is not None else 'non-diff'})"

    def __str__(self) -> str:
        from einjit.tensor.printing import render_tensor
        return render_tensor(self)

    # operators are attached by einjit.tensor.operation


def new_label(label: str | Sequence[str] | None, op_label: str) -> list[str]:
    if label is None:
        return [op_label]
    parts = [label] if isinstance(label, str) else list(label) if isinstance(label, (list, tuple)) else None
    if not parts or not all(isinstance(p, str) for p in parts):
        raise TensorError(f"einjit: the label of a {op_label} must be a str or a list of str, got {label!r:.60}")
    return parts


def make_node(label: list[str], shape: sh.Shape, prec: ops.Prec) -> Tnode:
    return Tnode(label, lambda: sh.to_dims(shape), prec)


def register(t: "Tensor") -> None:
    """Make `t` a root and its arguments non-roots."""
    for c in t.children:
        _forward_roots.pop(c.id, None)
        _backprop_roots.pop(c.id, None)
    _forward_roots[t.id] = t
    if t.grad_tn is not None:
        _backprop_roots[t.id] = t


def is_forward_root(t: Tensor) -> bool:
    return t.id in _forward_roots


def is_backprop_root(t: Tensor) -> bool:
    return t.id in _backprop_roots


def consume_forward_code(t: Tensor) -> asg.Asgns:
    """The forward code of `t`'s subtree not yet consumed; `t` stops being a root."""
    if not is_forward_root(t):
        if t._fwd_done:
            raise TensorError(f"einjit: the forward code of tensor {t.label_str} was already consumed "
                              f"(compiled into a routine); a subtree's code can be used once")
        raise TensorError(f"einjit: tensor {t.label_str} is not a forward root: it is an argument of "
                          f"another tensor, whose code computes it")
    del _forward_roots[t.id]
    parts = []
    for x in t.subtree():
        if not x._fwd_done:
            x._fwd_done = True
            parts.append(x.own_forward)
    return asg.sequence(*parts)


def consume_backprop_code(t: Tensor) -> asg.Asgns:
    """The backprop code of `t`'s subtree, latest tensor first; `t` stops being a root."""
    if t.grad_tn is None:
        raise TensorError(f"einjit: tensor {t.label_str} is not differentiable: it has no backprop code")
    if not is_backprop_root(t):
        raise TensorError(f"einjit: tensor {t.label_str} is not a backprop root: its backprop code was "
                          f"already consumed or it is an argument of another tensor")
    del _backprop_roots[t.id]
    parts = []
    for x in reversed(t.subtree()):
        if x.grad_tn is not None and not x._bprop_done:
            x._bprop_done = True
            parts.append(x.own_backprop)
    return asg.sequence(*parts)


def needs_grad(grad_spec: GradSpec, children: Sequence[Tensor]) -> bool:
    match grad_spec:
        case GradSpec.REQUIRE_GRAD:
            return True
        case GradSpec.PROHIBIT_GRAD:
            return False
        case GradSpec.IF_NEEDED:
            return any(c.grad_tn is not None for c in children)
    raise ValueError(grad_spec)
