"""Global, incremental shape inference.

`propagate_shapes` adds one operation's constraints and solves as much as it can, rewriting
the rows of every shape under inference with what is now known. The result does not depend on
the order in which operations are added. `finish_inference` then closes what is left —
unsolved variables take their least upper bound, else dimension 1 / no further axes — and
starts a fresh state: the shapes are fully known from then on.

Every update is solved in place; a failing one rebuilds the state from the updates committed
before it, so a `ShapeError` leaves inference as it was before the failing call. A conflict found only
when closing belongs to constraints committed earlier: the state records every call as an
*entry*, and closing that fails replays the entries to find the expression whose entry first
makes its group of connected shapes impossible to close, and withdraws it with the entries of
that group after it (their operations rejoin inference when a routine uses them again). The
other groups, and the tensors built before the conflicting expression, stay under inference
unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from einjit.shape.errors import ShapeError
from einjit.shape.logic import Generated, Item, constraints_of, fixed_bounds
from einjit.shape.row import (
    Constraint,
    Dim,
    Env,
    Kind,
    Row,
    RowEq,
    RowVar,
    Var,
    above,
    below,
    close_dims,
    close_rows,
    solve,
    subst_row,
    unsolved_vars,
)
from einjit.shape.shape import Shape, Terminal, UpdateStep, logic_args


@dataclass(frozen=True, slots=True, eq=False)
class Leaf:
    """`track`: a leaf tensor's shape joins inference."""

    shape: Shape


@dataclass(frozen=True, slots=True, eq=False)
class Equation:
    """`add_shape_equation`: two rows of one shape are equal."""

    shape: Shape
    k1: Kind
    k2: Kind


Entry = UpdateStep | Leaf | Equation


def _shapes_of(entry: Entry) -> tuple[Shape, ...]:
    match entry:
        case UpdateStep(shape, logic):
            return (shape, *logic_args(logic))
        case Leaf(shape) | Equation(shape, _, _):
            return (shape,)


