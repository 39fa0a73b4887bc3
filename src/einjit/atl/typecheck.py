"""Typechecking: from a program with string names to the typed IR.

Every binder gets a fresh ``Sym`` and every node its type. The checker does not stop at
the first mistake: ill-typed terms get the type ``ERROR`` (which silences errors that
would only repeat the first), and all messages are raised together in one ``TCError``,
so a user fixes a program in one round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from einjit.errors import EinjitError

from . import bounds
from .display import func_str
from .index import NameMap
from .ir import (
    TERR,
    Access,
    Add,
    And,
    Const,
    Eq,
    Expr,
    Gen,
    IAdd,
    IConst,
    IMul,
    Index,
    Indicate,
    IVar,
    Le,
    Let,
    Lt,
    Mul,
    Name,
    Ne,
    Not,
    Or,
    Pair,
    Pred,
    Proj,
    R,
    Rel,
    Sum,
    Sym,
    TBool,
    TError,
    TNum,
    TPair,
    TTensor,
    Type,
    Var,
    tensor_shape,
    typ_of,
)

__all__ = ["TCError", "TypedFunc", "typecheck", "type_has_bools", "is_relation_type"]


class TCError(EinjitError, TypeError):
    """All typechecking errors of one program, one per line in the message."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = list(errors)
        super().__init__("Found errors during typechecking:\n  " + "\n  ".join(self.errors))


@dataclass(frozen=True)
class TypedFunc:
    """A typechecked function: argument symbols with their types, and a typed body.

    Passes take one and return a new one; the body's ``typ`` is the result type.
    """

    args: tuple[tuple[Sym, Type], ...]
    body: Expr

    @property
    def ret_type(self) -> Type:
        return typ_of(self.body)

    def __str__(self) -> str:
        return func_str(self.args, self.body)


@dataclass(frozen=True, slots=True)
class _ValueBinding:
    sym: Sym
    typ: Type


@dataclass(frozen=True, slots=True)
class _IndexBinding:
    sym: Sym
    range: int | None


def type_has_bools(t: Type) -> bool:
    match t:
        case TBool():
            return True
        case TTensor(_, sub):
            return type_has_bools(sub)
        case TPair(lhs, rhs):
            return type_has_bools(lhs) or type_has_bools(rhs)
    return False


def is_relation_type(t: Type) -> bool:
    dims, elem = tensor_shape(t)
    return bool(dims) and isinstance(elem, TBool)


def _arg_type_problem(t: Type) -> str | None:
    """Why ``t`` cannot type an argument, or ``None``."""
    if is_relation_type(t):
        return None
    match t:
        case TNum():
            return None
        case TTensor(rng, sub):
            if not isinstance(rng, int) or isinstance(rng, bool) or rng <= 0:
                return f"tensor extent must be a positive integer, got {rng!r}"
            return _arg_type_problem(sub)
        case TPair(lhs, rhs):
            return _arg_type_problem(lhs) or _arg_type_problem(rhs)
        case TBool():
            return "booleans only appear as the entries of a relation tensor"
    return f"not an ATL type: {t!r}"


def _fresh(name: Name) -> Sym:
    return name.copy() if isinstance(name, Sym) else Sym(name)


def _index_span(ix: Index, ranges: NameMap[int]) -> tuple[int, int] | None:
    """The least and greatest values an affine index takes over its binders' ranges."""
    match ix:
        case IVar(sym):
            rng = ranges.get(sym)
            return None if rng is None else (0, rng - 1)
        case IConst(val):
            return val, val
        case IAdd(lhs, rhs):
            a, b = _index_span(lhs, ranges), _index_span(rhs, ranges)
            return None if a is None or b is None else (a[0] + b[0], a[1] + b[1])
        case IMul(coeff, arg):
            a = _index_span(arg, ranges)
            return None if a is None else (min(coeff * a[0], coeff * a[1]), max(coeff * a[0], coeff * a[1]))
    return None


def _index_vars(ix: Index) -> set:
    match ix:
        case IVar(sym):
            return {sym}
        case IAdd(lhs, rhs):
            return _index_vars(lhs) | _index_vars(rhs)
        case IMul(_, arg):
            return _index_vars(arg)
    return set()


