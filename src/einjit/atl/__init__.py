"""ATL, a typed tensor language compiled through a block normal form.

Programs are built from ``Var``, ``Const``, ``Gen`` (⊞), ``Sum`` (Σ), accesses
(``x['i']``), indicators (``Eq('i', 'j') * e``), ``Let``, ``Pair`` and ``Proj``, wrapped
in a ``Func`` with a typed signature, and run by the reference interpreter
(``Func.interpret``) or compiled (``Func.jit_exec``) to Halide or einjit's own backends.
"""

from .autodiff import adjoint, deriv, grad
from .func import Func, OutputError
from .ir import (
    And,
    B,
    Const,
    Eq,
    Ge,
    Gen,
    Gt,
    Idx,
    Le,
    Let,
    Lt,
    Ne,
    Not,
    Or,
    Pair,
    Proj,
    R,
    Rel,
    Sum,
    Sym,
    TBool,
    TNum,
    TPair,
    TTensor,
    Var,
)
from .normalize import NormalForm, Stmt
from .pairs import PairError
from .typecheck import TCError, TypedFunc, typecheck

__all__ = [
    "Var", "Const", "Gen", "Sum", "Let", "Pair", "Proj", "Eq", "Ne", "Lt", "Le", "Gt",
    "Ge", "Rel", "And", "Or", "Not", "Idx", "Sym", "Func", "R", "B", "TNum", "TBool",
    "TTensor", "TPair", "TypedFunc", "typecheck", "TCError", "PairError", "OutputError", "NormalForm",
    "Stmt", "deriv", "adjoint", "grad",
]