class InferenceState:
    """An environment with the items still to check and the shapes kept substituted; `watch`
    maps each variable and unlabelled axis id to the shapes whose rows mention it (a set grown in
place: a variable many shapes share, such as a batch axis, is watched by all of them). `log`, when
    a list, records every constraint added (projection inference reads it)."""

    __slots__ = ("env", "items", "shapes", "watch", "spec_rows", "steps", "log", "leaves", "entries")

    def __init__(self) -> None:
        self.env = Env()
        self.items: list[Item] = []
        self.shapes: dict[int, Shape] = {}
        self.watch: dict[object, set[int]] = {}
        self.spec_rows: list[Row] = []
        self.steps: list[UpdateStep] = []
        self.log: list[Constraint] | None = None
        #: The shapes of leaf tensors (`track`): an output row nothing constrains gives them
        #: one axis of dimension 1. Results of operations take their axes from their arguments.
        self.leaves: set[int] = set()
        #: Every call that put something under inference, in order: what closing replays to
        #: withdraw the expression a conflict comes from.
        self.entries: list[Entry] = []

    def copy(self) -> InferenceState:
        st = InferenceState()
        st.env, st.items, st.shapes = self.env.copy(), list(self.items), dict(self.shapes)
        st.watch = {k: set(v) for k, v in self.watch.items()}
        st.spec_rows, st.steps = list(self.spec_rows), list(self.steps)
        st.log = None if self.log is None else list(self.log)
        st.leaves = set(self.leaves)
        st.entries = list(self.entries)
        return st

    def apply(self, entry: Entry) -> None:
        """Add one entry's constraints and solve them (in place: callers work on a copy)."""
        match entry:
            case UpdateStep(shape, logic):
                args = logic_args(logic)
                self.add(constraints_of(logic, shape, args), (shape, *args))
                self.steps.append(entry)
            case Leaf(shape):
                self.add(Generated(), (shape,))
                self.leaves.add(id(shape))
            case Equation(shape, k1, k2):
                self.add(Generated(constraints=[RowEq(shape.row(k1), shape.row(k2))]), (shape,))
        self.entries.append(entry)

    def rows(self) -> list[Row]:
        return [r for sh in self.shapes.values() for r in sh.rows()] + self.spec_rows

    def _watch(self, sh: Shape) -> None:
        key, watch = id(sh), self.watch
        for row in sh.rows():
            if isinstance(row.bcast, RowVar):
                watch.setdefault(row.bcast, set()).add(key)
            for d in row.dims:
                k = d if isinstance(d, Var) else d.proj_id if d.label is None else None
                if k is not None:
                    watch.setdefault(k, set()).add(key)

    def add(self, gen: Generated, shapes: tuple[Shape, ...]) -> None:
        for sh in shapes:
            if id(sh) not in self.shapes:
                self.shapes[id(sh)] = sh
                self._watch(sh)
        self.items += gen.items
        self.spec_rows += gen.spec_rows
        self._solve(gen.constraints)
        self.settle()

    def _solve(self, constraints: list[Constraint]) -> None:
        if self.log is not None:
            self.log += constraints
        solve(self.env, constraints)

    def settle(self) -> None:
        """Check the items until none derives anything more."""
        while True:
            derived: list[Constraint] = []
            remaining = []
            for item in self.items:
                more, done = item.check(self.env)
                derived += more
                if not done:
                    remaining.append(item)
            self.items = remaining
            if not derived:
                return
            self._solve(derived)

    def close(self) -> None:
        """Close all variables: row variables first (their LUB, else no further axes, leaving
        rows that items reserve or own to the items' choice), then dimension variables (LUB;
        else what items force; else 1)."""
        self.settle()
        while True:
            row_vars, dim_vars = unsolved_vars(self.env, self.rows())
            if row_vars:
                forced = [c for it in self.items for c in it.force_rows(self.env)]
                reserved = set().union(*(it.reserved_rows(self.env) for it in self.items))
                owned = set().union(*(it.owned_rows(self.env) for it in self.items))
                closing = close_rows(self.env, row_vars, forced, reserved, owned, self.whole_outputs())
            elif dim_vars:
                forced = ([c for it in self.items for c in it.force_dims(self.env)] + fixed_bounds(self.items, self.env)
                          or [c for it in self.items for c in it.force_dims_late(self.env)])
                waiting = set().union(*(it.waiting(self.env) for it in self.items))
                owned_dims: set[Var] = set().union(*(it.owned_dims(self.env) for it in self.items))
                closing = close_dims(self.env, dim_vars, forced, waiting, owned_dims)
            else:
                return
            solve(self.env, closing)
            self.settle()

    def whole_outputs(self) -> set[RowVar]:
        """The row variables that are all of a leaf's output row (a parameter's, an inline
        declaration's: `leaves`) and not tied, directly or
        through bounds, to the leading axes of a longer row: closing gives them an axis. (The
        rest of a reduction's argument, `...->...c => ...->...`, closes to no axes, and so do
        the results computed from the reduced tensor: one axis there would reach the argument
        as an axis no one asked for, `[1, c]` for `[c]`.)"""
        outputs = (subst_row(self.env, self.shapes[key].output) for key in self.leaves)
        whole = {r.bcast for r in outputs if not r.dims and isinstance(r.bcast, RowVar)}
        if not whole:
            return whole
        tied = {r.bcast for r in (subst_row(self.env, r) for r in self.rows())
                if r.dims and isinstance(r.bcast, RowVar)}
        while True:
            more = above(self.env.rows, tied) | below(self.env.rows, tied)
            if more <= tied:
                return whole - tied
            tied |= more

    def update_shapes(self) -> None:
        """Rewrite the rows of the shapes that mention what this state's env solved or labelled
        (the other rows are substituted already)."""
        env = self.env
        stale = set().union(*(self.watch.get(t, ()) for t in env.touched))
        for key in stale:
            sh = self.shapes[key]
            sh.batch, sh.input, sh.output = (subst_row(env, r) for r in (sh.batch, sh.input, sh.output))
            self._watch(sh)


_state = InferenceState()


def reset_state() -> None:
    """Forget every operation under inference (the shapes keep what they have learned)."""
    global _state
    _state = InferenceState()


#: The operations `_withdraw` took out, by the id of their result shape (the step keeps the
#: shape alive, so the id is not reused): a result used again brings its operation back first,
#: so the conflict is raised again rather than the result closing as if unconstrained.
_withdrawn: dict[int, UpdateStep] = {}


def _add(entry: Entry) -> None:
    """Apply `entry` to the global state in place. Copying the state to try each entry on,
    as inference once did, made building a graph quadratic in its size (10,000 operations:
    690 s); applying in place costs what the entry adds. A failing entry leaves a half-solved
    state, so it is rebuilt from the entries committed before (the shapes keep what those
    taught them): errors cost a replay, successes nothing extra."""
    global _state
    for sh in _shapes_of(entry):
        step = _withdrawn.pop(id(sh), None)
        if step is not None and step is not entry:
            _add(step)
    state = _state
    state.env.touched = set()
    try:
        state.apply(entry)
    except BaseException:
        _state = _replay(state.entries)
        _state.update_shapes()
        raise
    state.update_shapes()


def propagate_shapes(update_step: UpdateStep) -> None:
    """Add the constraints of one operation and solve what they determine, updating the shapes
    of all operations under inference in place."""
    _add(update_step)


