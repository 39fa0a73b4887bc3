"""Shapes (batch, input and output rows), the shape logic of operations, and terminal inits.

A `Shape` is mutable: inference rewrites its rows in place as it learns more, so a user can
watch partial results. In memory a tensor's axes are laid out `batch @ output @ input` (input
last, as in a matrix acting on column vectors), while the notation reads `batch|input->output`.

The logic of an operation says how the shapes of its result and arguments relate:
`Broadcast(kind, s1, s2)` for binary operations, `Transpose(kind, s)` for unary ones and
`Terminal(init)` for leaves, whose init may say how many elements there are.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator, Sequence

from einjit.ir.indexing import StaticSymbol
from einjit.shape.einsum import EinsumSpec, SlotSpec, parse_einsum, parse_shape_spec
from einjit.shape.errors import ShapeError
from einjit.shape.row import (
    AxisRef,
    Broadcastable,
    Dim,
    Kind,
    Row,
    RowId,
    RowVar,
    Var,
    fresh_proj_id,
    get_row_var,
    get_var,
)

_shape_ids = itertools.count(1)

#: The memory layout order of the rows.
LAYOUT = (Kind.BATCH, Kind.OUTPUT, Kind.INPUT)


@dataclass(frozen=True, slots=True)
class NotConstrained:
    pass


@dataclass(frozen=True, slots=True)
class InputEqualsOutput:
    """The shape's input row equals its output row (e.g. a square matrix)."""


Deduced = NotConstrained | InputEqualsOutput


class Shape:
    """The batch, input and output rows of a tensor; `id` names the tensor node it belongs to."""

    __slots__ = ("batch", "input", "output", "id", "debug_name", "_solved")

    def __init__(self, batch: Row, input: Row, output: Row, id: int, debug_name: str = ""):
        self.batch, self.input, self.output = batch, input, output
        self.id, self.debug_name = id, debug_name
        self._solved: tuple[Row, Row, Row, tuple] | None = None

    @classmethod
    def make(cls, *, batch_dims: Sequence[int | None] | None = None, input_dims: Sequence[int | None] | None = None,
             output_dims: Sequence[int | None] | None = None,
             batch_axes: Sequence[tuple[str | None, int]] | None = None,
             input_axes: Sequence[tuple[str | None, int]] | None = None,
             output_axes: Sequence[tuple[str | None, int]] | None = None,
             deduced: Deduced = NotConstrained(), debug_name: str = "", id: int | None = None) -> Shape:
        """A shape whose rows are given as sizes (`*_dims`; a None entry is an unknown size) or
        as `(label, size)` pairs (`*_axes`); an omitted row is unknown: any number of axes."""
        sh_id = next(_shape_ids) if id is None else id
        given = {Kind.BATCH: (batch_dims, batch_axes), Kind.INPUT: (input_dims, input_axes),
                 Kind.OUTPUT: (output_dims, output_axes)}
        rows = {kind: _make_row(RowId(sh_id, kind, debug_name), *spec) for kind, spec in given.items()}
        shape = cls(rows[Kind.BATCH], rows[Kind.INPUT], rows[Kind.OUTPUT], sh_id, debug_name)
        _deduce(shape, deduced)
        return shape

    @classmethod
    def of_spec(cls, spec: str, *, deduced: Deduced = NotConstrained(), debug_name: str = "",
                id: int | None = None) -> Shape:
        """A shape from the notation, e.g. `"2|3->rgb=3,4"`, `"...|_->10"` (see `einsum`)."""
        slot = parse_shape_spec(spec)
        sh_id = next(_shape_ids) if id is None else id
        row_vars: dict[str, RowVar] = {}
        rows = {kind: _spec_row(RowId(sh_id, kind, debug_name), slot, row_vars) for kind in Kind}
        shape = cls(rows[Kind.BATCH], rows[Kind.INPUT], rows[Kind.OUTPUT], sh_id, debug_name)
        _deduce(shape, deduced)
        return shape

    def row(self, kind: Kind) -> Row:
        return getattr(self, kind.value)

    def rows(self) -> tuple[Row, Row, Row]:
        """The rows in memory layout order: batch, output, input."""
        return self.batch, self.output, self.input

    def is_solved(self) -> bool:
        return self.solved_rows() is not None

    def solved_rows(self) -> tuple | None:
        """Per row (batch, input, output): the shape and kind it came from, and its dims as
        `(size, label)`; None while a row is unsolved. Remembered for the rows it was taken
        of (inference replaces rows, never edits one): keying a program asks for it on every
        operation's shapes (`projections_key`), thousands of times in a deep model."""
        rows = self.batch, self.input, self.output
        cached = self._solved
        if cached is not None and cached[0] is rows[0] and cached[1] is rows[1] and cached[2] is rows[2]:
            return cached[3]
        if not all(isinstance(r.bcast, Broadcastable) and all(isinstance(d, Dim) for d in r.dims) for r in rows):
            return None
        signature = tuple(((r.id.sh_id, r.id.kind.value), tuple([(d.d, d.label) for d in r.dims]))  # type: ignore[union-attr]  # all Dims, checked above
                          for r in rows)
        self._solved = (*rows, signature)
        return signature

    # NumPy's face, for users who write `t.shape == (64, 2)` or `len(t.shape)`: the dims in
    # memory layout order (batch, output, input), available once inference has solved them.

    def numpy_dims(self) -> tuple[int, ...]:
        from einjit.shape.inference import to_dims
        return to_dims(self)

    def __len__(self) -> int:
        return len(self.numpy_dims())

    def __iter__(self) -> Iterator[int]:
        return iter(self.numpy_dims())

    def __getitem__(self, index: int) -> int:
        return self.numpy_dims()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, tuple):
            return self.is_solved() and self.numpy_dims() == other
        return self is other

    __hash__ = object.__hash__

    def __str__(self) -> str:
        text = {kind: repr(self.row(kind)) for kind in Kind}
        shown = {kind: bool(self.row(kind).dims) or isinstance(self.row(kind).bcast, RowVar) for kind in Kind}
        out = text[Kind.OUTPUT]
        if shown[Kind.INPUT]:
            out = f"{text[Kind.INPUT]}->{out}"
        if shown[Kind.BATCH]:
            out = f"{text[Kind.BATCH]}|{out}"
        return out

    def __repr__(self) -> str:
        name = f"{self.debug_name!r} " if self.debug_name else ""
        return f"<Shape {name}#{self.id}: {self}>"

    def describe(self) -> str:
        """One line per axis in memory layout order: kind, position, size and label."""
        name = f'"{self.debug_name}" ' if self.debug_name else ""
        lines = [f"shape {name}#{self.id}: {self}"]
        layout = 0
        for kind in LAYOUT:
            row = self.row(kind)
            if isinstance(row.bcast, RowVar):
                lines.append(f"  {kind.value}: unknown further leading axes ({row.bcast!r})")
            for pos, d in enumerate(row.dims):
                size = f"size {d.d}" if isinstance(d, Dim) else f"unknown size ({d!r})"
                label = f", label {d.label}" if isinstance(d, Dim) and d.label else ""
                lines.append(f"  axis {layout}: {kind.value} {pos}, {size}{label}")
                layout += 1
        return "\n".join(lines)


