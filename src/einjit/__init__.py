"""einjit: a compiled deep-learning framework in the design of OCANNL.

Tensors carry their own forward and backprop code (`einjit.tensor`), shapes are inferred over
batch / input / output axes (`einjit.shape`), assignments are lowered to a C-like IR and
optimized (`einjit.ir`), and compiled by gcc into routines (`einjit.backends`).

The public names below are loaded on first use, so importing a low layer (say `einjit.ir`)
does not pull in the tensor front end.
"""

from __future__ import annotations

import importlib

_OPERATIONS = ("Batch", "add", "batch_slice", "binop", "cos", "div", "einsum", "embed_symbol", "exp", "log",
               "matmul", "maximum", "mean", "minimum", "mul", "ndarray", "neg", "number", "param", "pow", "recip",
               "relu", "sigmoid", "sin", "sqrt", "sub", "sum", "tanh", "transpose", "unop", "where")
_PUBLIC: dict[str, tuple[str, str]] = {
    **{name: ("einjit.tensor.operation", name) for name in _OPERATIONS},
    "range": ("einjit.tensor.operation", "range_"),
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
    "AllocationError": ("einjit.memory", "AllocationError"),
    "IntRef": ("einjit.ir.indexing", "IntRef"),
    "StaticSymbol": ("einjit.ir.indexing", "StaticSymbol"),
    "get_static_symbol": ("einjit.ir.indexing", "get_static_symbol"),
    "ops": ("einjit.ir.ops", None),
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    try:
        module, attr = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module 'einjit' has no attribute {name!r}") from None
    mod = importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