def track(shape: Shape) -> None:
    """Put the shape of a leaf tensor (a parameter, an inline declaration, a file-mapped
    constant) under inference, so that the next closing reaches it even if no operation ever
    constrains it, and gives an output row nothing constrains one axis (seed 003)."""
    _add(Leaf(shape))


def add_shape_equation(shape: Shape, k1: Kind, k2: Kind) -> None:
    """Equate two rows of one shape (e.g. `InputEqualsOutput`)."""
    _add(Equation(shape, k1, k2))


def _closed() -> InferenceState:
    """The current state closed, on a copy. On a conflict, withdraws the conflicting
    expression from the global state (`_withdraw`) before raising."""
    trial = _state.copy()
    try:
        trial.close()
    except ShapeError:
        _withdraw()
        raise
    return trial


def provisional_row(shape: Shape, kind: Kind) -> Row:
    """One row of `shape` as `finish_inference` would close it now, leaving inference open: for
    a layer that must know sizes still being derived (a convolution's output extent, found only
    when closing) to build its own operation. Later operations may still change the answer, so
    the caller pins what it builds on."""
    return subst_row(_closed().env, shape.row(kind))


def finish_inference() -> None:
    """Close every still-unsolved variable of the shapes under inference, then start afresh."""
    global _state
    trial = _closed()
    trial.update_shapes()
    unsolved = [sh for sh in trial.shapes.values() if not sh.is_solved()]
    if unsolved:
        raise ShapeError(f"internal error of shape inference (please report): {unsolved[0]!r} is still "
                         "unsolved after closing")
    _state = InferenceState()


def _replay(entries: list[Entry]) -> InferenceState:
    st = InferenceState()
    for e in entries:
        st.apply(e)
    return st


def _closes(entries: list[Entry]) -> bool:
    try:
        _replay(entries).close()
    except ShapeError:
        return False
    return True


def _groups(entries: list[Entry]) -> list[list[Entry]]:
    """The entries split by connected shapes (no constraint relates two groups), in order."""
    parent: dict[int, int] = {}

    def find(k: int) -> int:
        while parent.setdefault(k, k) != k:
            k = parent[k]
        return k
    for e in entries:
        first, *rest = (find(id(sh)) for sh in _shapes_of(e))
        for r in rest:
            parent[r] = first
    groups: dict[int, list[Entry]] = {}
    for e in entries:
        groups.setdefault(find(id(_shapes_of(e)[0])), []).append(e)
    return list(groups.values())


def _withdraw() -> None:
    """Rebuild the global state without the expression a closing conflict comes from: in each
    group of connected shapes that cannot close, the longest prefix of its entries that closes
    stays (found by bisection: adding constraints only takes solutions away), and of the rest
    only the leaves and their terminal data, which concern a shape that nothing kept relates
    to the prefix. Shapes keep what commits taught them, so the replay starts from there.
    The operations left out are remembered in `_withdrawn`."""
    global _state
    kept: set[int] = set()
    for group in _groups(_state.entries):
        if _closes(group):
            kept |= {id(e) for e in group}
            continue
        lo, hi = 0, len(group)  # group[:lo] closes, group[:hi] does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if _closes(group[:mid]) else (lo, mid)
        later: list[Entry] = [e for e in group[hi:]
                              if isinstance(e, Leaf) or (isinstance(e, UpdateStep) and isinstance(e.logic, Terminal))]
        keep = group[:lo] + later if _closes(group[:lo] + later) else group[:lo]
        kept |= {id(e) for e in keep}
    _withdrawn.update((id(e.shape), e) for e in _state.entries if id(e) not in kept and isinstance(e, UpdateStep))
    _state = _replay([e for e in _state.entries if id(e) in kept])
    _state.update_shapes()


def is_active(update_step: UpdateStep) -> bool:
    return any(s is update_step for s in _state.steps)


def to_dims(shape: Shape) -> tuple[int, ...]:
    """The dimensions in memory layout order (batch, output, input); the shape must be solved."""
    dims: list[int] = []
    for row in shape.rows():
        sizes = [d.d for d in row.dims if isinstance(d, Dim)]
        if isinstance(row.bcast, RowVar) or len(sizes) != len(row.dims):
            name = f'"{shape.debug_name}" ' if shape.debug_name else ""
            raise ShapeError(f"shape {name}#{shape.id} is not fully inferred: {row.id.kind.value} row "
                             f"[{row!r}] (shape {shape}); what is still unknown is chosen when a routine "
                             "using it is compiled, or give its dimensions when creating it")
        dims += sizes
    return tuple(dims)
