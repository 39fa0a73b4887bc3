"""Matching Python values against ATL types, and converting them for each executor.

The messages are the notebook's (``Expected 1 dims, but got an ndarray with 2``), so
that a wrong call reads the same in every backend. Compiled backends take NumPy arrays;
the interpreter also takes nested lists, as the notebook's ``interpret`` does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .ir import TNum, TPair, TTensor, Type, tensor_shape
from .typecheck import is_relation_type

__all__ = ["type_value_match", "to_python", "from_python", "to_array"]


def _is_scalar(val: Any) -> bool:
    return (isinstance(val, (int, float, np.integer, np.floating))
            and not isinstance(val, (bool, np.bool_)))


def type_value_match(typ: Type, val: Any, *, allow_lists: bool = False) -> None:
    """Raise ``TypeError`` unless ``val`` can stand for a value of type ``typ``."""
    if isinstance(typ, TPair):
        if not allow_lists:
            raise TypeError("Pairs unsupported")
        if not (isinstance(val, tuple) and len(val) == 2):
            raise TypeError(f"Expected a 2-tuple for a value of type {typ}")
        type_value_match(typ.lhs, val[0], allow_lists=True)
        type_value_match(typ.rhs, val[1], allow_lists=True)
        return
    if isinstance(typ, TTensor):
        shape, elem = tensor_shape(typ)
        if isinstance(elem, TPair):
            if not allow_lists:
                raise TypeError("Pairs unsupported")
            if not isinstance(val, (list, tuple, np.ndarray)) or len(val) != typ.range:
                raise TypeError(f"Expected a sequence of length {typ.range} for {typ}")
            for v in val:
                type_value_match(typ.typ, v, allow_lists=True)
            return
        if isinstance(val, list) and allow_lists:
            try:
                val = np.asarray(val)
            except ValueError as exc:
                raise TypeError(f"could not read a nested list as a tensor: {exc}") from None
        if not isinstance(val, np.ndarray):
            raise TypeError("Expected 'numpy.ndarray' type value")
        if len(shape) != val.ndim:
            raise TypeError(f"Expected {len(shape)} dims, but got an ndarray with {val.ndim}")
        for i, d in enumerate(shape):
            if d != val.shape[i]:
                raise TypeError(f"expected dimension {i} of tensor shape to be {d}, "
                                f"but it was {val.shape[i]}")
        if is_relation_type(typ):
            if val.dtype.kind not in "bui":
                raise TypeError(f"Expected a boolean array for a relation, got dtype {val.dtype}")
        elif val.dtype.kind not in "fiu":
            raise TypeError(f"Expected a real-valued array, got dtype {val.dtype}")
        return
    if isinstance(typ, TNum):
        if not _is_scalar(val):
            raise TypeError("Expected 'float' or 'int' type value")
        return
    raise TypeError(f"no values of type {typ}")


def to_python(typ: Type, val: Any) -> Any:
    """The interpreter's form: floats, nested lists of floats (or bools), tuples."""
    match typ:
        case TNum():
            return float(val)
        case TPair(lhs, rhs):
            return (to_python(lhs, val[0]), to_python(rhs, val[1]))
        case TTensor(_, sub) if isinstance(tensor_shape(typ)[1], TPair):
            return [to_python(sub, v) for v in val]
    arr = np.asarray(val)
    arr = arr != 0 if is_relation_type(typ) else arr.astype(np.float64, copy=False)
    return arr.tolist()


def from_python(typ: Type, val: Any, as_numpy: bool) -> Any:
    """Back from the interpreter's form: tensors as arrays when ``as_numpy``."""
    match typ:
        case TNum():
            return val
        case TPair(lhs, rhs):
            return (from_python(lhs, val[0], as_numpy), from_python(rhs, val[1], as_numpy))
        case TTensor(_, sub) if isinstance(tensor_shape(typ)[1], TPair):
            return [from_python(sub, v, as_numpy) for v in val]
    return np.array(val, dtype=np.float64) if as_numpy else val


def to_array(typ: Type, val: Any) -> Any:
    """The compiled backends' form: a float for ``R``; for tensors the caller's array
    itself when it is already float64 (bool for relations), else a converted copy."""
    if isinstance(typ, TNum):
        return float(val)
    if is_relation_type(typ):
        return val if val.dtype == np.bool_ else val != 0
    return val if val.dtype == np.float64 else val.astype(np.float64)
