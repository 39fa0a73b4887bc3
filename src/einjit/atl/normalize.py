"""The block normal form, and the driver that reaches it.

After pair elimination, let flattening and gen normalization a program is::

    a ::= a[ix] | x                              accesses of variables
    e ::= a | c | e0 + e1 | e0 * e1 | Σ_i e | [p]*e
    g ::= ⊞_i g | e
    s ::= let x = g in s | g

``NormalForm`` holds it as data: each ``let`` (and the final result) is a ``Stmt``
naming a tensor by its generator indices and a scalar body, which is exactly one pure
definition ``x(i0, ..., ik) = body`` in Halide or one assignment loop nest in einjit.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gens import gen_normalize
from .index import index_vars, pred_index_vars
from .ir import (
    Access,
    Add,
    Const,
    Expr,
    Gen,
    Indicate,
    Let,
    Mul,
    R,
    Sum,
    Sym,
    TTensor,
    Type,
    Var,
    as_sym,
    typ_of,
)
from .lets import lift_lets, to_block
from .pairs import eliminate_pairs
from .typecheck import TypedFunc

__all__ = ["Stmt", "NormalForm", "normalize", "normal_form_of", "check_body"]


@dataclass(frozen=True, slots=True)
class Stmt:
    """``name(i0, ..., ik) = body`` for ``0 <= i_d < n_d``.

    ``gens`` lists ``(i_d, n_d)`` outermost first, i.e. in the order of the tensor's
    dimensions; with no gens the statement is a scalar. ``body`` has type ``R`` and is
    built only from:

    - ``Var(x)`` of type ``R``: a scalar argument or an earlier scalar statement;
    - ``Access`` chains rooted at a ``Var`` (an argument or an earlier statement) and
      indexing every dimension, ``A[ix0][ix1]`` = ``Access(Access(Var(A), ix0), ix1)``;
    - ``Const``, ``Add``, ``Mul``;
    - ``Sum(j, n, body)``, a reduction over ``0 <= j < n``;
    - ``Indicate(pred, body)``: ``body`` where ``pred`` holds, else ``0.0``.

    Indices are affine in the ``gens`` and enclosing ``Sum`` variables: ``IVar``,
    ``IConst``, ``IAdd``, ``IMul`` (``index.to_affine`` gives the coefficients).
    Predicates are ``Eq``/``Ne``/``Lt``/``Le`` between indices, ``And``/``Or``/``Not``,
    and ``Rel(R, ix...)``, membership in a relation argument (false outside its extents).
    An index may fall outside its tensor only where an enclosing predicate is false;
    a backend must then not touch memory for it (clamp the index or branch).
    """

    name: Sym
    gens: tuple[tuple[Sym, int], ...]
    body: Expr

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.gens)

    @property
    def typ(self) -> Type:
        t: Type = R
        for _, n in reversed(self.gens):
            t = TTensor(n, t)
        return t

    def to_expr(self) -> Expr:
        e = self.body
        for i, n in reversed(self.gens):
            e = Gen(i, n, e, TTensor(n, typ_of(e)))
        return e


@dataclass(frozen=True, slots=True)
class NormalForm:
    """A whole function in block normal form.

    ``args`` are the function's parameters in call order, each ``(Sym, Type)`` with a
    type that is ``R``, a tensor of ``R`` (``[n0]...[nk]R``) or a relation
    (``[n0]...[nk]B``, only read by ``Rel`` predicates). ``stmts`` run in order; each
    may read the arguments and the statements before it. ``ret`` is the result, named
    ``return``.
    """

    args: tuple[tuple[Sym, Type], ...]
    stmts: tuple[Stmt, ...]
    ret: Stmt

    @property
    def ret_type(self) -> Type:
        return self.ret.typ

    def to_typed_func(self) -> TypedFunc:
        e = self.ret.to_expr()
        for s in reversed(self.stmts):
            e = Let(s.name, s.to_expr(), e, e.typ)
        return TypedFunc(self.args, e)

    def __str__(self) -> str:
        return str(self.to_typed_func())


def normalize(tf: TypedFunc) -> TypedFunc:
    """All passes in order: pairs, lets, generators."""
    return gen_normalize(lift_lets(eliminate_pairs(tf)))


def _split_gens(e: Expr) -> tuple[tuple[tuple[Sym, int], ...], Expr]:
    gens: list[tuple[Sym, int]] = []
    while isinstance(e, Gen):
        gens.append((as_sym(e.idx), e.range))
        e = e.body
    return tuple(gens), e


def normal_form_of(tf: TypedFunc) -> NormalForm:
    """Run every pass and read off the statements (checking the result's shape)."""
    binds, ret = to_block(normalize(tf).body)
    stmts = []
    for name, rhs in binds:
        gens, body = _split_gens(rhs)
        stmts.append(Stmt(name, gens, body))
    gens, body = _split_gens(ret)
    nf = NormalForm(tf.args, tuple(stmts), Stmt(Sym("return"), gens, body))
    _check(nf)
    return nf


def check_body(e: Expr, indices: set, names: set) -> None:
    """Assert that ``e`` is a statement body whose free indices are in ``indices`` and
    whose variables are in ``names``."""
    match e:
        case Var(name):
            assert e.typ == R and name in names, f"bad scalar variable {e}"
        case Const():
            pass
        case Add(lhs, rhs) | Mul(lhs, rhs):
            check_body(lhs, indices, names)
            check_body(rhs, indices, names)
        case Sum(i, _, body):
            check_body(body, indices | {i}, names)
        case Indicate(pred, body):
            assert pred_index_vars(pred) <= indices, f"free index in [{pred}]"
            check_body(body, indices, names)
        case Access():
            a: Expr = e
            while isinstance(a, Access):
                assert index_vars(a.idx) <= indices, f"free index in {e}"
                a = a.base
            assert isinstance(a, Var) and a.name in names, f"bad access {e}"
        case _:
            raise AssertionError(f"not in normal form: {e}")
    assert e.typ == R, f"non-scalar term {e}"


def _check(nf: NormalForm) -> None:
    names = {sym for sym, _ in nf.args}
    for s in nf.stmts + (nf.ret,):
        check_body(s.body, {i for i, _ in s.gens}, names)
        names.add(s.name)
