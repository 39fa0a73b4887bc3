"""Checks of values handed to the public API, so bad input gets a `TensorError` naming what is
wrong instead of a NumPy or Python exception from deep inside, or worse, a silently changed
value (NumPy drops a complex number's imaginary part and turns `None` into NaN).

Literal values are real numbers only: bools, ints and floats, as Python or NumPy scalars,
nested in lists and tuples or in a NumPy array of a boolean, integer or floating dtype.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from einjit.ir import ops
from einjit.tensor.tensor import TensorError

MAX_LITERAL_DEPTH = 32
"""Nesting levels of a literal: NumPy arrays have at most 64 axes, einjit shapes far fewer."""

_REAL_KINDS = "biuf"
_KIND_NAMES = {"c": "complex", "m": "timedelta", "M": "datetime", "O": "object", "S": "bytes", "U": "string",
               "V": "structured"}


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_real(x: Any) -> bool:
    return isinstance(x, (numbers.Real, np.bool_)) and not isinstance(x, np.timedelta64)


def real_number(value: Any, what: str) -> float:
    """A real scalar as a float; `what` names the argument in the error."""
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in _REAL_KINDS:
        return float(value)
    if not _is_real(value):
        raise TensorError(f"einjit: {what} must be a real number (bool, int or float), got "
                          f"{type(value).__name__} {_preview(value)}")
    return float(value)


def count(value: Any, what: str, *, minimum: int = 0) -> int:
    """A count of axes, dimensions...: an int (not a bool) at least `minimum`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TensorError(f"einjit: {what} must be an int, got {type(value).__name__} {_preview(value)}")
    if value < minimum:
        raise TensorError(f"einjit: {what} must be at least {minimum}, got {value}")
    return int(value)


def text(value: Any, what: str, example: str) -> str:
    """A notation string (an einsum spec, ...)."""
    if not isinstance(value, str):
        raise TensorError(f"einjit: {what} must be a str such as {example!r}, got {type(value).__name__} "
                          f"{_preview(value)}")
    return value


def label(value: Any, what: str) -> None:
    """A label: a str, or a list/tuple of str (its components)."""
    parts = [value] if isinstance(value, str) else value if isinstance(value, (list, tuple)) else None
    if parts is None or not parts or not all(isinstance(p, str) for p in parts):
        raise TensorError(f"einjit: {what} must be a str or a list of str, got {type(value).__name__} "
                          f"{_preview(value)}")


def dims(value: Any, what: str) -> None:
    """None (inferred) or a list/tuple of dimensions (each checked by the shape layer)."""
    if value is not None and not isinstance(value, (list, tuple)):
        raise TensorError(f"einjit: {what} must be a list of dimensions such as [3], got {type(value).__name__} "
                          f"{_preview(value)}")


def precision(value: Any) -> ops.Prec | None:
    """None (the default precision), or what `ops.as_prec` accepts: a `Prec`, a name or a NumPy dtype."""
    return None if value is None else ops.as_prec(value)


def real_array(array: np.ndarray, what: str) -> np.ndarray:
    """A NumPy array of real numbers; an object array is checked element by element."""
    kind = array.dtype.kind
    if kind in _REAL_KINDS:
        return array
    if kind == "O":
        return literal(array.tolist(), what)
    raise TensorError(f"einjit: {what} has {_KIND_NAMES.get(kind, kind)} dtype {array.dtype}; einjit tensors hold "
                      f"real numbers: convert it first (e.g. np.real, .astype(float))")


def literal(values: Any, what: str) -> np.ndarray:
    """Nested lists/tuples of real numbers as a float64 array, rejecting ragged nesting,
    non-real elements and nesting deeper than `MAX_LITERAL_DEPTH` with a message that says
    where (`[1][0]`)."""
    if isinstance(values, np.ndarray):
        return real_array(values, what).astype(np.float64)
    try:
        arr = np.array(values)
    except (ValueError, TypeError, OverflowError, RecursionError):
        arr = None
    if arr is not None and arr.dtype.kind in _REAL_KINDS and arr.ndim <= MAX_LITERAL_DEPTH:
        return arr.astype(np.float64)
    shape = _check_nesting(values, what)
    try:
        return np.array(values, dtype=np.float64).reshape(shape)
    except (ValueError, TypeError, OverflowError) as e:
        raise TensorError(f"einjit: {what} cannot be converted to float64: {e}") from None


def _check_nesting(values: Any, what: str) -> tuple[int, ...]:
    """The shape of a nested literal, walking it without recursion; raise at the first
    element that is not a real number or a row whose length differs from its siblings."""
    shape: list[int] = []
    level = values
    while isinstance(level, (list, tuple)):
        if len(shape) == MAX_LITERAL_DEPTH:
            raise TensorError(f"einjit: {what} is nested more than {MAX_LITERAL_DEPTH} levels deep")
        shape.append(len(level))
        if not level:
            break
        level = level[0]
    stack: list[tuple[Any, tuple[int, ...]]] = [(values, ())]
    while stack:
        item, path = stack.pop()
        where = "".join(f"[{k}]" for k in path) or "the literal"
        depth = len(path)
        if depth < len(shape):
            if isinstance(item, np.ndarray):
                item = item.tolist()
            if not isinstance(item, (list, tuple)):
                raise TensorError(f"einjit: {what} is ragged: {where} is {_preview(item)} where a sequence of "
                                  f"{shape[depth]} elements is expected; all rows must have the same length")
            if len(item) != shape[depth]:
                raise TensorError(f"einjit: {what} is ragged: {where} has {len(item)} elements, expected "
                                  f"{shape[depth]}; all rows must have the same length")
            stack.extend((x, path + (k,)) for k, x in reversed(list(enumerate(item))))
        elif isinstance(item, (list, tuple)):
            raise TensorError(f"einjit: {what} is ragged: {where} is a sequence where a number is expected; "
                              f"all rows must have the same length")
        elif not _is_real(item):
            which = f"element {where} is" if path else "it is a"
            raise TensorError(f"einjit: {what}: {which} {type(item).__name__} {_preview(item)}; literals are real "
                              f"numbers (bool, int, float), nested in lists and tuples or in a NumPy array")
    return tuple(shape)
