"""The `%op` inline-declaration scope: `@einjit.op` functions create their parameters once.

In the seed, a tensor declared inline in an `%op` definition (`"w" * x`) is bound for the
whole definition, so every call of the defined function shares it; a `~config` argument with
a label moves the declaration under that argument, giving one instance per label. In Python,
`einjit.param("w", ...)` inside a function decorated with `@einjit.op` is that declaration:
the first call creates the parameter, later calls get the same tensor, and calling with
`label="layer1"` keeps a separate set of parameters labelled `layer1.w`, ... .

A labelled call inside another definition's labelled instance is an instance of that instance,
as a `~config` parameter introduced under another one is in the seed: `outer(x, label="A")` and
`outer(x, label="B")` calling `inner(h, label="inner")` get `A.inner.w` and `B.inner.w`. A call
without a label declares its parameters once for the whole definition, wherever it is called.

As in seed 004, the label list starts with the declaring string and ends with the
configuration labels (`['w', 'A', 'inner']`); the dotted display `A.inner.w` (scope first) is
the parameter's name and checkpoint key (see `Tensor`).

Inside such a function the notation can also know Python binding names: a tensor bound to a
local variable and still carrying its operation's default label is relabelled with the
variable's name when the function returns (`h = relu(...)` is labelled `h`), so debug output
and the generated C read like the source.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable, Iterator, Protocol, cast

from einjit.tensor.tensor import Tensor, TensorError


class OpFunction(Protocol):
    """What `op` makes of a function: it also takes `label=`, and lists the parameters it declared."""

    __name__: str
    #: `params(label=None)`: the parameters declared by the calls with that label.
    params: Callable[..., list[Tensor]]

    def __call__(self, *args: Any, label: str | None = None, **kwargs: Any) -> Tensor: ...


class _Scope:
    def __init__(self, name: str, label: str | None, prefix: list[str]):
        self.name = name
        self.label = label
        #: The labels of the enclosing instances and this one: what its parameters' labels start with.
        self.prefix = prefix
        self.params: dict[str, Tensor] = {}


_active: list[_Scope] = []


def lookup(label: str) -> tuple[Tensor | None, list[str]]:
    """The parameter already declared under `label` in the active definition (if any), and the
    configuration labels a new one is declared under (its label is `[label, *those]`)."""
    if not _active:
        return None, []
    scope = _active[-1]
    return scope.params.get(label), list(scope.prefix)


def remember(label: str, t: Tensor) -> None:
    if _active:
        _active[-1].params[label] = t


@contextlib.contextmanager
def _entered(scope: _Scope) -> Iterator[None]:
    _active.append(scope)
    try:
        yield
    finally:
        _active.pop()


def op(fn: Callable[..., Tensor]) -> OpFunction:
    """Decorate a tensor-building function so the parameters it declares are created once
    per definition — or once per `label=` keyword given at the call."""
    scopes: dict[tuple[_Scope | None, str | None], _Scope] = {}

    @functools.wraps(fn)
    def wrapper(*args, label: str | None = None, **kwargs):
        parent = _active[-1] if _active and label is not None else None
        scope = scopes.get((parent, label))
        if scope is None:
            prefix = (parent.prefix if parent is not None else []) + ([label] if label is not None else [])
            scope = scopes[(parent, label)] = _Scope(fn.__name__, label, prefix)
        with _entered(scope):
            result, names = _call_capturing_locals(fn, args, kwargs)
        _label_by_binding(names, scope.prefix)
        if not isinstance(result, Tensor):
            raise TensorError(f"einjit: @op function {fn.__name__} must return a tensor, got {type(result).__name__}")
        return result

    op_fn = cast(OpFunction, wrapper)
    op_fn.params = lambda label=None: [p for (_, lbl), sc in scopes.items() if lbl == label
                                       for p in sc.params.values()]
    return op_fn


def _call_capturing_locals(fn: Callable, args: tuple, kwargs: dict) -> tuple[object, dict[str, object]]:
    """Run `fn`, also returning its local variables as they were when it returned. A profile
    hook sees only this call's return; graph building is not a hot path.

    A Python profile function already installed keeps receiving every event. A profiler
    written in C (cProfile) cannot be called from Python nor reinstalled by `sys.setprofile`,
    so under one the locals are not captured (tensors keep their operations' labels) rather
    than breaking the profiler."""
    captured: dict[str, object] = {}
    previous = sys.getprofile()
    if previous is not None and not callable(previous):
        return fn(*args, **kwargs), captured

    def hook(frame, event, arg):
        if event == "return" and frame.f_code is fn.__code__ and not captured:
            captured.update(frame.f_locals)
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(hook)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    return result, captured


def _label_by_binding(names: dict[str, object], prefix: list[str]) -> None:
    for name, value in names.items():
        if isinstance(value, Tensor) and value.label == [value.op_label] and not name.startswith("_"):
            value.relabel([name, *prefix], prefix)
