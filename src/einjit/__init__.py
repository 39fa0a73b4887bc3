"""einjit: a compiled deep-learning framework in the design of OCANNL.

Tensors carry their own forward and backprop code (`einjit.tensor`), shapes are inferred over
batch / input / output axes (`einjit.shape`), assignments are lowered to a C-like IR and
optimized (`einjit.ir`), and compiled by gcc into routines (`einjit.backends`).

The public names below are loaded on first use, so importing a low layer (say `einjit.ir`)
does not pull in the tensor front end. The operations are every public function and class of
`einjit.tensor.operation`, found when the first of them is asked for: a new operation gets its
API name by being defined there (a trailing `_`, as in `range_`, avoids shadowing a builtin
inside that module and is dropped from the API name).
"""

from __future__ import annotations

import importlib
import importlib.util

_OPERATIONS_MODULE = "einjit.tensor.operation"
_REDUCTIONS = ("amax", "amin", "log_softmax", "logsumexp", "max", "mean", "min", "softmax", "sum")
_ACTIVATIONS = ("abs", "clip", "gelu", "leaky_relu", "rsqrt", "softplus")
_PUBLIC: dict[str, tuple[str, str | None]] = {
    **{name: ("einjit.tensor.reductions", name) for name in _REDUCTIONS},
    **{name: ("einjit.tensor.activations", name) for name in _ACTIVATIONS},
    "uniform": ("einjit.tensor.random", "uniform"),
    "normal": ("einjit.tensor.random", "normal"),
    "cd": ("einjit.tensor.notation", "cd"),
    "op": ("einjit.tensor.op_scope", "op"),
    "Code": ("einjit.tensor.notation", "Code"),
    "CdError": ("einjit.tensor.notation", "CdError"),
    "Template": ("einjit.tensor.notation", "Template"),
    "CdSyntaxError": ("einjit.tensor.cd_syntax", "CdSyntaxError"),
    "Tensor": ("einjit.tensor.tensor", "Tensor"),
    "TensorError": ("einjit.tensor.tensor", "TensorError"),
    "GradSpec": ("einjit.tensor.tensor", "GradSpec"),
    "default_precision": ("einjit.tensor.tensor", "default_precision"),
    "set_default_precision": ("einjit.tensor.tensor", "set_default_precision"),
    "unchanged_roots": ("einjit.tensor.tensor", "unchanged_roots"),
    "ShapeError": ("einjit.shape", "ShapeError"),
    "EinjitError": ("einjit.errors", "EinjitError"),
    "BackendError": ("einjit.backends.interface", "BackendError"),
    "NotHostedError": ("einjit.backends.interface", "NotHostedError"),
    "NodeNotInContextError": ("einjit.backends.interface", "NodeNotInContextError"),
    "StaticRangeError": ("einjit.backends.interface", "StaticRangeError"),
    "AllocationError": ("einjit.memory", "AllocationError"),
    "IntRef": ("einjit.ir.indexing", "IntRef"),
    "StaticSymbol": ("einjit.ir.indexing", "StaticSymbol"),
    "get_static_symbol": ("einjit.ir.indexing", "get_static_symbol"),
    "ops": ("einjit.ir.ops", None),
    "input": ("einjit.tensor.inputs", "input"),
    "scalar": ("einjit.tensor.inputs", "scalar"),
    "as_prec": ("einjit.ir.ops", "as_prec"),
    "save": ("einjit.checkpoint", "save"),
    "load": ("einjit.checkpoint", "load"),
    "CheckpointError": ("einjit.checkpoint", "CheckpointError"),
    "data": ("einjit.data", None),
    "fit": ("einjit.fit", None),
    "nn": ("einjit.nn", None),
}


def _operations() -> dict[str, str]:
    """API name -> name in `einjit.tensor.operation`, for its public functions and classes."""
    mod = importlib.import_module(_OPERATIONS_MODULE)
    return {name.rstrip("_"): name for name, value in vars(mod).items()
            if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == mod.__name__}


def _public() -> dict[str, tuple[str, str | None]]:
    return {**{api: (_OPERATIONS_MODULE, name) for api, name in _operations().items()}, **_PUBLIC}


def __getattr__(name: str):
    if name == "__all__":
        return sorted(_public())
    if name not in _PUBLIC and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        # `from einjit import memory` inside einjit itself: the submodule, without loading the
        # operation library (which may be what is importing it)
        return importlib.import_module(f"{__name__}.{name}")
    try:
        module, attr = _PUBLIC[name] if name in _PUBLIC else _public()[name]
    except KeyError:
        raise AttributeError(f"module 'einjit' has no attribute {name!r}") from None
    mod = importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_public()))