def _make_row(rid: RowId, dims: Sequence[int | None] | None,
              axes: Sequence[tuple[str | None, int]] | None) -> Row:
    if dims is not None and axes is not None:
        raise ShapeError(f"Shape.make: give {rid.kind.value}_dims or {rid.kind.value}_axes, not both")
    entries: list[tuple[str | None, int | None]]
    if dims is not None:
        entries = [(None, d) for d in dims]
    elif axes is not None:
        entries = list(axes)
    else:
        return Row((), get_row_var(rid.kind.value), rid)
    return Row(tuple(_make_dim(rid, i, label, d) for i, (label, d) in enumerate(entries)), Broadcastable(), rid)


def _make_dim(rid: RowId, pos: int, label: str | None, d: int | None) -> Dim | Var:
    if d is None:
        if label is not None:
            raise ShapeError(f"Shape.make: {rid.kind.value} axis {pos} of {rid.name!r}: a label needs a size")
        return get_var()
    if not isinstance(d, int) or isinstance(d, bool) or d < 1:
        raise ShapeError(f"Shape.make: {rid.kind.value} axis {pos} of {rid.name!r}: dimension must be a "
                         f"positive int, got {d!r}")
    return Dim(d, label, fresh_proj_id(AxisRef(rid, pos)))


def _spec_row(rid: RowId, slot: SlotSpec, row_vars: dict[str, RowVar]) -> Row:
    spec = slot.row(rid.kind.value)
    dims = tuple(get_var() if a.size is None else Dim(a.size, a.label, fresh_proj_id(AxisRef(rid, i)))
                 for i, a in enumerate(spec.axes))
    if spec.row_var is None:
        return Row(dims, Broadcastable(), rid)
    if spec.row_var not in row_vars:
        row_vars[spec.row_var] = get_row_var(spec.row_var)
    return Row(dims, row_vars[spec.row_var], rid)