class _Checker:
    def __init__(self) -> None:
        self.errors: list[str] = []
        #: The range of every index variable bound so far (symbols are unique).
        self.ranges: dict[Sym, int] = {}
        #: What the predicates of the enclosing indicators imply about the index variables.
        self.guarded: list[bounds.Alternatives] = []
        #: The dims of every relation tested so far.
        self.relations: dict[Sym, tuple[int, ...]] = {}

    def err(self, msg: str) -> None:
        self.errors.append(msg)

    # ------------------------------------------------------------------ lookups
    def value(self, env: Mapping, name: Name) -> tuple[Sym, Type]:
        b = env.get(name)
        if b is None:
            self.err(f"variable '{name}' was undefined")
        elif not isinstance(b, _ValueBinding):
            self.err(f"variable '{name}' was not bound as a variable")
        else:
            return b.sym, b.typ
        return _fresh(name), TERR

    def index(self, env: Mapping, ix: Index) -> tuple[Index, int | None, bool]:
        """The typed index, the range of a plain variable (else ``None``), and whether
        it checked."""
        match ix:
            case IVar(name):
                b = env.get(name)
                if b is None:
                    self.err(f"index variable '{name}' was undefined")
                elif not isinstance(b, _IndexBinding):
                    self.err(f"variable '{name}' was not bound as an index variable")
                else:
                    return IVar(b.sym), b.range, True
                return IVar(_fresh(name)), None, False
            case IConst(val):
                if not isinstance(val, int) or isinstance(val, bool):
                    self.err(f"integer index expected, got {val!r}")
                    return ix, None, False
                return ix, None, True
            case IAdd(lhs, rhs):
                left, _, lok = self.index(env, lhs)
                right, _, rok = self.index(env, rhs)
                return IAdd(left, right), None, lok and rok
            case IMul(coeff, arg):
                a, _, ok = self.index(env, arg)
                return IMul(coeff, a), None, ok
        self.err(f"not an index expression: {ix!r}")
        return ix, None, False

    def index_into(self, env: Mapping, ix: Index, extent: int, where) -> tuple[Index, bool]:
        """An index used at a dimension of ``extent``: a plain variable must have been
        bound to that range, a literal must lie inside it; affine expressions are
        checked at run time (they are meant to sit under guards)."""
        tix, rng, ok = self.index(env, ix)
        if not ok:
            return tix, False
        if rng is not None and rng != extent:
            self.err(f"index variable '{ix}' was bound to the range {rng}, but this "
                     f"tensor expects an index of range {extent}")
            return tix, False
        if isinstance(tix, IConst) and not 0 <= tix.val < extent:
            self.err(f"integer index {tix.val} is out of range for a tensor of extent "
                     f"{extent}: {where}")
            return tix, False
        return tix, True

    def stays_inside(self, tix: Index, extent: int, where) -> bool:
        """An affine index that can leave its tensor must sit under guards that keep it
        inside (`bounds` proves it from their inequalities): bounds are static in ATL, so
        any other is refused here rather than read past the end (the interpreter, Halide and
        einjit would disagree on it)."""
        if isinstance(tix, (IVar, IConst)):
            return True
        span = _index_span(tix, self.ranges)
        if span is None or (span[0] >= 0 and span[1] < extent):
            return True
        if bounds.stays_inside(tix, extent, self.guarded, self.ranges):
            return True
        hint = f"guard it, e.g. ({tix} < {extent}) * ..." if span[1] >= extent else f"guard it, e.g. (0 <= {tix}) * ..."
        if not _index_vars(tix) & set().union(*(bounds.variables(g) for g in self.guarded)):
            self.err(f"index {tix} ranges over [{span[0]}, {span[1]}], outside the extent {extent} of the "
                     f"tensor it reads, with no guard: {where}; {hint}")
        else:
            self.err(f"index {tix} ranges over [{span[0]}, {span[1]}], outside the extent {extent} of the "
                     f"tensor it reads, and the enclosing guards do not keep it inside [0, {extent - 1}]: "
                     f"{where}; {hint}")
        return False

    # --------------------------------------------------------------- predicates
    def pred(self, env: Mapping, p: Pred) -> Pred:
        match p:
            case Eq(lhs, rhs) | Ne(lhs, rhs) | Lt(lhs, rhs) | Le(lhs, rhs):
                left, lrng, _ = self.index(env, lhs)
                right, rrng, _ = self.index(env, rhs)
                if (isinstance(p, Eq) and lrng is not None and rrng is not None
                        and lrng != rrng):
                    self.err(f"index variables '{lhs}' and '{rhs}' in equality are "
                             f"drawn from different ranges: {lrng} and {rrng}")
                return type(p)(left, right)
            case Rel(rel, args):
                return self.relation(env, p, rel, args)
            case And(lhs, rhs) | Or(lhs, rhs):
                return type(p)(self.pred(env, lhs), self.pred(env, rhs))
            case Not(arg):
                return Not(self.pred(env, arg))
        self.err(f"not a predicate: {p!r}")
        return p

    def relation(self, env: Mapping, p: Rel, rel: Name, args) -> Rel:
        b = env.get(rel)
        dims: tuple[int, ...] = ()
        if b is None:
            self.err(f"relation '{rel}' was undefined")
            sym = _fresh(rel)
        elif not isinstance(b, _ValueBinding) or not is_relation_type(b.typ):
            self.err(f"'{rel}' is not a relation (a tensor of booleans): {p}")
            sym = b.sym
        else:
            sym = b.sym
            dims = tensor_shape(b.typ)[0]
            if len(dims) != len(args):
                self.err(f"relation '{rel}' has rank {len(dims)} but was given "
                         f"{len(args)} indices: {p}")
                dims = ()
            else:
                self.relations[sym] = dims
        if dims:
            typed = [self.index_into(env, a, d, p)[0] for a, d in zip(args, dims, strict=True)]
        else:
            typed = [self.index(env, a)[0] for a in args]
        return Rel(sym, *typed)

    # -------------------------------------------------------------- expressions
    def check(self, env: Mapping, node: Expr) -> Expr:
        match node:
            case Var(name):
                sym, typ = self.value(env, name)
                if type_has_bools(typ):
                    self.err(f"relation '{name}' can only be used inside a predicate, "
                             f"e.g. Rel('{name}', i, j) * e")
                    typ = TERR
                return Var(sym, typ)
            case Const(val):
                return Const(val, R)
            case Add(lhs, rhs) | Mul(lhs, rhs):
                what = "addition" if isinstance(node, Add) else "multiplication"
                left, right = self.check(env, lhs), self.check(env, rhs)
                for side, sub in (("left", left), ("right", right)):
                    if sub.typ not in (R, TERR):
                        self.err(f"expected number on {side}-hand-side of {what}: {node}")
                typ = R if left.typ == R and right.typ == R else TERR
                return type(node)(left, right, typ)
            case Pair(lhs, rhs):
                left, right = self.check(env, lhs), self.check(env, rhs)
                ok = TERR not in (left.typ, right.typ)
                return Pair(left, right, TPair(typ_of(left), typ_of(right)) if ok else TERR)
            case Proj(idx, arg):
                a = self.check(env, arg)
                typ = TERR
                if a.typ == TERR:
                    pass
                elif not isinstance(a.typ, TPair):
                    self.err(f"Was expecting a pair as argument: {node}")
                else:
                    typ = a.typ.lhs if idx == 0 else a.typ.rhs
                return Proj(idx, a, typ)
            case Gen(i, rng, body) | Sum(i, rng, body):
                return self.binder(env, node, i, rng, body)
            case Access(base, idx):
                b = self.check(env, base)
                typ = TERR
                if b.typ == TERR:
                    tix = self.index(env, idx)[0]
                elif not isinstance(b.typ, TTensor):
                    self.err(f"Was expecting a tensor to index: {node}")
                    tix = self.index(env, idx)[0]
                else:
                    tix, ok = self.index_into(env, idx, b.typ.range, node)
                    ok = ok and self.stays_inside(tix, b.typ.range, node)
                    if ok:
                        typ = b.typ.typ
                return Access(b, tix, typ)
            case Indicate(pred, body):
                p = self.pred(env, pred)
                self.guarded.append(bounds.implied(p, self.relations))
                b = self.check(env, body)
                self.guarded.pop()
                return Indicate(p, b, b.typ)
            case Let(name, rhs, body):
                r = self.check(env, rhs)
                sym = _fresh(name)
                b = self.check({**env, name: _ValueBinding(sym, typ_of(r))}, body)
                return Let(sym, r, b, b.typ)
        self.err(f"unexpected expression {node!r}")
        return Const(0.0, TERR)

    def binder(self, env: Mapping, node: Expr, i: Name, rng, body: Expr) -> Expr:
        sym = _fresh(i)
        good_range = isinstance(rng, int) and not isinstance(rng, bool) and rng > 0
        if not good_range:
            self.err(f"range of '{i}' must be a positive integer, got {rng!r}")
        else:
            self.ranges[sym] = rng
        # A bad range is reported once: its variable then checks against any extent.
        b = self.check({**env, i: _IndexBinding(sym, rng if good_range else None)}, body)
        if isinstance(node, Sum):
            typ = b.typ
            if typ not in (R, TERR):
                self.err(f"Was expecting a number as body: {node}")
                typ = TERR
            return Sum(sym, rng, b, typ if good_range else TERR)
        typ = TTensor(rng, typ_of(b)) if b.typ != TERR and good_range else TERR
        return Gen(sym, rng, b, typ)


def typecheck(args: Sequence[tuple[Name, Type]], expr: Expr) -> TypedFunc:
    """Check ``expr`` under the arguments ``[(name, type), ...]``.

    Names may be strings or symbols (a typed program checks again). Raises ``TCError``
    listing every problem found.
    """
    checker = _Checker()
    env: dict = {}
    typed_args = []
    for entry in args:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise TypeError(f"arguments are (name, type) pairs, got {entry!r}")
        name, typ = entry
        if not isinstance(name, (str, Sym)):
            checker.err(f"argument name must be a string, got {name!r}")
            continue
        if name in env:
            checker.err(f"argument '{name}' is declared twice")
        problem = _arg_type_problem(typ)
        if problem:
            checker.err(f"argument '{name}' has a bad type: {problem}")
        sym = _fresh(name)
        env[name] = _ValueBinding(sym, typ)
        typed_args.append((sym, typ))
    body = checker.check(env, expr)
    if not checker.errors and isinstance(body.typ, TError):
        checker.err(f"the body has no type: {expr}")
    if checker.errors:
        raise TCError(checker.errors)
    return TypedFunc(tuple(typed_args), body)
