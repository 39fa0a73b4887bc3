"""String and LaTeX display of ATL programs.

The string form is the notebook's: ``Gen(i:3) +(j:3) A[i][j] * x[j]``, ``[i=j]*x[i]``,
``c3[j].0.1``, ``let m : R = ... in`` with the body on the next line. Tests compare
printed forms after each pass with the notebook's, so the precedence levels below
(0 let, 1 binders, 2 sums of terms, 3 products and indicators, 4 projections,
5 accesses) decide where parentheses appear and must stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .ir import (
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
    Ne,
    Not,
    Or,
    Pair,
    Pred,
    Proj,
    Rel,
    Sum,
    TBool,
    TError,
    TNum,
    TPair,
    TTensor,
    Var,
)

__all__ = ["index_str", "pred_str", "expr_str", "func_str", "latex", "type_latex"]


def index_str(ix: Index) -> str:
    match ix:
        case IVar(name):
            return str(name)
        case IConst(val):
            return str(val)
        case IAdd(lhs, IConst(val)) if val < 0:
            return f"{index_str(lhs)}-{-val}"
        case IAdd(lhs, IMul(-1, arg)):
            return f"{index_str(lhs)}-{_index_atom(arg)}"
        case IAdd(lhs, rhs):
            return f"{index_str(lhs)}+{index_str(rhs)}"
        case IMul(-1, arg):
            return f"-{_index_atom(arg)}"
        case IMul(coeff, arg):
            return f"{coeff}*{_index_atom(arg)}"
    raise TypeError(f"not an index expression: {ix!r}")


def _index_atom(ix: Index) -> str:
    s = index_str(ix)
    return f"({s})" if isinstance(ix, IAdd) else s


_CMP = {Eq: "=", Ne: "!=", Lt: "<", Le: "<="}


def pred_str(p: Pred, prec: int = 0) -> str:
    """Precedence: 0 ``or``, 1 ``and``, 2 ``not``/atoms."""
    match p:
        case Eq(l, r) | Ne(l, r) | Lt(l, r) | Le(l, r):
            return f"{index_str(l)}{_CMP[type(p)]}{index_str(r)}"
        case Rel(rel, args):
            return f"{rel}({','.join(index_str(a) for a in args)})"
        case Not(arg):
            return f"not {pred_str(arg, 2)}"
        case And(l, r):
            s = f"{pred_str(l, 1)} and {pred_str(r, 1)}"
            return f"({s})" if prec > 1 else s
        case Or(l, r):
            s = f"{pred_str(l, 0)} or {pred_str(r, 0)}"
            return f"({s})" if prec > 0 else s
    raise TypeError(f"not a predicate: {p!r}")


@dataclass(frozen=True)
class _Notation:
    """How one printer writes each construct; `_print` walks the expression once for both.
    Templates take the printed parts by name; precedence levels are the module's."""

    name: Callable[[object], str]
    const: Callable[[object], str]
    index: Callable[[Index], str]
    pred: Callable[[Pred], str]
    paren: str
    mul: str
    pair: str
    proj: str
    gen: str
    sum: str
    indicate: str
    let: str
    annotate_let: bool


def _print(e: Expr, prec: int, n: _Notation, indent: str = "") -> str:
    def sub(x: Expr, p: int) -> str:
        return _print(x, p, n, indent)

    def paren(s: str, level: int) -> str:
        return n.paren.format(s) if prec > level else s

    match e:
        case Var(name):
            return n.name(name)
        case Const(val):
            return n.const(val)
        case Add(lhs, rhs):
            return paren(f"{sub(lhs, 2)} + {sub(rhs, 2)}", 2)
        case Mul(lhs, rhs):
            return paren(n.mul.format(sub(lhs, 3), sub(rhs, 3)), 3)
        case Pair(lhs, rhs):
            return n.pair.format(sub(lhs, 0), sub(rhs, 0))
        case Proj(idx, arg):
            return paren(n.proj.format(idx=idx, arg=sub(arg, 4)), 4)
        case Gen(i, rng, body) | Sum(i, rng, body):
            template = n.gen if isinstance(e, Gen) else n.sum
            return paren(template.format(i=n.name(i), rng=rng, body=sub(body, 1)), 1)
        case Access(base, idx):
            return paren(f"{sub(base, 5)}[{n.index(idx)}]", 5)
        case Indicate(pred, body):
            return paren(n.indicate.format(pred=n.pred(pred), body=sub(body, 3)), 3)
        case Let(name, rhs, body):
            ann = f" : {rhs.typ}" if n.annotate_let and rhs.typ is not None else ""
            return paren(n.let.format(name=n.name(name), ann=ann, rhs=sub(rhs, 0), indent=indent, body=sub(body, 0)), 0)
    raise TypeError(f"not an ATL expression: {e!r}")


