"""Rows of axes, shape variables, and the constraint solver of shape inference.

A row is the axes of one kind (batch, input or output) of a shape. Its `dims` are known sizes
(`Dim`) or dimension variables (`Var`); its `bcast` is either a row variable — standing for any
number of further axes, which broadcasting puts in front, so solving it *prepends* axes — or
`Broadcastable`, meaning there are no further axes.

Broadcasting makes the constraints inequalities: `cur >= subr` says that `subr` (a part of a
sub-tensor) fits into `cur` (the super-tensor). For dimensions, `n >= m` holds iff `n == m` or
`m == 1`; for rows, `q >= r` iff `q` has at least as many axes as `r` and their trailing axes
compare dimension-wise. The environment records, per unsolved variable, the variables directly
above it (`cur`) and below it (`subr`) — a cycle of bounds makes its variables equal — and its
least upper bound (`lub`), pushed down the `subr` edges. A dimension's LUB is a known dimension;
a row variable's LUB is a row of fresh dimension variables, each bounded by the aligned axis of
every known upper bound. Closing sets what is left to its LUB, else to dimension 1 / no further
axes.

Values are frozen; the environment is a mutable `Env` that callers copy before a speculative
solve (`Env.copy`) so that a failed solve leaves nothing half-applied.

The `proj_id` of a `Dim` identifies the axis it came from: in global inference it lets labels
propagate between known dimensions and lets error messages say where a size came from; in
projection inference it is freshened per operation and lines up iterators.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import AbstractSet, Any, Generic, Mapping, TypeVar, Union, overload

from einjit.shape.errors import ShapeError

#: A row longer than this is taken as the sign of an unsatisfiable cycle of row constraints.
MAX_AXES = 64

_uid = itertools.count(1)


class Kind(Enum):
    BATCH = "batch"
    INPUT = "input"
    OUTPUT = "output"


@dataclass(frozen=True, slots=True)
class Var:
    """A dimension variable. `name` is for printing only (e.g. the einsum pseudo-label)."""

    id: int
    name: str = field(default="", compare=False)

    def __repr__(self) -> str:
        return f"_{self.name}{self.id}"


@dataclass(frozen=True, slots=True)
class Dim:
    """A known dimension, optionally labelled (e.g. `rgb` on size 3)."""

    d: int
    label: str | None = None
    proj_id: int | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        return str(self.d) if self.label is None else f"{self.label}={self.d}"


AnyDim = Var | Dim


@dataclass(frozen=True, slots=True)
class RowVar:
    id: int
    name: str = field(default="", compare=False)

    def __repr__(self) -> str:
        return f"..{self.name or 'r'}{self.id}.."


@dataclass(frozen=True, slots=True)
class Broadcastable:
    """No further axes (the row is still broadcastable to more axes where it is a `subr`)."""


Bcast = RowVar | Broadcastable


@dataclass(frozen=True, slots=True)
class Unconstrained:
    pass


@dataclass(frozen=True, slots=True)
class TotalElems:
    """The row, inclusive of the axes of its row variable, has `n` elements."""

    n: int


RowConstr = Unconstrained | TotalElems


@dataclass(frozen=True, slots=True)
class RowId:
    """Which shape and axis kind a row belongs to; `role` marks rows of an einsum slot."""

    sh_id: int
    kind: Kind
    name: str = field(default="", compare=False)
    role: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Row:
    dims: tuple[AnyDim, ...]
    bcast: Bcast
    id: RowId = field(compare=False)
    constr: RowConstr = Unconstrained()

    def __repr__(self) -> str:
        parts = ([repr(self.bcast)] if isinstance(self.bcast, RowVar) else []) + [repr(d) for d in self.dims]
        return ",".join(parts)


_Value = TypeVar("_Value")
_Lub = TypeVar("_Lub")


@dataclass(frozen=True, slots=True)
class Solved(Generic[_Value]):
    """A solved variable: a dimension variable's value is a dimension, a row variable's a row."""

    value: _Value


@dataclass(frozen=True, slots=True)
class Bounds(Generic[_Lub]):
    """`cur >= v >= subr` for every listed variable, and `lub >= v`. The lists hold direct
    bounds; their transitive closure is followed when needed (cycles, LUB propagation).
    A dimension variable's LUB is a `Dim`, a row variable's a `Row`."""

    cur: frozenset = frozenset()
    subr: frozenset = frozenset()
    lub: _Lub | None = None


Entry = Solved | Bounds
#: The entry of a dimension variable and of a row variable.
DimEntry = Union[Solved[AnyDim], Bounds[Dim]]
RowEntry = Union[Solved[Row], Bounds[Row]]
_NO_BOUNDS: Bounds[Any] = Bounds()


@dataclass(frozen=True, slots=True)
class AxisRef:
    """An axis of a row: `pos` counts from the left when >= 0, from the end when < 0."""

    row: RowId
    pos: int


Origin = tuple[AxisRef | None, AxisRef | None]


@dataclass(frozen=True, slots=True)
class DimEq:
    d1: AnyDim
    d2: AnyDim
    origin: Origin | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class RowEq:
    r1: Row
    r2: Row


@dataclass(frozen=True, slots=True)
class DimIneq:
    cur: AnyDim
    subr: AnyDim
    origin: Origin | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class RowIneq:
    cur: Row
    subr: Row


Constraint = DimEq | RowEq | DimIneq | RowIneq


def get_var(name: str = "") -> Var:
    return Var(next(_uid), name)


def get_row_var(name: str = "") -> RowVar:
    return RowVar(next(_uid), name)


#: Where each axis identity (`proj_id`) was introduced, for error messages.
_axis_homes: dict[int, AxisRef] = {}


def fresh_proj_id(home: AxisRef | None = None) -> int:
    pid = next(_uid)
    if home is not None:
        _axis_homes[pid] = home
    return pid


def new_dim(d: int, home: AxisRef | None = None) -> Dim:
    """A known dimension with its own axis identity."""
    return Dim(d, None, fresh_proj_id(home))


def row_of_var(v: RowVar, rid: RowId) -> Row:
    return Row((), v, rid)


class Env:
    """Solutions and bounds of dimension and row variables, plus the solver's bookkeeping:
    inferred labels per axis identity, a representative row id per row variable (for messages),
    the row inequalities waiting for a row variable to be solved, the row variables solved since
    `solve` last retried those, and what was solved or labelled since the env was copied."""

    __slots__ = ("dims", "rows", "labels", "hints", "row_homes", "pending", "newly_solved", "touched")

    def __init__(self) -> None:
        self.dims: dict[Var, DimEntry] = {}
        self.rows: dict[RowVar, RowEntry] = {}
        self.labels: dict[int, str] = {}
        #: Labels of dimension-1 axes broadcast into a variable: the label it takes if it
        #: closes to 1 (seed 004: `'q' 2.0` labels the axis it meets).
        self.hints: dict[Var, str] = {}
        self.row_homes: dict[RowVar, RowId] = {}
        self.pending: list[RowIneq] = []
        self.newly_solved: set[RowVar] = set()
        #: Variables solved and axis ids labelled since this env was made or copied.
        self.touched: set = set()

    def copy(self) -> Env:
        """A copy to solve on speculatively; its `touched` starts empty."""
        env = Env()
        env.dims, env.rows, env.labels = dict(self.dims), dict(self.rows), dict(self.labels)
        env.hints = dict(self.hints)
        env.row_homes, env.pending, env.newly_solved = dict(self.row_homes), list(self.pending), set(self.newly_solved)
        return env

    def var_row(self, v: RowVar) -> Row:
        return row_of_var(v, self.row_homes.get(v, RowId(-1, Kind.OUTPUT)))


# ------------------------------------------------------------------ describing, for messages

def describe_row_id(rid: RowId) -> str:
    shape = f'"{rid.name}" (#{rid.sh_id})' if rid.name else f"shape #{rid.sh_id}"
    if rid.sh_id < 0:
        shape = "a row variable"
    return f"{rid.role} for {shape}" if rid.role else shape


def describe_axis(ref: AxisRef) -> str:
    where = f"axis {ref.pos}" if ref.pos >= 0 else f"axis {ref.pos} (from the end)"
    return f"{describe_row_id(ref.row)} {ref.row.kind.value} {where}"


def describe_dim(d: AnyDim) -> str:
    if isinstance(d, Var):
        return f"unknown {d!r}"
    home = _axis_homes.get(d.proj_id) if d.proj_id is not None else None
    return repr(d) if home is None else f"{d!r} (from {describe_axis(home)})"


def _conflict(what: str, d1: AnyDim, d2: AnyDim, origin: Origin | None) -> ShapeError:
    where = ""
    if origin is not None and origin[0] is not None and origin[1] is not None:
        where = f" between {describe_axis(origin[0])} and {describe_axis(origin[1])}"
    return ShapeError(f"{what}{where}: {describe_dim(d1)} vs {describe_dim(d2)}")


def _row_conflict(what: str, r1: Row, r2: Row) -> ShapeError:
    return ShapeError(f"{what}: {describe_row_id(r1.id)} {r1.id.kind.value} row [{r1!r}] vs "
                      f"{describe_row_id(r2.id)} {r2.id.kind.value} row [{r2!r}]")


def _pair_origins(r1: Row, r2: Row, k: int) -> list[Origin]:
    """Origins of the `k` trailing axis pairs of two rows."""
    def ref(r: Row, i: int) -> AxisRef:
        n = len(r.dims)
        return AxisRef(r.id, n - k + i if isinstance(r.bcast, Broadcastable) else i - k)
    return [(ref(r1, i), ref(r2, i)) for i in range(k)]


# ------------------------------------------------------------------ substitution

@overload
def subst_dim(env: Env, d: Dim) -> Dim: ...


@overload
def subst_dim(env: Env, d: AnyDim) -> AnyDim: ...


def subst_dim(env: Env, d: AnyDim) -> AnyDim:
    """Follow solutions of a dimension variable; fill in a label inferred for the axis."""
    while isinstance(d, Var):
        entry = env.dims.get(d)
        if not isinstance(entry, Solved):
            return d
        d = entry.value
    if d.label is None and d.proj_id is not None:
        label = env.labels.get(d.proj_id)
        if label is not None:
            return Dim(d.d, label, d.proj_id)
    return d


def expand_row(env: Env, r: Row) -> Row:
    """Substitute solved row variables (prepending their axes), leaving the dims as they are."""
    bcast = r.bcast
    prefix: tuple[AnyDim, ...] = ()
    while isinstance(bcast, RowVar):
        entry = env.rows.get(bcast)
        if not isinstance(entry, Solved):
            break
        prefix = entry.value.dims + prefix
        bcast = entry.value.bcast
    return r if not prefix and bcast is r.bcast else Row(prefix + r.dims, bcast, r.id, r.constr)


def subst_row(env: Env, r: Row) -> Row:
    r = expand_row(env, r)
    dims = tuple(subst_dim(env, d) for d in r.dims)
    if all(a is b for a, b in zip(dims, r.dims, strict=True)):
        return r
    return Row(dims, r.bcast, r.id, r.constr)


def _internal(message: str) -> ShapeError:
    return ShapeError(f"internal error of shape inference (please report): {message}")


def _entry(env_map: Mapping[Any, Solved[Any] | Bounds[_Lub]], v: object) -> Bounds[_Lub]:
    entry = env_map.get(v, _NO_BOUNDS)
    if not isinstance(entry, Bounds):
        raise _internal(f"{v!r} is solved but still referenced")
    return entry


def s_dim_one_in_entry(v: Var, value: AnyDim, key: Var, entry: DimEntry) -> tuple[list[Constraint], DimEntry]:
    """Substitute `v := value` in the entry of `key`; an inequality with `v` becomes one with
    `value`. Solved entries are substituted lazily by `subst_dim`."""
    if isinstance(entry, Solved):
        return [], entry
    out: list[Constraint] = []
    cur, subr = entry.cur, entry.subr
    if v in cur:
        cur = cur - {v}
        out.append(DimIneq(value, key))
    if v in subr:
        subr = subr - {v}
        out.append(DimIneq(key, value))
    return out, Bounds(cur, subr, entry.lub)


def s_row_one_in_entry(v: RowVar, value: Row, key: Row, entry: RowEntry) -> tuple[list[Constraint], RowEntry]:
    """Substitute `v := value` in the entry of the row variable of `key`."""
    if isinstance(entry, Solved):
        return [], entry
    out: list[Constraint] = []
    cur, subr = entry.cur, entry.subr
    if v in cur:
        cur = cur - {v}
        out.append(RowIneq(value, key))
    if v in subr:
        subr = subr - {v}
        out.append(RowIneq(key, value))
    return out, Bounds(cur, subr, entry.lub)


# ------------------------------------------------------------------ equations

def _merge_labels(env: Env, a: Dim, b: Dim, origin: Origin | None) -> None:
    if a.label is not None and b.label is not None:
        if a.label != b.label:
            raise _conflict("label mismatch", a, b, origin)
        return
    labelled, other = (a, b) if a.label is not None else (b, a)
    if labelled.label is not None and other.proj_id is not None:
        env.labels[other.proj_id] = labelled.label
        env.touched.add(other.proj_id)


def _set_dim(env: Env, v: Var, value: AnyDim) -> list[Constraint]:
    entry = _entry(env.dims, v)
    env.dims[v] = Solved(value)
    env.touched.add(v)
    out: list[Constraint] = []
    for key in entry.cur | entry.subr:
        more, env.dims[key] = s_dim_one_in_entry(v, value, key, env.dims[key])
        out.extend(more)
    if entry.lub is not None:
        out.append(DimIneq(entry.lub, value))
    return out


def unify_dim(env: Env, d1: AnyDim, d2: AnyDim, origin: Origin | None = None) -> list[Constraint]:
    """Solve `d1 = d2`; returns the inequalities this entails (from the variables' bounds)."""
    a, b = subst_dim(env, d1), subst_dim(env, d2)
    match a, b:
        case Var(), _:
            return [] if a == b else _set_dim(env, a, b)
        case _, Var():
            return _set_dim(env, b, a)
    assert isinstance(a, Dim) and isinstance(b, Dim)  # the cases with a variable returned above
    if a.d != b.d:
        raise _conflict("dimension mismatch", a, b, origin)
    _merge_labels(env, a, b, origin)
    return []


def _set_row(env: Env, v: RowVar, value: Row) -> list[Constraint]:
    entry = _entry(env.rows, v)
    env.rows[v] = Solved(value)
    env.newly_solved.add(v)
    env.touched.add(v)
    out: list[Constraint] = []
    for key in entry.cur | entry.subr:
        more, env.rows[key] = s_row_one_in_entry(v, value, env.var_row(key), env.rows[key])
        out.extend(more)
    if entry.lub is not None:
        out.append(RowIneq(entry.lub, value))
    return out


def unify_row(env: Env, r1: Row, r2: Row) -> list[Constraint]:
    """Solve `r1 = r2` (no broadcasting); returns the dimension equations of the aligned axes
    and the inequalities entailed by the bounds of a solved row variable."""
    r1, r2 = subst_row(env, r1), subst_row(env, r2)
    _note_homes(env, r1, r2)
    n1, n2 = len(r1.dims), len(r2.dims)
    k = min(n1, n2)
    eqs: list[Constraint] = [DimEq(x, y, o) for x, y, o in
                             zip(r1.dims[n1 - k:], r2.dims[n2 - k:], _pair_origins(r1, r2, k), strict=True)]
    match r1.bcast, r2.bcast:
        case RowVar(), RowVar() if r1.bcast == r2.bcast:
            if n1 != n2:
                raise _row_conflict("infinite number of axes: a row variable would contain itself", r1, r2)
            return eqs
        case Broadcastable(), Broadcastable():
            if n1 != n2:
                raise _row_conflict("number of axes mismatch", r1, r2)
            return eqs
    if n1 > n2 or (n1 == n2 and isinstance(r1.bcast, Broadcastable)):
        r1, r2 = r2, r1
        n1, n2 = n2, n1
    if not isinstance(r1.bcast, RowVar):
        raise _row_conflict("number of axes mismatch", r1, r2)
    value = Row(r2.dims[:n2 - n1], r2.bcast, r1.id)
    return eqs + _set_row(env, r1.bcast, value)


def _note_homes(env: Env, *rows: Row) -> None:
    for r in rows:
        if isinstance(r.bcast, RowVar) and r.bcast not in env.row_homes:
            env.row_homes[r.bcast] = r.id


def apply_constraint(env: Env, row: Row) -> list[Constraint] | None:
    """Make progress on the row's own constraint: [] when satisfied, the equations it decides,
    or None while there is not enough information (e.g. the row is still open)."""
    if not isinstance(row.constr, TotalElems):
        return []
    n = row.constr.n
    r = subst_row(env, row)
    known = math.prod(d.d for d in r.dims if isinstance(d, Dim))
    unknown = [d for d in r.dims if isinstance(d, Var)]
    if n % known:
        raise ShapeError(f"{n} elements do not fit {describe_row_id(r.id)} [{r!r}]: "
                         f"the known dimensions (product {known}) do not divide {n}")
    rest = n // known
    if isinstance(r.bcast, RowVar):
        return None
    distinct = set(unknown)
    if not distinct:
        if rest != 1:
            raise ShapeError(f"{n} elements do not fit {describe_row_id(r.id)} [{r!r}], which has {known}")
        return []
    if rest == 1:
        return [DimEq(v, Dim(1)) for v in distinct]
    if len(distinct) == 1:
        power = len(unknown)
        root = round(rest ** (1 / power))
        if root ** power != rest:
            raise ShapeError(f"{n} elements do not fit {describe_row_id(r.id)} [{r!r}]: {rest} is not "
                             f"a {power}-th power")
        return [DimEq(unknown[0], new_dim(root))]
    return None


# ------------------------------------------------------------------ inequalities

def _update_dim_lub(env: Env, s: Var, upper: Dim, origin: Origin | None) -> list[Constraint]:
    entry = _entry(env.dims, s)
    if entry.lub is None:
        env.dims[s] = replace(entry, lub=upper)
        return [DimIneq(upper, t) for t in entry.subr]
    old = subst_dim(env, entry.lub)
    if old.d == upper.d and (old.label is None or upper.label is None or old.label == upper.label):
        if old.label is None and upper.label is not None:
            env.dims[s] = replace(entry, lub=upper)
        return []
    # Two different upper bounds: only dimension 1 fits under both.
    return [DimEq(s, Dim(1), origin)]


def _add_bound(env_map: dict, c, s) -> bool:
    """Record `c >= s` between two unsolved variables (as direct edges). Returns False if
    `s >= c` already holds through a chain of bounds: a cycle, so the variables are equal."""
    ec = _entry(env_map, c)
    if s in ec.subr:
        return True
    if _above(env_map, c, s):
        return False
    es = _entry(env_map, s)
    env_map[c] = Bounds(ec.cur, ec.subr | {s}, ec.lub)
    env_map[s] = Bounds(es.cur | {c}, es.subr, es.lub)
    return True


def _above(env_map: dict, v, target) -> bool:
    """Whether `target >= v` through a chain of `cur` edges."""
    stack, seen = [v], {v}
    while stack:
        for u in _entry(env_map, stack.pop()).cur:
            if u == target:
                return True
            if u not in seen:
                seen.add(u)
                stack.append(u)
    return False


def below(env_map: dict, roots) -> set:
    """The variables at or below `roots` through chains of `subr` edges."""
    return _reachable(env_map, roots, "subr")


def above(env_map: dict, roots) -> set:
    """The variables at or above `roots` through chains of `cur` edges."""
    return _reachable(env_map, roots, "cur")


def _reachable(env_map: dict, roots, edge: str) -> set:
    found, stack = set(roots), list(roots)
    while stack:
        for w in getattr(_entry(env_map, stack.pop()), edge):
            if w not in found:
                found.add(w)
                stack.append(w)
    return found


def solve_dim_ineq(env: Env, cur: AnyDim, subr: AnyDim, origin: Origin | None = None) -> list[Constraint]:
    """Solve `cur >= subr`; returns derived equations and inequalities."""
    c, s = subst_dim(env, cur), subst_dim(env, subr)
    match c, s:
        case Dim(), Dim():
            if c.d == s.d:
                _merge_labels(env, c, s, origin)
                return []
            if s.d == 1:
                return []
            what = "cannot broadcast" if c.d == 1 else "dimension mismatch"
            raise _conflict(what, c, s, origin)
        case Var(), Dim(d=1):
            if s.label is not None:
                env.hints.setdefault(c, s.label)
            return []
        case _, Dim(d=1):
            return []
        case Dim(d=1), Var():
            return [DimEq(s, c, origin)]
        case Var(), Dim():
            return [DimEq(c, s, origin)]
        case Dim(), Var():
            return _update_dim_lub(env, s, c, origin)
    if c == s:
        return []
    if not _add_bound(env.dims, c, s):
        return [DimEq(c, s, origin)]
    lub = _entry(env.dims, c).lub
    return [] if lub is None else [DimIneq(lub, s)]


def _update_row_lub(env: Env, s: RowVar, upper: Row) -> list[Constraint]:
    """`upper >= s` for a row `upper` with no row variable. The LUB is a row of fresh
    variables, each bounded by the aligned axis of every upper bound seen so far."""
    entry = _entry(env.rows, s)
    home = env.row_homes.get(s, upper.id)
    if entry.lub is None:
        lub = Row(tuple(get_var() for _ in upper.dims), Broadcastable(), home)
        out: list[Constraint] = [RowIneq(lub, env.var_row(t)) for t in entry.subr]
    else:
        old = entry.lub
        k = min(len(old.dims), len(upper.dims))
        lub = Row(old.dims[len(old.dims) - k:], Broadcastable(), home)
        out = [RowIneq(lub, env.var_row(t)) for t in entry.subr] if k < len(old.dims) else []
    env.rows[s] = replace(entry, lub=lub)
    n, k = len(upper.dims), len(lub.dims)
    out += [DimIneq(u, m) for u, m in zip(upper.dims[n - k:], lub.dims, strict=True)]
    if not lub.dims:
        out.append(RowEq(env.var_row(s), Row((), Broadcastable(), home)))
    return out


def solve_row_ineq(env: Env, cur: Row, subr: Row) -> list[Constraint]:
    """Solve `cur >= subr`: dimension inequalities for the aligned trailing axes; `cur` gets
    at least as many axes as `subr` (a row variable of `cur` is expanded by a template of fresh
    variables); what `cur` has beyond `subr` bounds `subr`'s row variable. An inequality that
    can only progress once a row variable is solved waits in `env.pending`. With the same row
    variable on both sides, only the aligned axes are compared."""
    cur, subr = subst_row(env, cur), subst_row(env, subr)
    _note_homes(env, cur, subr)
    nc, ns = len(cur.dims), len(subr.dims)
    k = min(nc, ns)
    pairs: list[Constraint] = [DimIneq(x, y, o) for x, y, o in
                               zip(cur.dims[nc - k:], subr.dims[ns - k:], _pair_origins(cur, subr, k), strict=True)]
    if isinstance(cur.bcast, RowVar) and cur.bcast == subr.bcast:
        if nc < ns:
            raise _row_conflict("infinite number of axes: a row variable would contain itself", cur, subr)
        return pairs
    if ns > nc:
        if not isinstance(cur.bcast, RowVar):
            raise _row_conflict(f"too many axes: {ns} axes do not fit into {nc} (no row variable to "
                                f"broadcast into)", subr, cur)
        if ns > MAX_AXES:
            raise _row_conflict(f"infinite number of axes: cyclic row constraints grow a row past "
                                f"{MAX_AXES} axes", subr, cur)
        template = Row(tuple(get_var() for _ in range(ns - nc)), get_row_var(cur.bcast.name), cur.id)
        return [RowEq(row_of_var(cur.bcast, cur.id), template), RowIneq(cur, subr)]
    if not isinstance(subr.bcast, RowVar):
        return pairs
    rest = Row(cur.dims[:nc - k], cur.bcast, cur.id)
    match rest:
        case Row(dims=(), bcast=RowVar() as c):
            if not _add_bound(env.rows, c, subr.bcast):
                return pairs + [RowEq(row_of_var(c, cur.id), row_of_var(subr.bcast, subr.id))]
            lub = _entry(env.rows, c).lub
            return pairs + ([] if lub is None else [RowIneq(lub, row_of_var(subr.bcast, subr.id))])
        case Row(bcast=Broadcastable()):
            return pairs + _update_row_lub(env, subr.bcast, rest)
    env.pending.append(RowIneq(rest, row_of_var(subr.bcast, subr.id)))
    return pairs


# ------------------------------------------------------------------ the solving loop

def solve(env: Env, constraints: list[Constraint]) -> None:
    """Solve constraints to a fixpoint, retrying a waiting inequality once one of its row
    variables got solved. Raises `ShapeError` on a contradiction (the env is then partially
    updated: callers solve on a copy)."""
    work = list(reversed(constraints))
    while True:
        while work:
            c = work.pop()
            match c:
                case DimEq(d1, d2, origin):
                    more = unify_dim(env, d1, d2, origin)
                case RowEq(r1, r2):
                    more = unify_row(env, r1, r2)
                case DimIneq(cur, subr, origin):
                    more = solve_dim_ineq(env, cur, subr, origin)
                case RowIneq(cur, subr):
                    more = solve_row_ineq(env, cur, subr)
            work.extend(reversed(more))
        solved, env.newly_solved = env.newly_solved, set()
        ready = [p for p in env.pending if p.cur.bcast in solved or p.subr.bcast in solved]
        if not ready:
            return
        env.pending = [p for p in env.pending if not (p.cur.bcast in solved or p.subr.bcast in solved)]
        work = list(reversed(ready))


# ------------------------------------------------------------------ closing

def unsolved_vars(env: Env, rows) -> tuple[list[RowVar], list[Var]]:
    """The unsolved row and dimension variables of the environment and of `rows`, in a
    deterministic order (by id)."""
    row_vars = {v for v, e in env.rows.items() if isinstance(e, Bounds)}
    dim_vars = {v for v, e in env.dims.items() if isinstance(e, Bounds)}
    for row in rows:
        r = subst_row(env, row)
        if isinstance(r.bcast, RowVar):
            row_vars.add(r.bcast)
        dim_vars.update(d for d in r.dims if isinstance(d, Var))
    return sorted(row_vars, key=lambda v: v.id), sorted(dim_vars, key=lambda v: v.id)


def close_rows(env: Env, row_vars: list[RowVar], forced: list[Constraint], reserved: set[RowVar],
               owned: set[RowVar], whole_outputs: AbstractSet[RowVar] = frozenset()) -> list[Constraint]:
    """One closing round for row variables: those with a LUB take it, except the ones `owned` by
    a row constraint; else no further axes for those neither waiting on a pending inequality (at
    or below its lower side, whose upper side may still bring a LUB) nor `reserved` or `owned`;
    else the `forced` closings of the row constraints; else no further axes for the rest.

    Before any closes to no axes, the variables standing for a whole output row
    (`whole_outputs`) close to one axis, whose dimension closes as any other (LUB, else 1): seed 003, "a fully inferred
    tensor shape must have non-empty output axes; scalars are 1-D output-only tensors"."""
    with_lub = [(v, lub) for v in row_vars if v not in owned and (lub := _entry(env.rows, v).lub) is not None]
    if with_lub:
        return [RowEq(env.var_row(v), lub) for v, lub in with_lub]
    waiting = below(env.rows, {p.subr.bcast for p in env.pending})
    kept = reserved | owned
    # A row above one a row constraint owns (the result of a product with a parameter whose
    # values fix its element count) closes after it, as OCANNL closes composite shapes after
    # the terminal ones, which force them from below.
    held = above(env.rows, owned)
    free = [v for v in row_vars if v not in waiting and v not in kept and v not in held]
    if not free and forced:
        return forced
    # The leading rest of a waiting inequality closes first: the axes it releases become a LUB
    # below, which a row above the same variable (a result broadcasting it) must not pre-empt
    # by closing to nothing (`W * y` and `W.T * x` give `W` both rows).
    rests = {p.cur.bcast for p in env.pending}
    free = [v for v in free if v in rests] or free
    free = free or [v for v in row_vars if v not in kept] or row_vars
    # Whole output rows close first, all together, to one axis: the rows tied to them learn it
    # (as a LUB or an axis to keep) before anything closes to nothing.
    outputs = [v for v in free if v in whole_outputs]
    if outputs:
        return [RowEq(env.var_row(v), Row((get_var("scalar"),), Broadcastable(), env.var_row(v).id))
                for v in outputs]
    return [RowEq(env.var_row(v), Row((), Broadcastable(), env.var_row(v).id)) for v in free]


def row_lub(env: Env, v: RowVar) -> Row | None:
    entry = env.rows.get(v)
    return entry.lub if isinstance(entry, Bounds) else None


def dim_upper(env: Env, d: AnyDim) -> int | None:
    """The size of `d` if known, else of its LUB if any."""
    d = subst_dim(env, d)
    if isinstance(d, Dim):
        return d.d
    entry = env.dims.get(d)
    return entry.lub.d if isinstance(entry, Bounds) and entry.lub is not None else None


def close_dims(env: Env, dim_vars: list[Var], forced: list[Constraint], waiting: set[Var],
               owned: AbstractSet[Var] = frozenset()) -> list[Constraint]:
    """One closing round for dimension variables: LUBs first (except for variables `owned` by
    a shape-level constraint), then the `forced` closings of shape-level constraints, then
    dimension 1 — sparing `waiting` variables while others remain, and otherwise closing them
    one at a time so that `forced` gets its chance in between."""
    with_lub = [(v, lub) for v in dim_vars if v not in owned and (lub := _entry(env.dims, v).lub) is not None]
    if with_lub:
        return [DimEq(v, lub) for v, lub in with_lub]
    if forced:
        return forced
    free = [v for v in dim_vars if v not in waiting] or dim_vars[:1]
    return [DimEq(v, Dim(1, env.hints.get(v), fresh_proj_id())) for v in free]