def _deduce(shape: Shape, deduced: Deduced) -> None:
    if isinstance(deduced, InputEqualsOutput):
        from einjit.shape.inference import add_shape_equation  # the inference state builds on Shape
        add_shape_equation(shape, Kind.INPUT, Kind.OUTPUT)


# ------------------------------------------------------------------ shape logic

@dataclass(frozen=True, slots=True)
class PointwiseBin:
    """NumPy-style broadcasting of batch, input and output axes, as in `s1 + s2`."""


@dataclass(frozen=True, slots=True)
class Compose:
    """The outputs of `s2` meet the inputs of `s1` (any number of axes, broadcasting), as in
    `s1(s2(x))` or the generalized matrix product `s1 @ s2`. The result has `s1`'s outputs,
    `s2`'s inputs and the broadcast batch axes."""


@lru_cache(maxsize=512)
def parse_spec(spec: str, n_args: int) -> EinsumSpec:
    """Parse an einsum spec and check its number of argument slots (cached: specs repeat)."""
    parsed = parse_einsum(spec)
    if len(parsed.rhs) != n_args:
        form = "rhs1;rhs2=>lhs" if n_args == 2 else "rhs=>lhs"
        raise ShapeError(f'einsum spec "{spec}": column 1: expected {n_args} argument slot(s) as in '
                         f'"{form}", got {len(parsed.rhs)}')
    return parsed


@dataclass(frozen=True, slots=True)
class Einsum:
    """`rhs1;rhs2=>lhs`: axes line up by pseudo-label; broadcasting as for `PointwiseBin`."""

    spec: str

    def __post_init__(self) -> None:
        parse_spec(self.spec, 2)


ComposeType = PointwiseBin | Compose | Einsum


@dataclass(frozen=True, slots=True)
class TransposeIO:
    """Swaps the input and output rows; keeps the batch row."""


@dataclass(frozen=True, slots=True)
class PointwiseUn:
    """The result has the (broadcast) shape of the argument."""


@dataclass(frozen=True, slots=True)
class Permute:
    """`rhs=>lhs`: the unary einsum, e.g. `"ij=>ji"` or a reduction `"...|ij=>...|i"`."""

    spec: str

    def __post_init__(self) -> None:
        parse_spec(self.spec, 1)


@dataclass(frozen=True, slots=True)
class BatchSlice:
    """Removes the leftmost batch axis, indexed by the static symbol in the projections."""

    static_symbol: StaticSymbol


TransposeType = TransposeIO | PointwiseUn | Permute | BatchSlice


@dataclass(frozen=True, slots=True)
class ConstantFill:
    """Initialized from `n_values` values. Strict: the shape has exactly that many elements
    (the dims are inferred from it when unknown); not strict: the values repeat, no constraint."""

    n_values: int
    strict: bool = True


@dataclass(frozen=True, slots=True)
class RangeOverOffsets:
    """Each cell holds its own offset; any shape."""


@dataclass(frozen=True, slots=True)
class Constant:
    """One value broadcast to any shape."""


@dataclass(frozen=True, slots=True)
class FileMapped:
    """Data read from a file of `itemsize`-byte elements: the file length fixes the element count."""

    path: str
    itemsize: int


Init = ConstantFill | RangeOverOffsets | Constant | FileMapped


@dataclass(frozen=True, slots=True, eq=False)
class Broadcast:
    kind: ComposeType
    s1: Shape
    s2: Shape


@dataclass(frozen=True, slots=True, eq=False)
class Transpose:
    kind: TransposeType
    s: Shape


@dataclass(frozen=True, slots=True, eq=False)
class Terminal:
    init: Init


Logic = Broadcast | Transpose | Terminal


@dataclass(frozen=True, slots=True, eq=False)
class UpdateStep:
    """One operation for shape inference: its result `shape` and how it relates to the args."""

    shape: Shape
    logic: Logic


def logic_args(logic: Logic) -> tuple[Shape, ...]:
    match logic:
        case Broadcast(_, s1, s2):
            return (s1, s2)
        case Transpose(_, s):
            return (s,)
    return ()


def logic_to_spec(logic: Logic) -> str:
    """The `~logic:` spelling of an operation's logic, for debug information."""
    match logic:
        case Broadcast(PointwiseBin(), _, _) | Transpose(PointwiseUn(), _):
            return "."
        case Broadcast(Compose(), _, _):
            return "@"
        case Broadcast(Einsum(spec), _, _) | Transpose(Permute(spec), _):
            return spec
        case Transpose(TransposeIO(), _):
            return "T"
        case Transpose(BatchSlice(sym), _):
            return f"@|{sym!r}"
        case Terminal(init):
            return f"<{type(init).__name__}>"
    return "?"
