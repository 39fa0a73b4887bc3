"""Scalar expression trees over an assignment's buffers: the right-hand side of `AccumExpr`.

An optimizer's update (`m = b1 * m + c1 * g`, then `p -= lr * (m / bc1 / (sqrt(v / bc2) + eps))`)
written as one-operation assignments needs an intermediate tensor per operation: about fifteen
assignments per parameter that shape inference, lowering and the scheduler's inlining each
walk, only for the scheduler to put the expression back together. A tree whose leaves name the
assignment's buffers (by position) keeps the expression whole from the start; lowering turns
it into the same low-level expression the inlining would have built.
"""

from __future__ import annotations

from dataclasses import dataclass

from einjit.ir import low_level as ll
from einjit.ir import ops


@dataclass(frozen=True, slots=True)
class Arg:
    """The assignment's `index`-th buffer, read at its projection."""

    index: int


@dataclass(frozen=True, slots=True)
class Const:
    value: float


@dataclass(frozen=True, slots=True)
class Un:
    op: ops.Unop
    arg: "Expr"


@dataclass(frozen=True, slots=True)
class Bin:
    op: ops.Binop
    arg1: "Expr"
    arg2: "Expr"


@dataclass(frozen=True, slots=True)
class Tern:
    op: ops.Ternop
    arg1: "Expr"
    arg2: "Expr"
    arg3: "Expr"


Expr = Arg | Const | Un | Bin | Tern


def to_scalar(e: Expr, args: list[ll.LLScalar]) -> ll.LLScalar:
    """The low-level expression, with `args[k]` (the k-th buffer's read) for `Arg(k)`."""
    match e:
        case Arg(k):
            return args[k]
        case Const(v):
            return ll.Constant(v)
        case Un(op, a):
            return ll.Unop(op, to_scalar(a, args))
        case Bin(op, a, b):
            return ll.Binop(op, to_scalar(a, args), to_scalar(b, args))
        case Tern(op, a, b, c):
            return ll.Ternop(op, to_scalar(a, args), to_scalar(b, args), to_scalar(c, args))
    raise TypeError(f"not an expression: {e!r}")


def to_doc(e: Expr, names: list[str]) -> str:
    """A `%cd`-like rendering, fully parenthesized: `(b1 * m) + (c1 * g)`."""
    match e:
        case Arg(k):
            return names[k]
        case Const(v):
            return repr(v)
        case Un(op, a):
            return to_doc(a, names) if op is ops.Unop.IDENTITY else f"{op.symbol}({to_doc(a, names)})"
        case Bin(op, a, b):
            if op.infix.isalnum():
                return f"{op.symbol}({to_doc(a, names)}, {to_doc(b, names)})"
            return f"({to_doc(a, names)} {op.infix} {to_doc(b, names)})"
        case Tern(op, a, b, c):
            return f"{op.symbol}({to_doc(a, names)}, {to_doc(b, names)}, {to_doc(c, names)})"
    raise TypeError(f"not an expression: {e!r}")
