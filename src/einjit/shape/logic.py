"""From an operation's shape logic to constraints.

`constraints_of` turns one operation into row (in)equalities between its result (`cur`, the
super-tensor side) and its arguments (`subr`), lining up einsum slots through pseudo-label
variables. Conditions that are not (in)equalities become *items*, re-checked whenever inference
progresses: element counts of terminal data, the leftmost-axis removal of a batch slice (which
waits until a batch row is known), bounds of fixed indices, and the extent of convolution axes.
Items can also force a choice while closing — the one non-declarative step of inference.

The function takes the shapes explicitly so that projection inference can run it again on
copies of the shapes carrying fresh projection ids.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from einjit.ir.indexing import FixedIdx, Iterator
from einjit.shape.einsum import Anonymous, ConvAxis, FixedIndex, Label, RowSpec, SlotSpec
from einjit.shape.errors import ShapeError
from einjit.shape.row import (
    AxisRef,
    Bounds,
    Broadcastable,
    Constraint,
    Dim,
    DimEq,
    Env,
    Kind,
    Row,
    RowEq,
    RowId,
    RowIneq,
    RowVar,
    TotalElems,
    Var,
    apply_constraint,
    describe_axis,
    describe_dim,
    describe_row_id,
    dim_upper,
    get_row_var,
    get_var,
    new_dim,
    row_lub,
    row_of_var,
    subst_dim,
    subst_row,
)
from einjit.shape.shape import (
    BatchSlice,
    Broadcast,
    Compose,
    ConstantFill,
    Einsum,
    FileMapped,
    Logic,
    Permute,
    PointwiseBin,
    PointwiseUn,
    Shape,
    Terminal,
    Transpose,
    TransposeIO,
    parse_spec,
)


def _var_of(r: Row) -> RowVar:
    """The row variable of an open row (one whose broadcast part is still a variable)."""
    assert isinstance(r.bcast, RowVar)
    return r.bcast


@dataclass(frozen=True, slots=True)
class ConvSpec:
    """A convolution axis is indexed by `sum(coeff * index of var) + offset`."""

    terms: tuple[tuple[int, Var], ...]
    offset: int


Special = FixedIdx | Iterator | ConvSpec


class Item:
    """A shape-level condition. `check` returns the constraints it derives now and whether it is
    settled for good; the `force_*` methods choose values while closing."""

    __slots__ = ()

    def check(self, env: Env) -> tuple[list[Constraint], bool]:
        raise NotImplementedError

    def force_rows(self, env: Env) -> list[Constraint]:
        return []

    def force_dims(self, env: Env) -> list[Constraint]:
        return []

    def waiting(self, env: Env) -> set[Var]:
        """Dimension variables that closing should leave to `force_dims` while it can."""
        return set()

    def reserved_rows(self, env: Env) -> set[RowVar]:
        """Row variables that closing should not close to "no further axes" on its own."""
        return set()

    def owned_rows(self, env: Env) -> set[RowVar]:
        """Row variables that closing should leave entirely to `force_rows`, LUB included."""
        return set()

    def owned_dims(self, env: Env) -> set[Var]:
        """Dimension variables that closing should leave to `force_dims`, LUB included."""
        return set()

    def force_dims_late(self, env: Env) -> list[Constraint]:
        """Choices made only when no item can force anything with `force_dims`: a guess that a
        stronger derivation elsewhere (e.g. a convolution's valid extent) should override."""
        return []


@dataclass(frozen=True, slots=True, eq=False)
class TotalItem(Item):
    """The whole shape (all three rows) has `n` elements."""

    shape: Shape
    n: int
    what: str

    def _combined(self, env: Env) -> tuple[Row, list[Row]]:
        rows = [subst_row(env, r) for r in self.shape.rows()]
        open_rows = [r for r in rows if isinstance(r.bcast, RowVar)]
        rid = RowId(self.shape.id, Kind.OUTPUT, self.shape.debug_name, role=self.what)
        bcast = open_rows[0].bcast if open_rows else Broadcastable()
        return Row(tuple(d for r in rows for d in r.dims), bcast, rid, TotalElems(self.n)), open_rows

    def check(self, env: Env) -> tuple[list[Constraint], bool]:
        row, _ = self._combined(env)
        derived = apply_constraint(env, row)
        return ([], False) if derived is None else (derived, not derived)

    def owned_rows(self, env: Env) -> set[RowVar]:
        return {_var_of(r) for r in self._combined(env)[1]}

    def force_rows(self, env: Env) -> list[Constraint]:
        """Unknown rows take their LUBs if these fit the element count; otherwise the output
        row (else input, else batch) takes the remaining elements as one axis, and the other
        unknown rows get no further axes."""
        row, open_rows = self._combined(env)
        if not open_rows:
            return []
        lubs = {_var_of(r): row_lub(env, _var_of(r)) for r in open_rows}
        planned: list[Var | Dim] = []
        for r in open_rows:
            lub = lubs[_var_of(r)]
            planned += lub.dims if lub else ()
        planned += row.dims
        uppers = [dim_upper(env, d) for d in planned]
        product = math.prod(u for u in uppers if u is not None)
        n_unknown = uppers.count(None)
        if any(lubs.values()) and (product == self.n if n_unknown == 0 else n_unknown == 1 and self.n % product == 0):
            return [RowEq(row_of_var(_var_of(r), r.id), lubs[_var_of(r)] or Row((), Broadcastable(), r.id))
                    for r in open_rows]
        by_kind = {r.id.kind: r for r in open_rows}
        chosen = next(by_kind[k] for k in (Kind.OUTPUT, Kind.INPUT, Kind.BATCH) if k in by_kind)
        out: list[Constraint] = [RowEq(row_of_var(_var_of(r), r.id), Row((), Broadcastable(), r.id))
                                 for r in open_rows if r.bcast != chosen.bcast]
        rest = self.n // math.prod(d.d for d in row.dims if isinstance(d, Dim))
        has_vars = any(isinstance(d, Var) for d in row.dims)
        extra = (new_dim(rest, AxisRef(row.id, 0)),) if rest > 1 and not has_vars else ()
        out.append(RowEq(row_of_var(_var_of(chosen), chosen.id), Row(extra, Broadcastable(), chosen.id)))
        return out


@dataclass(frozen=True, slots=True, eq=False)
class BatchSliceItem(Item):
    """`arg`'s batch row is `var` followed by `cur`'s batch row; waits until one of them is known."""

    cur: Shape
    arg: Shape
    var: Var

    def check(self, env: Env) -> tuple[list[Constraint], bool]:
        cur_b, arg_b = subst_row(env, self.cur.batch), subst_row(env, self.arg.batch)
        if isinstance(arg_b.bcast, Broadcastable) and not arg_b.dims:
            raise ShapeError(f"batch slice: {describe_row_id(arg_b.id)} has no batch axis to remove "
                             f"(slicing into {describe_row_id(cur_b.id)})")
        if isinstance(cur_b.bcast, Broadcastable):
            return [RowEq(Row((self.var, *cur_b.dims), Broadcastable(), cur_b.id), arg_b)], True
        if isinstance(arg_b.bcast, Broadcastable):
            return [RowEq(cur_b, Row(arg_b.dims[1:], Broadcastable(), arg_b.id))], False
        return [], False

    def reserved_rows(self, env: Env) -> set[RowVar]:
        """The sliced row needs an axis: let the result's batch row close first."""
        arg_b = subst_row(env, self.arg.batch)
        return {arg_b.bcast} if isinstance(arg_b.bcast, RowVar) else set()


@dataclass(frozen=True, slots=True, eq=False)
class AxisCountItem(Item):
    """An argument row that an einsum spec names axis by axis (no row variable) has exactly
    that many axes. Broadcasting would prepend size-1 axes to a shorter row — viewing a `[D]`
    axis as `h,e` would silently make `h` of size 1 (one head) — so a shorter row, once
    known, is an error naming the spec's column, the row and the tensor; splitting an axis
    takes an explicit split."""

    text: str
    spec: RowSpec
    arg: Row

    def check(self, env: Env) -> tuple[list[Constraint], bool]:
        row = subst_row(env, self.arg)
        if isinstance(row.bcast, RowVar):
            return [], False
        n, m = len(self.spec.axes), len(row.dims)
        if m < n:
            dims = ", ".join(describe_dim(d) for d in row.dims)
            raise ShapeError(
                f'einsum spec "{self.text}": column {self.spec.column + 1}: the {row.id.kind.value} row names {n} '
                f"axes ({_axes_text(self.spec)}), but {describe_row_id(row.id)} has {m} there ([{dims}]); "
                f"a missing axis would silently get size 1 — split the axis explicitly instead")
        return [], True


def _axes_text(spec: RowSpec) -> str:
    return ", ".join(a.name if isinstance(a, Label) else "_" if isinstance(a, Anonymous) else str(a)
                     for a in spec.axes)


@dataclass(frozen=True, slots=True, eq=False)
class FixedItem(Item):
    """A fixed index must be within its axis, which it bounds from below: an axis still unknown
    when closing grows to `index + 1`. On the result side (`lhs`) the axis is the index's own:
    it takes `index + 1` before any LUB, so that a consumer broadcasting against the result
    (`x - sum(x, "i => 0")`) does not widen it with cells nothing writes."""

    var: Var
    index: int
    where: AxisRef
    lhs: bool = False

    def check(self, env: Env) -> tuple[list[Constraint], bool]:
        d = subst_dim(env, self.var)
        if isinstance(d, Var):
            return [], False
        if self.index >= d.d:
            raise ShapeError(f"fixed index {self.index} is out of range for {describe_axis(self.where)}, "
                             f"of size {describe_dim(d)}")
        return [], True

    def force_dims(self, env: Env) -> list[Constraint]:
        d = subst_dim(env, self.var)
        return [DimEq(d, new_dim(self.index + 1, self.where))] if isinstance(d, Var) else []

    def waiting(self, env: Env) -> set[Var]:
        d = subst_dim(env, self.var)
        return {d} if isinstance(d, Var) else set()

    def owned_dims(self, env: Env) -> set[Var]:
        return self.waiting(env) if self.lhs else set()


@dataclass(frozen=True, slots=True, eq=False)
class ConvItem(Item):
    """A convolution axis `var` indexed by `sum(c * term) + offset` must be long enough for the
    largest index. A negative offset is padding `p = -offset` before the start, and unless
    `right_padding` says otherwise as many cells after the end: the index may run that far
    past either end (those reads are guarded). Closing derives the one unknown term
    (e.g. the output size) from a known extent as the largest that fits, as PyTorch sizes a
    convolution; only when nothing else can be derived does the extent follow from the terms
    (the smallest that fits), since a strided read such as `2*p` of a known `p` does not tell
    whether the axis had one more cell."""

    var: Var
    terms: tuple[tuple[int, Var], ...]
    offset: int
    where: AxisRef
    #: The terms that are result axes (the output position, not the kernel's).
    results: frozenset[Var] = frozenset()
    #: The argument's row and the axis position from its end that the convolution reads.
    arg_axis: tuple[Row, int] | None = None
    #: The padding after the end, when it differs from the padding before the start.
    right_padding: int | None = None

    @property
    def padding(self) -> int:
        """The cells the index may run past the end (what sizing the axis needs)."""
        return max(0, -self.offset) if self.right_padding is None else self.right_padding

    def _solved(self, env: Env) -> tuple[Dim | Var, list[tuple[int, Var]], int]:
        extent = subst_dim(env, self.var)
        solved = [(c, subst_dim(env, v)) for c, v in self.terms]
        unknown = [(c, d) for c, d in solved if isinstance(d, Var)]
        top = sum(c * (d.d - 1) for c, d in solved if isinstance(d, Dim)) + self.offset
        return extent, unknown, top

    def _too_short(self, extent: Dim, top: int) -> ShapeError:
        left = max(0, -self.offset)
        pad = (f" with padding {left}:{self.padding}" if self.padding != left
               else f" with padding {self.padding}" if self.padding else "")
        return ShapeError(f"convolution axis {describe_axis(self.where)} is indexed up to {top}, but has "
                          f"size {describe_dim(extent)}{pad}")

    def _arg_dim(self, env: Env) -> Dim | None:
        """The argument's own axis: a convolution reads it, it cannot broadcast (a known size 1
        bounds the spec's variable from below only, which would leave the extent open)."""
        if self.arg_axis is None:
            return None
        row, from_end = self.arg_axis
        r = subst_row(env, row)
        d = r.dims[from_end] if len(r.dims) >= -from_end else None
        return d if isinstance(d, Dim) else None

    def check(self, env: Env) -> tuple[list[Constraint], bool]:
        extent, unknown, top = self._solved(env)
        if isinstance(extent, Var):
            arg = self._arg_dim(env)
            return ([DimEq(extent, arg)] if arg is not None else []), False
        if top >= extent.d + self.padding:
            raise self._too_short(extent, top)
        return [], not unknown

    def force_dims(self, env: Env) -> list[Constraint]:
        extent, unknown, top = self._solved(env)
        if isinstance(extent, Var) or len(unknown) != 1:
            return []
        coeff, v = unknown[0]
        if self.results and v not in self.results and not _bounded(env, v):
            return []  # a kernel term that no axis bounds: its kernel has size 1 (broadcast)
        room = extent.d - 1 + self.padding - top
        if room < 0:
            raise self._too_short(extent, top)
        return [DimEq(v, new_dim(room // coeff + 1, self.where))]

    def force_dims_late(self, env: Env) -> list[Constraint]:
        extent, unknown, top = self._solved(env)
        if not isinstance(extent, Var) or unknown:
            return []
        return [DimEq(extent, new_dim(max(1, top + 1 - self.padding), self.where))]

    def waiting(self, env: Env) -> set[Var]:
        """The extent and the result terms wait to be derived; a kernel term that nothing
        determines (a kernel of size 1 broadcasts, so it bounds nothing) may close to 1 first."""
        return {d for d in (subst_dim(env, v) for v in (self.var, *self.results)) if isinstance(d, Var)}


def _bounded(env: Env, v: Var) -> bool:
    entry = env.dims.get(v)
    return isinstance(entry, Bounds) and bool(entry.cur or entry.subr or entry.lub)


@dataclass(slots=True)
class Generated:
    """What one operation contributes to inference: constraints, items, the rows of its einsum
    slots (whose variables closing must reach too), and for projection inference the einsum
    variables with a fixed or affine index, or a static symbol."""

    constraints: list[Constraint] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    specials: dict[Var, Special] = field(default_factory=dict)
    spec_rows: list[Row] = field(default_factory=list)


def _ineqs(cur: Shape, subr: Shape, pairs: tuple[tuple[Kind, Kind], ...] | None = None) -> list[Constraint]:
    pairs = pairs or tuple((k, k) for k in Kind)
    return [RowIneq(cur.row(kc), subr.row(ks)) for kc, ks in pairs]


def constraints_of(logic: Logic, cur: Shape, args: tuple[Shape, ...]) -> Generated:
    """The constraints of `logic` with result shape `cur` and argument shapes `args`."""
    gen = Generated()
    match logic:
        case Terminal(ConstantFill(n, strict)):
            if strict:
                gen.items.append(TotalItem(cur, n, f"ConstantFill of {n} values"))
        case Terminal(FileMapped(path, itemsize)):
            n = _file_elements(path, itemsize)
            gen.items.append(TotalItem(cur, n, f'file "{path}" of {n} elements'))
        case Terminal():
            pass
        case Transpose(PointwiseUn(), _):
            gen.constraints += _ineqs(cur, args[0])
        case Transpose(TransposeIO(), _):
            io = ((Kind.BATCH, Kind.BATCH), (Kind.INPUT, Kind.OUTPUT), (Kind.OUTPUT, Kind.INPUT))
            gen.constraints += _ineqs(cur, args[0], io)
        case Transpose(BatchSlice(sym), _):
            var = get_var("slice")
            gen.specials[var] = Iterator(sym.symbol)
            if sym.static_range is not None:
                gen.constraints.append(DimEq(var, new_dim(sym.static_range)))
            gen.constraints += [RowEq(cur.input, args[0].input), RowEq(cur.output, args[0].output)]
            gen.items.append(BatchSliceItem(cur, args[0], var))
        case Transpose(Permute(spec), _):
            _einsum(gen, spec, cur, args)
        case Broadcast(PointwiseBin(), _, _):
            gen.constraints += _ineqs(cur, args[0]) + _ineqs(cur, args[1])
        case Broadcast(Compose(), _, _):
            s1, s2 = args
            gen.constraints.append(RowIneq(s1.input, s2.output))
            gen.constraints += [RowIneq(cur.batch, s1.batch), RowIneq(cur.batch, s2.batch),
                                RowIneq(cur.input, s2.input), RowIneq(cur.output, s1.output)]
        case Broadcast(Einsum(spec), _, _):
            _einsum(gen, spec, cur, args)
    return gen


def _file_elements(path: str, itemsize: int) -> int:
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise ShapeError(f'FileMapped: cannot read the length of "{path}": {e.strerror}') from e
    if itemsize < 1 or size % itemsize:
        raise ShapeError(f'FileMapped: "{path}" has {size} bytes, not a multiple of the item size {itemsize}')
    return size // itemsize


def _einsum(gen: Generated, text: str, cur: Shape, args: tuple[Shape, ...]) -> None:
    spec = parse_spec(text, len(args))
    names = _SpecNames(gen, text, spec.lhs)
    roles = ("rhs",) if len(args) == 1 else ("rhs1", "rhs2")
    lhs = names.rows(spec.lhs, cur, "lhs", result=True)
    rhs = [names.rows(slot, sh, role) for slot, sh, role in zip(spec.rhs, args, roles, strict=True)]
    for kind in Kind:
        gen.constraints.append(RowEq(cur.row(kind), lhs[kind]))
        gen.constraints += [RowIneq(r[kind], sh.row(kind)) for r, sh in zip(rhs, args, strict=True)]


class _SpecNames:
    """The variables of one use of an einsum spec: pseudo-labels and row variables by name."""

    __slots__ = ("gen", "text", "dims", "row_vars", "result_labels")

    def __init__(self, gen: Generated, text: str, lhs: SlotSpec):
        self.gen, self.text = gen, text
        self.result_labels = {a.name for kind in Kind for a in lhs.row(kind.value).axes if isinstance(a, Label)}
        self.dims: dict[str, Var] = {}
        self.row_vars: dict[str, RowVar] = {}

    def dim(self, name: str) -> Var:
        if name not in self.dims:
            self.dims[name] = get_var(name)
        return self.dims[name]

    def rows(self, slot: SlotSpec, sh: Shape, role: str, result: bool = False) -> dict[Kind, Row]:
        out = {}
        for kind in Kind:
            spec = slot.row(kind.value)
            rid = RowId(sh.id, kind, sh.debug_name, role=f'einsum "{self.text}" {role}')
            n = len(spec.axes)
            dims = tuple(self._axis(axis, AxisRef(rid, i if spec.row_var is None else i - n), result,
                                    (sh.row(kind), i - n))
                         for i, axis in enumerate(spec.axes))
            if spec.row_var is None:
                out[kind] = Row(dims, Broadcastable(), rid)
                if not result and n:
                    self.gen.items.append(AxisCountItem(self.text, spec, sh.row(kind)))
            else:
                if spec.row_var not in self.row_vars:
                    self.row_vars[spec.row_var] = get_row_var(spec.row_var)
                out[kind] = Row(dims, self.row_vars[spec.row_var], rid)
        self.gen.spec_rows += out.values()
        return out

    def _axis(self, axis, where: AxisRef, result: bool, arg_axis: tuple[Row, int]) -> Var:
        match axis:
            case Label(name):
                return self.dim(name)
            case FixedIndex(i):
                v = get_var(str(i))
                self.gen.specials[v] = FixedIdx(i)
                self.gen.items.append(FixedItem(v, i, where, result))
                return v
            case ConvAxis(terms, offset, right):
                v = get_var("conv")
                term_vars = tuple((c, self.dim(name)) for c, name in terms)
                self.gen.specials[v] = ConvSpec(term_vars, offset)
                results = frozenset(self.dim(name) for _, name in terms if name in self.result_labels)
                self.gen.items.append(ConvItem(v, term_vars, offset, where, results, arg_axis, right))
                return v
            case Anonymous():
                return get_var("_")
        raise ShapeError(f'einsum spec "{self.text}": unsupported axis entry {axis!r}')
