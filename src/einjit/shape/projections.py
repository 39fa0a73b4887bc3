"""Projection inference: how the loops of one operation index its result and arguments.

The shapes are solved by now, but their solution cannot be reused as is: two axes found equal
because they are reduced together in *another* operation must not share an iterator in this
one. So each call copies the operation's shapes with fresh projection ids (one per axis
occurrence, even when a tensor appears twice), regenerates the operation's constraints and
solves them in a local state. Axes whose dimensions are lined up by a constraint and are equal
share an iterator; an axis of dimension 1 lined up with a larger one was broadcast and is
indexed at 0. Einsum fixed indices, convolution axes and the static symbol of a batch slice
are attached to their variables (`specials`) and override iteration.
"""

from __future__ import annotations

import itertools

from einjit.ir.indexing import (
    Affine,
    AxisIndex,
    FixedIdx,
    Iterator,
    Projections,
    Symbol,
    get_symbol,
    make_affine,
    subst_index,
)
from einjit.shape.errors import ShapeError
from einjit.shape.inference import InferenceState, finish_inference, is_active, propagate_shapes, to_dims
from einjit.shape.logic import ConvSpec, Generated, Special, constraints_of
from einjit.shape.row import (
    AnyDim,
    Broadcastable,
    Constraint,
    Dim,
    DimEq,
    DimIneq,
    Env,
    Row,
    RowEq,
    RowIneq,
    Solved,
    Var,
    expand_row,
    fresh_proj_id,
)
from einjit.shape.shape import BatchSlice, Broadcast, Shape, Terminal, Transpose, UpdateStep, logic_args, logic_to_spec

Key = tuple[str, int]
_anon = itertools.count()


def derive_projections(update_step: UpdateStep) -> Projections:
    """The projections of one operation: lhs is the step's shape, the rhs are the logic's
    arguments. Finishes inference first if any of these shapes is not solved yet."""
    lhs, args = update_step.shape, logic_args(update_step.logic)
    if not all(sh.is_solved() for sh in (lhs, *args)):
        if not is_active(update_step):
            propagate_shapes(update_step)
        finish_inference()
    debug = f"{logic_to_spec(update_step.logic)} for {_name(lhs)}"
    key = projections_key(update_step)
    known = None if key is None else _derived.get(key)
    if known is not None:
        return _renamed(known, debug)
    local_lhs, local_args = _fresh_copy(lhs), tuple(_fresh_copy(a) for a in args)
    state = InferenceState()
    state.log = []
    gen = (Generated() if isinstance(update_step.logic, Terminal)
           else constraints_of(update_step.logic, local_lhs, local_args))
    state.add(gen, (local_lhs, *local_args))
    state.close()
    derived = _Builder(state.env, gen.specials, debug).build(state.log, local_lhs, local_args,
                                                             to_dims(lhs), tuple(to_dims(a) for a in args))
    if key is not None:
        if len(_derived) >= _DERIVED_LIMIT:
            _derived.clear()
        _derived[key] = derived
    return derived


_derived: dict[tuple, Projections] = {}
"""Projections derived so far, by `projections_key`: the same operation on tensors of the same
shapes (every block of a deep model, every step of an unrolled loop) is derived once, and
later ones get a copy with fresh loop symbols. Deriving is a local shape inference per
operation: a third of lowering a GPT training step."""
_DERIVED_LIMIT = 4096


def _renamed(p: Projections, debug: str) -> Projections:
    """`p` with fresh product iterators (each operation's loops are its own), created in the
    order of `p`'s own, as deriving would."""
    fresh: dict[Symbol, AxisIndex] = {s: Iterator(get_symbol(s.name)) for s in p.product_iterators}
    iterators = tuple(i.symbol for i in fresh.values() if isinstance(i, Iterator))
    return Projections(p.product_space, iterators, p.lhs_dims, p.rhs_dims,
                       tuple(subst_index(fresh, i) for i in p.project_lhs),
                       tuple(tuple(subst_index(fresh, i) for i in r) for r in p.project_rhs), debug)


def projections_key(update_step: UpdateStep) -> tuple | None:
    """What `derive_projections(update_step)` is a function of, without deriving: the logic,
    and the solved rows (dims with labels) of the result and the arguments, with shapes and
    rows numbered in order of first appearance (a tensor used twice is numbered once, as
    inference sees it). None while a shape is unsolved: only deriving tells then. The program
    cache keys a program by this instead of the projections, which cost a local inference
    per operation (most of a warm compile)."""
    lhs, args = update_step.shape, logic_args(update_step.logic)
    solved = [sh.solved_rows() for sh in (lhs, *args)]
    if any(rows is None for rows in solved):
        return None
    match update_step.logic:
        case Broadcast(kind, _, _):
            logic: tuple = ("broadcast", kind)
        case Transpose(BatchSlice(symbol) as kind, _):
            logic = ("transpose", kind, symbol.static_range)  # not part of the symbol's equality
        case Transpose(kind, _):
            logic = ("transpose", kind)
        case Terminal(init):
            logic = ("terminal", init)
        case _:
            return None
    numbers: dict[object, int] = {}
    out = []
    for sh, rows in zip((lhs, *args), solved, strict=True):
        assert rows is not None  # checked above
        out.append((numbers.setdefault(sh.id, len(numbers)),
                    *[(numbers.setdefault(row_id, len(numbers)), dims) for row_id, dims in rows]))
    return logic + tuple(out)


def _name(sh: Shape) -> str:
    return f'"{sh.debug_name}" (#{sh.id})' if sh.debug_name else f"shape #{sh.id}"