def expr_str(e: Expr, prec: int = 0, indent: str = "") -> str:
    return _print(e, prec, _TEXT, indent)


def func_str(args, body: Expr) -> str:
    """``Function(A:[3][3]R, x:[3]R) : [3]R`` then the body, indented by four spaces."""
    arglist = ", ".join(f"{name}:{typ}" for name, typ in args)
    return f"Function({arglist}) : {body.typ}\n    {expr_str(body, 0, '    ')}"


# ---------------------------------------------------------------------------- LaTeX

def _name_tex(name) -> str:
    s = str(name)
    base, _, sub = s.partition("_")
    base = base if len(base) == 1 else rf"\mathit{{{base}}}"
    return f"{base}_{{{sub}}}" if sub else base


def type_latex(t) -> str:
    match t:
        case TNum():
            return r"\mathbb{R}"
        case TBool():
            return r"\mathbb{2}"
        case TError():
            return r"\bot"
        case TTensor(rng, typ):
            return f"[{rng}]{type_latex(typ)}"
        case TPair(lhs, rhs):
            return rf"({type_latex(lhs)} \times {type_latex(rhs)})"
    raise TypeError(f"not an ATL type: {t!r}")


def _index_tex(ix: Index) -> str:
    match ix:
        case IVar(name):
            return _name_tex(name)
    return index_str(ix)


_CMP_TEX = {Eq: "=", Ne: r"\neq", Lt: "<", Le: r"\leq"}


def _pred_tex(p: Pred) -> str:
    match p:
        case Eq(l, r) | Ne(l, r) | Lt(l, r) | Le(l, r):
            return f"{_index_tex(l)} {_CMP_TEX[type(p)]} {_index_tex(r)}"
        case Rel(rel, args):
            return f"{_name_tex(rel)}({', '.join(_index_tex(a) for a in args)})"
        case Not(arg):
            return rf"\neg({_pred_tex(arg)})"
        case And(l, r):
            return rf"({_pred_tex(l)} \wedge {_pred_tex(r)})"
        case Or(l, r):
            return rf"({_pred_tex(l)} \vee {_pred_tex(r)})"
    raise TypeError(f"not a predicate: {p!r}")


def latex(e: Expr, prec: int = 0) -> str:
    """LaTeX for an expression, with the same precedence scheme as ``expr_str``."""
    return _print(e, prec, _LATEX)


_TEXT = _Notation(
    name=str, const=str, index=index_str, pred=pred_str, paren="({})", mul="{} * {}", pair="({},{})",
    proj="{arg}.{idx}", gen="Gen({i}:{rng}) {body}", sum="+({i}:{rng}) {body}", indicate="[{pred}]*{body}",
    let="let {name}{ann} = {rhs} in\n{indent}{body}", annotate_let=True)
_LATEX = _Notation(
    name=_name_tex, const=repr, index=_index_tex, pred=_pred_tex, paren=r"\left({}\right)", mul=r"{} \cdot {}",
    pair=r"\left({}, {}\right)", proj=r"\pi_{idx}\, {arg}", gen=r"\boxplus_{{{i} < {rng}}}\, {body}",
    sum=r"\sum_{{{i} < {rng}}}\, {body}", indicate=r"[{pred}] \cdot {body}",
    let=r"\textrm{{let }} {name} = {rhs} \textrm{{ in }} {body}", annotate_let=False)
