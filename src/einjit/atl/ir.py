"""The ATL tensor language: symbols, types, index expressions, predicates, expressions.

One family of frozen dataclasses serves both the front end and the typed IR. A program
built by hand names its variables with strings (``Var('x')``, ``Gen('i', 3, ...)``);
the typechecker (``typecheck.py``) rebuilds it with every name replaced by a fresh
``Sym`` and every node's ``typ`` filled in. The passes work on the typed form only, and
may rely on each binder owning its own ``Sym``. Keeping one family lets a typed program
be checked again (the names are then ``Sym`` keys), which is how derived programs
(derivatives, adjoints) re-enter the pipeline.

Operator overloading mirrors the notebook: ``A['i', 'j'] * x['j']``, ``Eq('i', 'j') * x['i']``,
``e0 + e1``. Index arithmetic (``Idx('i') + 1``, ``2 * Idx('i')``) and comparisons
(``Idx('i') < 3``) build the extension's affine indices and predicates; a predicate
times an expression is an indicator (Iverson bracket).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union, cast

from einjit.errors import EinjitError

if TYPE_CHECKING:
    from typing import Protocol

    class _Typed(Protocol):
        @property
        def typ(self) -> Type | None: ...

__all__ = [
    "Sym", "Name", "UntypedError", "as_sym", "typ_of", "tensor_typ",
    "TNum", "TBool", "TError", "TTensor", "TPair", "Type", "R", "B", "TERR",
    "IVar", "IConst", "IAdd", "IMul", "Index", "Idx", "as_index",
    "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "Rel", "And", "Or", "Not", "Pred",
    "Var", "Const", "Add", "Mul", "Pair", "Proj", "Gen", "Sum", "Access", "Indicate",
    "Let", "Expr", "as_expr", "tensor_shape",
]


class Sym:
    """A name with identity: two symbols with the same string are different variables.

    ``copy()`` makes a new variable that prints the same, which is what rewrites need
    when they duplicate a binder.
    """

    __slots__ = ("name", "id")
    _counter = itertools.count(1)

    def __init__(self, name: str) -> None:
        self.name = name
        self.id = next(Sym._counter)

    def copy(self) -> "Sym":
        return Sym(self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{self.name}${self.id}"


Name = Union[str, Sym]


class UntypedError(EinjitError, TypeError):
    """A pass that works on the typed form met a node the typechecker did not produce."""


def as_sym(name: Name) -> Sym:
    """A name of the typed form, where every name is a ``Sym``."""
    if not isinstance(name, Sym):
        raise UntypedError(f"einjit: ATL name {name!r} is not resolved: typecheck the program first")
    return name


# --------------------------------------------------------------------------- types

@dataclass(frozen=True, slots=True)
class TNum:
    """The reals, ``R``."""

    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True, slots=True)
class TBool:
    """Booleans, ``B``: only as the entries of relation arguments (sparsity patterns)."""

    def __str__(self) -> str:
        return "B"


@dataclass(frozen=True, slots=True)
class TError:
    """The type of an ill-typed term; lets the checker go on and report every error."""

    def __str__(self) -> str:
        return "ERROR"


@dataclass(frozen=True, slots=True)
class TTensor:
    """``[range]typ``: a tensor whose first index runs over ``0 <= i < range``."""

    range: int
    typ: "Type"

    def __str__(self) -> str:
        return f"[{self.range}]{self.typ}"


@dataclass(frozen=True, slots=True)
class TPair:
    """``(lhs,rhs)``."""

    lhs: "Type"
    rhs: "Type"

    def __str__(self) -> str:
        return f"({self.lhs},{self.rhs})"


Type = Union[TNum, TBool, TError, TTensor, TPair]


def typ_of(e: _Typed) -> Type:
    """The type of a node of the typed form, where every node has one."""
    if e.typ is None:
        raise UntypedError(f"einjit: ATL expression {e} has no type: typecheck the program first")
    return e.typ


def tensor_typ(e: _Typed) -> TTensor:
    """The type of a tensor-valued node of the typed form."""
    t = typ_of(e)
    if not isinstance(t, TTensor):
        raise UntypedError(f"einjit: ATL expression {e} is not a tensor but a {t}")
    return t


R = TNum()
B = TBool()
TERR = TError()


def tensor_shape(t: Type) -> tuple[tuple[int, ...], Type]:
    """Split ``[n0][n1]...T`` into ``((n0, n1, ...), T)``."""
    dims = []
    while isinstance(t, TTensor):
        dims.append(t.range)
        t = t.typ
    return tuple(dims), t


# --------------------------------------------------------------- index expressions

class _IndexOps:
    """Affine arithmetic and comparisons on index expressions."""

    __slots__ = ()

    def __add__(self, other):
        return IAdd(self, as_index(other))

    def __radd__(self, other):
        return IAdd(as_index(other), self)

    def __sub__(self, other):
        return IAdd(self, _negate(as_index(other)))

    def __rsub__(self, other):
        return IAdd(as_index(other), _negate(self))

    def __neg__(self):
        return _negate(self)

    def __mul__(self, other):
        if isinstance(other, int) and not isinstance(other, bool):
            return IMul(other, self)
        return NotImplemented

    __rmul__ = __mul__

    def __lt__(self, other):
        return Lt(self, other)

    def __le__(self, other):
        return Le(self, other)

    def __gt__(self, other):
        return Lt(other, self)

    def __ge__(self, other):
        return Le(other, self)

    def __str__(self) -> str:
        from .display import index_str
        return index_str(cast("Index", self))  # every subclass is an Index


@dataclass(frozen=True, slots=True)
class IVar(_IndexOps):
    """An index variable bound by an enclosing ``Gen`` or ``Sum``."""

    name: Name


@dataclass(frozen=True, slots=True)
class IConst(_IndexOps):
    """An integer literal index."""

    val: int


@dataclass(frozen=True, slots=True)
class IAdd(_IndexOps):
    lhs: "Index"
    rhs: "Index"


@dataclass(frozen=True, slots=True)
class IMul(_IndexOps):
    """``coeff * arg`` with an integer coefficient: indices stay affine."""

    coeff: int
    arg: "Index"


Index = Union[IVar, IConst, IAdd, IMul]


def _negate(ix: Index) -> Index:
    if isinstance(ix, IConst):
        return IConst(-ix.val)
    return IMul(-1, ix)


def Idx(name: Name) -> IVar:
    """An index variable for writing affine indices: ``x[Idx('i') + 1]``."""
    return IVar(name)


def as_index(v) -> Index:
    """Coerce the notebook's index spellings: a string or ``Sym`` names a variable,
    an ``int`` is a literal."""
    if isinstance(v, (IVar, IConst, IAdd, IMul)):
        return v
    if isinstance(v, (str, Sym)):
        return IVar(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return IConst(v)
    raise TypeError(f"expected an index (a name, an int or an index expression), got {v!r}")


# ------------------------------------------------------------------------ predicates

class _PredOps:
    """``p * e`` is the indicator ``[p]*e``; ``&``, ``|``, ``~`` combine predicates."""

    __slots__ = ()

    def __mul__(self, other):
        return Indicate(self, as_expr(other))

    __rmul__ = __mul__

    def __and__(self, other):
        return And(self, other)

    def __or__(self, other):
        return Or(self, other)

    def __invert__(self):
        return Not(self)

    def __str__(self) -> str:
        from .display import pred_str
        return pred_str(cast("Pred", self))  # every subclass is a Pred


def _coerce_sides(obj) -> None:
    object.__setattr__(obj, "lhs", as_index(obj.lhs))
    object.__setattr__(obj, "rhs", as_index(obj.rhs))


@dataclass(frozen=True, slots=True)
class _Compare(_PredOps):
    """An index comparison; both sides are coerced to indices."""

    lhs: Index
    rhs: Index

    def __post_init__(self) -> None:
        _coerce_sides(self)


@dataclass(frozen=True, slots=True)
class Eq(_Compare):
    pass


@dataclass(frozen=True, slots=True)
class Ne(_Compare):
    pass


@dataclass(frozen=True, slots=True)
class Lt(_Compare):
    pass


@dataclass(frozen=True, slots=True)
class Le(_Compare):
    pass


def Gt(lhs, rhs) -> Lt:
    """``lhs > rhs``, stored as ``rhs < lhs``."""
    return Lt(rhs, lhs)


def Ge(lhs, rhs) -> Le:
    """``lhs >= rhs``, stored as ``rhs <= lhs``."""
    return Le(rhs, lhs)


@dataclass(frozen=True, slots=True, init=False)
class Rel(_PredOps):
    """Membership of an index tuple in a relation: a boolean tensor argument.

    A tuple outside the relation's extents is simply not a member, so a relation can
    guard shifted indices near a boundary without an extra range test.
    """

    rel: Name
    args: tuple[Index, ...]

    def __init__(self, rel: Name, *args) -> None:
        if len(args) == 1 and isinstance(args[0], (tuple, list)):
            args = tuple(args[0])
        object.__setattr__(self, "rel", rel)
        object.__setattr__(self, "args", tuple(as_index(a) for a in args))


@dataclass(frozen=True, slots=True)
class And(_PredOps):
    lhs: "Pred"
    rhs: "Pred"


@dataclass(frozen=True, slots=True)
class Or(_PredOps):
    lhs: "Pred"
    rhs: "Pred"


@dataclass(frozen=True, slots=True)
class Not(_PredOps):
    arg: "Pred"


Pred = Union[Eq, Ne, Lt, Le, Rel, And, Or, Not]
_PRED_TYPES = (Eq, Ne, Lt, Le, Rel, And, Or, Not)


# ----------------------------------------------------------------------- expressions

class _ExprOps:
    """Operator sugar shared by every expression node."""

    __slots__ = ()

    def __add__(self, other):
        return Add(self, as_expr(other))

    def __radd__(self, other):
        return Add(as_expr(other), self)

    def __mul__(self, other):
        if isinstance(other, _PRED_TYPES):
            return Indicate(other, self)
        return Mul(self, as_expr(other))

    def __rmul__(self, other):
        return Mul(as_expr(other), self)

    def __sub__(self, other):
        """Sugar: ``e0 - e1`` is ``e0 + (-1.0) * e1`` (the language has no subtraction)."""
        return Add(self, Mul(Const(-1.0), as_expr(other)))

    def __rsub__(self, other):
        return Add(as_expr(other), Mul(Const(-1.0), self))

    def __neg__(self):
        return Mul(Const(-1.0), self)

    def __getitem__(self, key):
        keys = key if isinstance(key, tuple) else (key,)
        e = self
        for k in keys:
            e = Access(e, as_index(k))
        return e

    def __str__(self) -> str:
        from .display import expr_str
        return expr_str(cast("Expr", self))  # every subclass is an Expr

    def _repr_latex_(self) -> str:
        from .display import latex
        return f"${latex(cast('Expr', self))}$"


@dataclass(frozen=True, slots=True)
class Var(_ExprOps):
    name: Name
    typ: Type | None = None


@dataclass(frozen=True, slots=True)
class Const(_ExprOps):
    val: float
    typ: Type | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "val", float(self.val))


@dataclass(frozen=True, slots=True)
class Add(_ExprOps):
    lhs: "Expr"
    rhs: "Expr"
    typ: Type | None = None


@dataclass(frozen=True, slots=True)
class Mul(_ExprOps):
    lhs: "Expr"
    rhs: "Expr"
    typ: Type | None = None


@dataclass(frozen=True, slots=True)
class Pair(_ExprOps):
    lhs: "Expr"
    rhs: "Expr"
    typ: Type | None = None


@dataclass(frozen=True, slots=True)
class Proj(_ExprOps):
    idx: int
    arg: "Expr"
    typ: Type | None = None

    def __post_init__(self) -> None:
        if self.idx not in (0, 1):
            raise ValueError(f"a projection index is 0 or 1, got {self.idx!r}")


@dataclass(frozen=True, slots=True)
class _Binder(_ExprOps):
    """An expression binding the index `idx` over `range` in `body`."""

    idx: Name
    range: int
    body: "Expr"
    typ: Type | None = None

    def __post_init__(self) -> None:
        if isinstance(self.idx, IVar):
            object.__setattr__(self, "idx", self.idx.name)


@dataclass(frozen=True, slots=True)
class Gen(_Binder):
    """``Gen(i:range) body``: the tensor ⊞_i body."""


@dataclass(frozen=True, slots=True)
class Sum(_Binder):
    """``+(i:range) body``: the big sum Σ_i body."""


@dataclass(frozen=True, slots=True)
class Access(_ExprOps):
    base: "Expr"
    idx: Index
    typ: Type | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "idx", as_index(self.idx))


@dataclass(frozen=True, slots=True)
class Indicate(_ExprOps):
    """``[pred]*body``: body where the predicate holds, zero elsewhere (body unread)."""

    pred: Pred
    body: "Expr"
    typ: Type | None = None


@dataclass(frozen=True, slots=True)
class Let(_ExprOps):
    name: Name
    rhs: "Expr"
    body: "Expr"
    typ: Type | None = None


Expr = Union[Var, Const, Add, Mul, Pair, Proj, Gen, Sum, Access, Indicate, Let]
_EXPR_TYPES = (Var, Const, Add, Mul, Pair, Proj, Gen, Sum, Access, Indicate, Let)


def as_expr(v) -> Expr:
    """Coerce Python numbers to constants; leave expressions alone."""
    if isinstance(v, _EXPR_TYPES):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return Const(float(v))
    raise TypeError(f"expected an ATL expression or a number, got {v!r}")