def _fresh_copy(sh: Shape) -> Shape:
    def fresh(d: AnyDim) -> Dim:
        assert isinstance(d, Dim)  # copied once inferred: every dimension is known
        return Dim(d.d, d.label, fresh_proj_id())

    def row(r: Row) -> Row:
        return Row(tuple(fresh(d) for d in r.dims), Broadcastable(), r.id)
    return Shape(row(sh.batch), row(sh.input), row(sh.output), sh.id, sh.debug_name)


class _UnionFind:
    __slots__ = ("parent",)

    def __init__(self) -> None:
        self.parent: dict[Key, Key] = {}

    def find(self, k: Key) -> Key:
        root = k
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while k != root:
            self.parent[k], k = root, self.parent.get(k, root)
        return root

    def union(self, a: Key, b: Key) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


class _Builder:
    """Lines up the axes of the logged constraints and assigns an index to each class."""

    def __init__(self, env: Env, specials: dict[Var, Special], debug: str):
        self.env, self.debug = env, debug
        self.special_of: dict[Key, Special] = {("s", v.id): sp for v, sp in specials.items()}
        self.uf = _UnionFind()
        self.dim_of: dict[Key, int] = {}
        self.index_of: dict[Key, AxisIndex] = {}
        self.product: list[tuple[int, Symbol]] = []
        self.class_dim: dict[Key, int] = {}
        self.class_special: dict[Key, Special] = {}

    def key(self, d: AnyDim) -> Key:
        """The class key of a dim: the first special variable on its chain of solutions, else the
        projection id it resolves to."""
        x, last = d, None
        while isinstance(x, Var):
            if ("s", x.id) in self.special_of:
                key = ("s", x.id)
                break
            last, x = x, self._step(x)
        else:
            key = ("p", x.proj_id) if x.proj_id is not None else ("v", last.id) if last else ("a", next(_anon))
        self.dim_of.setdefault(key, self._resolve(d).d)
        return key

    def _step(self, v: Var) -> AnyDim:
        entry = self.env.dims.get(v)
        if not isinstance(entry, Solved):
            raise ShapeError(f"projections of {self.debug}: unsolved dimension {v!r}")
        assert not isinstance(entry.value, Row)  # a dimension variable is solved to a dimension
        return entry.value

    def _resolve(self, d: AnyDim) -> Dim:
        while isinstance(d, Var):
            d = self._step(d)
        return d

    def line_up(self, c: Constraint) -> None:
        match c:
            case DimEq(d1, d2) | DimIneq(d1, d2):
                pairs = [(d1, d2)]
            case RowEq(r1, r2) | RowIneq(r1, r2):
                a, b = expand_row(self.env, r1).dims, expand_row(self.env, r2).dims
                k = min(len(a), len(b))
                pairs = list(zip(a[len(a) - k:], b[len(b) - k:], strict=True))
        for x, y in pairs:
            kx, ky = self.key(x), self.key(y)
            if self._resolve(x).d == self._resolve(y).d:
                self.uf.union(kx, ky)

    def build(self, log: list[Constraint], lhs: Shape, args: tuple[Shape, ...],
              lhs_dims: tuple[int, ...], rhs_dims: tuple[tuple[int, ...], ...]) -> Projections:
        for c in log:
            self.line_up(c)
        lhs_keys = [self.key(d) for r in lhs.rows() for d in r.dims]
        rhs_keys = [[self.key(d) for r in a.rows() for d in r.dims] for a in args]
        for sp in self.special_of.values():
            if isinstance(sp, ConvSpec):
                for _, v in sp.terms:
                    self.key(v)
        self._classes()
        project_lhs = tuple(self.index(k) for k in lhs_keys)
        project_rhs = tuple(tuple(self.index(k) for k in keys) for keys in rhs_keys)
        return Projections(tuple(d for d, _ in self.product), tuple(s for _, s in self.product), lhs_dims,
                           rhs_dims, project_lhs, project_rhs, self.debug)

    def _classes(self) -> None:
        """Per class: its dimension and its special index, if any (at most one)."""
        for k, d in self.dim_of.items():
            root = self.uf.find(k)
            self.class_dim[root] = max(d, self.class_dim.get(root, 1))
            sp = self.special_of.get(k)
            if sp is None:
                continue
            other = self.class_special.setdefault(root, sp)
            if other != sp:
                raise ShapeError(f"projections of {self.debug}: one axis is indexed both by {other} and {sp}")

    def index(self, key: Key) -> AxisIndex:
        root = self.uf.find(key)
        if root in self.index_of:
            return self.index_of[root]
        idx: AxisIndex
        match self.class_special.get(root):
            case FixedIdx() | Iterator() as idx:
                pass
            case ConvSpec(terms, offset):
                idx = self._affine(terms, offset)
            case None if self.class_dim.get(root, 1) == 1:
                idx = FixedIdx(0)
            case None:
                sym = get_symbol()
                self.product.append((self.class_dim[root], sym))
                idx = Iterator(sym)
        self.index_of[root] = idx
        return idx

    def _affine(self, terms: tuple[tuple[int, Var], ...], offset: int) -> AxisIndex:
        flat: list[tuple[int, Symbol]] = []
        for coeff, v in terms:
            match self.index(self.key(v)):
                case Iterator(s):
                    flat.append((coeff, s))
                case FixedIdx(i):
                    offset += coeff * i
                case Affine(symbols, off):
                    flat += [(coeff * c, s) for c, s in symbols]
                    offset += coeff * off
        return make_affine(flat, offset)
