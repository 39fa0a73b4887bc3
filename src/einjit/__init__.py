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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # What `__getattr__` serves, spelled out for type checkers: `_PUBLIC` and the public functions
    # and classes of `einjit.tensor.operation` are the list; tests/test_public_api.py holds this
    # block to it name by name.
    from einjit import nn as nn
    from einjit.backends.interface import BackendError as BackendError
    from einjit.backends.interface import NodeNotInContextError as NodeNotInContextError
    from einjit.backends.interface import NotHostedError as NotHostedError
    from einjit.backends.interface import StaticRangeError as StaticRangeError
    from einjit.demos import datasets as datasets
    from einjit.errors import EinjitError as EinjitError
    from einjit.ir import ops as ops
    from einjit.ir.indexing import IntRef as IntRef
    from einjit.ir.indexing import StaticSymbol as StaticSymbol
    from einjit.ir.indexing import get_static_symbol as get_static_symbol
    from einjit.ir.ops import as_prec as as_prec
    from einjit.memory import AllocationError as AllocationError
    from einjit.memory import MemoryReport as MemoryReport
    from einjit.shape import ShapeError as ShapeError
    from einjit.tensor.activations import abs as abs
    from einjit.tensor.activations import clip as clip
    from einjit.tensor.activations import gelu as gelu
    from einjit.tensor.activations import leaky_relu as leaky_relu
    from einjit.tensor.activations import rsqrt as rsqrt
    from einjit.tensor.activations import softplus as softplus
    from einjit.tensor.axes import merge_axes as merge_axes
    from einjit.tensor.axes import split_axis as split_axis
    from einjit.tensor.cd_syntax import CdSyntaxError as CdSyntaxError
    from einjit.tensor.gather import take as take
    from einjit.tensor.indexed_write import buffer as buffer
    from einjit.tensor.indexed_write import write_at as write_at
    from einjit.tensor.inputs import input as input
    from einjit.tensor.inputs import scalar as scalar
    from einjit.tensor.masks import causal_mask as causal_mask
    from einjit.tensor.masks import causal_mask_fill as causal_mask_fill
    from einjit.tensor.masks import masked_softmax as masked_softmax
    from einjit.tensor.notation import CdError as CdError
    from einjit.tensor.notation import Code as Code
    from einjit.tensor.notation import Template as Template
    from einjit.tensor.notation import cd as cd
    from einjit.tensor.op_scope import op as op
    from einjit.tensor.operation import Batch as Batch
    from einjit.tensor.operation import add as add
    from einjit.tensor.operation import as_tensor as as_tensor
    from einjit.tensor.operation import batch_slice as batch_slice
    from einjit.tensor.operation import binop as binop
    from einjit.tensor.operation import copy_value as copy_value
    from einjit.tensor.operation import cos as cos
    from einjit.tensor.operation import div as div
    from einjit.tensor.operation import einsum as einsum
    from einjit.tensor.operation import embed_symbol as embed_symbol
    from einjit.tensor.operation import exp as exp
    from einjit.tensor.operation import file_mapped as file_mapped
    from einjit.tensor.operation import log as log
    from einjit.tensor.operation import matmul as matmul
    from einjit.tensor.operation import maximum as maximum
    from einjit.tensor.operation import minimum as minimum
    from einjit.tensor.operation import mul as mul
    from einjit.tensor.operation import ndarray as ndarray
    from einjit.tensor.operation import neg as neg
    from einjit.tensor.operation import number as number
    from einjit.tensor.operation import param as param
    from einjit.tensor.operation import pow as pow
    from einjit.tensor.operation import range_ as range  # noqa: F401 - the API name of `range_`
    from einjit.tensor.operation import recip as recip
    from einjit.tensor.operation import relu as relu
    from einjit.tensor.operation import sigmoid as sigmoid
    from einjit.tensor.operation import sin as sin
    from einjit.tensor.operation import sqrt as sqrt
    from einjit.tensor.operation import sub as sub
    from einjit.tensor.operation import tanh as tanh
    from einjit.tensor.operation import transpose as transpose
    from einjit.tensor.operation import unop as unop
    from einjit.tensor.operation import where as where
    from einjit.tensor.random import normal as normal
    from einjit.tensor.random import uniform as uniform
    from einjit.tensor.reductions import amax as amax
    from einjit.tensor.reductions import amin as amin
    from einjit.tensor.reductions import log_softmax as log_softmax
    from einjit.tensor.reductions import logsumexp as logsumexp
    from einjit.tensor.reductions import max as max
    from einjit.tensor.reductions import mean as mean
    from einjit.tensor.reductions import min as min
    from einjit.tensor.reductions import softmax as softmax
    from einjit.tensor.reductions import sum as sum
    from einjit.tensor.tensor import GradSpec as GradSpec
    from einjit.tensor.tensor import Tensor as Tensor
    from einjit.tensor.tensor import TensorError as TensorError
    from einjit.tensor.tensor import default_precision as default_precision
    from einjit.tensor.tensor import set_default_precision as set_default_precision
    from einjit.tensor.tensor import unchanged_roots as unchanged_roots
    from einjit.training import checkpoint as checkpoint
    from einjit.training import data as data
    from einjit.training import fit as fit
    from einjit.training import train as train
    from einjit.training.checkpoint import CheckpointError as CheckpointError
    from einjit.training.checkpoint import load as load
    from einjit.training.checkpoint import save as save

_OPERATIONS_MODULE = "einjit.tensor.operation"
_REDUCTIONS = ("amax", "amin", "log_softmax", "logsumexp", "max", "mean", "min", "softmax", "sum")
_ACTIVATIONS = ("abs", "clip", "gelu", "leaky_relu", "rsqrt", "softplus")
_PUBLIC: dict[str, tuple[str, str | None]] = {
    **{name: ("einjit.tensor.reductions", name) for name in _REDUCTIONS},
    **{name: ("einjit.tensor.activations", name) for name in _ACTIVATIONS},
    "split_axis": ("einjit.tensor.axes", "split_axis"),
    "merge_axes": ("einjit.tensor.axes", "merge_axes"),
    "take": ("einjit.tensor.gather", "take"),
    "buffer": ("einjit.tensor.indexed_write", "buffer"),
    "write_at": ("einjit.tensor.indexed_write", "write_at"),
    "causal_mask": ("einjit.tensor.masks", "causal_mask"),
    "causal_mask_fill": ("einjit.tensor.masks", "causal_mask_fill"),
    "masked_softmax": ("einjit.tensor.masks", "masked_softmax"),
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
    "MemoryReport": ("einjit.memory", "MemoryReport"),
    "IntRef": ("einjit.ir.indexing", "IntRef"),
    "StaticSymbol": ("einjit.ir.indexing", "StaticSymbol"),
    "get_static_symbol": ("einjit.ir.indexing", "get_static_symbol"),
    "ops": ("einjit.ir.ops", None),
    "input": ("einjit.tensor.inputs", "input"),
    "scalar": ("einjit.tensor.inputs", "scalar"),
    "as_prec": ("einjit.ir.ops", "as_prec"),
    "save": ("einjit.training.checkpoint", "save"),
    "load": ("einjit.training.checkpoint", "load"),
    "CheckpointError": ("einjit.training.checkpoint", "CheckpointError"),
    "data": ("einjit.training.data", None),
    "fit": ("einjit.training.fit", None),
    "train": ("einjit.training.train", None),
    "checkpoint": ("einjit.training.checkpoint", None),
    "datasets": ("einjit.demos.datasets", None),
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
