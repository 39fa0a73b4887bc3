"""``Func``: an ATL function with its signature, runnable three ways.

``Func([('A', Rnn), ('x', Rn)], body)`` typechecks at once (every error in one
``TCError``). ``interpret`` runs the reference interpreter; ``jit_exec`` runs a compiled
backend: ``"halide"`` (the Halide pipeline of ``atl/halide.py``) or ``"einjit"`` (the
normal form lowered to einjit's assignments by ``atl/to_assignments.py``). Each backend
compiles once per ``Func`` and is cached.

For backend authors: ``Func.normal_form`` is the ``NormalForm`` after every pass, and
``Func.arg_types`` / ``Func.ret_type`` its interface.
"""

from __future__ import annotations

import threading
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from einjit.errors import EinjitError

from .interpret import interpret
from .ir import Expr, Name, TNum, Type, tensor_shape
from .normalize import NormalForm, normal_form_of
from .typecheck import TypedFunc, typecheck
from .values import from_python, to_array, to_python, type_value_match

__all__ = ["Func", "BACKENDS", "OutputError"]

BACKENDS = ("halide", "einjit")


class OutputError(EinjitError, TypeError):
    """A caller-supplied output buffer that does not fit the result."""


class Func:
    """A typechecked ATL function."""

    def __init__(self, args: Sequence[tuple[Name, Type]], body: Expr) -> None:
        self.typed: TypedFunc = typecheck(args, body)
        self.arg_names: tuple[str, ...] = tuple(str(name) for name, _ in args)
        self.arg_types: tuple[Type, ...] = tuple(typ for _, typ in args)
        self._compiled: dict[tuple, Callable] = {}
        self._compiling = threading.Lock()

    @property
    def ret_type(self) -> Type:
        return self.typed.ret_type

    @cached_property
    def normal_form(self) -> NormalForm:
        """The block normal form after pair elimination, let flattening and gen
        normalization (raises ``PairError`` for pair-typed arguments or results)."""
        return normal_form_of(self.typed)

    def __str__(self) -> str:
        return str(self.typed)

    def __repr__(self) -> str:
        sig = ", ".join(f"{n}:{t}" for n, t in zip(self.arg_names, self.arg_types, strict=True))
        return f"<atl.Func({sig}) : {self.ret_type}>"

    # ----------------------------------------------------------------- arguments
    def _bind(self, args: tuple, kwargs: dict) -> list:
        n_call, n_args = len(args) + len(kwargs), len(self.arg_names)
        if n_call != n_args:
            raise TypeError(f"expected {n_args} arguments, but was called with {n_call}")
        for name in kwargs:
            if name not in self.arg_names:
                raise TypeError(f"argument '{name}' is not an argument of this tensor function")
        positional = iter(args)
        values = []
        for name in self.arg_names:
            if name in kwargs:
                values.append(kwargs[name])
            else:
                try:
                    values.append(next(positional))
                except StopIteration:
                    raise TypeError(f"argument '{name}' is missing") from None
        return values

    def _checked(self, args: tuple, kwargs: dict, allow_lists: bool) -> list:
        values = self._bind(args, kwargs)
        for name, typ, val in zip(self.arg_names, self.arg_types, values, strict=True):
            try:
                type_value_match(typ, val, allow_lists=allow_lists)
            except TypeError as exc:
                raise TypeError(f"{exc} (argument '{name}')") from None
        return values

    # ----------------------------------------------------------------- execution
    def interpret(self, *args: Any, **kwargs: Any) -> Any:
        """Run the reference interpreter. Tensors come back as nested lists when every
        tensor argument was a list, as NumPy arrays otherwise; ``R`` as a float."""
        values = self._checked(args, kwargs, allow_lists=True)
        as_numpy = any(isinstance(v, np.ndarray) for v in values) or not any(
            isinstance(v, list) for v in values)
        py = [to_python(t, v) for t, v in zip(self.arg_types, values, strict=True)]
        return from_python(self.ret_type, interpret(self.typed, py), as_numpy)

    def jit_exec(self, *args: Any, backend: str = "halide", output: np.ndarray | None = None,
                 **kwargs: Any) -> Any:
        """Run compiled code: a float for an ``R`` result, else a C-ordered float64
        array. Float64 arrays (C or Fortran order) are read in place.

        ``output`` (seed 002's pre-allocated output, to avoid an allocation per call): a
        writable float64 array of the result's shape (``[1]`` for an ``R`` result) that
        receives the result and is returned (for ``R``, its one value as a float). The
        einjit backend writes a C-contiguous one directly; other layouts are filled from
        the result."""
        return self._exec(self._checked(args, kwargs, allow_lists=False), backend, output)

    def run(self, inputs: Mapping[str, Any], output: np.ndarray | None = None, *,
            backend: str = "halide") -> Any:
        """Seed 002's ``run(inputs, output=None)``: the arguments by name."""
        if not isinstance(inputs, Mapping):
            raise TypeError(f"run: inputs must be a mapping from argument names to values, got "
                            f"{type(inputs).__name__}")
        return self._exec(self._checked((), dict(inputs), allow_lists=False), backend, output)

    def _exec(self, values: list, backend: str, output: np.ndarray | None) -> Any:
        fn = self.compiled(backend)
        arrays = [to_array(t, v) for t, v in zip(self.arg_types, values, strict=True)]
        if output is None:
            return fn(*arrays)
        self._check_output(output)
        fn(*arrays, output=output)
        return float(output[0]) if isinstance(self.ret_type, TNum) else output

    def _check_output(self, output: Any) -> None:
        scalar = isinstance(self.ret_type, TNum)
        shape = (1,) if scalar else self.out_shape
        what = "an R result" if scalar else f"the result type {self.ret_type}"
        if not isinstance(output, np.ndarray):
            raise OutputError(f"output: expected a numpy.ndarray of shape {list(shape)} for {what}, got "
                              f"{type(output).__name__}")
        if output.shape != shape:
            raise OutputError(f"output: expected shape {list(shape)} for {what}, got {list(output.shape)}")
        if output.dtype != np.float64:
            raise OutputError(f"output: expected dtype float64, got {output.dtype}")
        if not output.flags.writeable:
            raise OutputError("output: the array is read-only")

    def compiled(self, backend: str = "halide", **options: Any) -> Callable:
        """The compiled form for ``backend`` (built once per set of options); it takes
        the arguments in order, already checked and converted."""
        key = (backend, tuple(sorted(options.items())))
        with self._compiling:
            fn = self._compiled.get(key)
            if fn is None:
                fn = self._compiled[key] = _compile(self.normal_form, backend, options)
        return fn

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tensor_shape(self.ret_type)[0]


def _compile(nf: NormalForm, backend: str, options: dict) -> Callable:
    """The backend contract: ``compile_normal_form(nf, **options)`` returns a callable
    taking ``nf.args`` in order (a float for ``R``, a float64 ndarray of any strides for
    a real tensor, a bool ndarray for a relation) and returning a float for an ``R``
    result, else a new float64 ndarray of the result's shape; with ``output=`` (a checked,
    writable float64 array of the result's shape, ``[1]`` for ``R``) it writes the result
    there instead."""
    if backend == "halide":
        from .halide import HalideFunc
        return HalideFunc(nf, **options)
    if backend == "einjit":
        try:
            from .to_assignments import compile_normal_form
        except ImportError as exc:
            raise ImportError("the einjit backend for ATL needs einjit.atl.to_assignments, "
                              f"which could not be imported: {exc}") from exc
        return compile_normal_form(nf, **options)
    raise ValueError(f"unknown ATL backend {backend!r}; choose one of {BACKENDS}")
