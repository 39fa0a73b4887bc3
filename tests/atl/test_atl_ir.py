"""IR construction by operator overloading, symbols, and the string / LaTeX displays."""

import pytest

from einjit.atl import (
    B,
    Const,
    Eq,
    Gen,
    Idx,
    Le,
    Let,
    Lt,
    Ne,
    Pair,
    Proj,
    R,
    Rel,
    Sum,
    Sym,
    TPair,
    TTensor,
    Var,
)
from einjit.atl.display import latex, type_latex
from einjit.atl.ir import Access, Add, IAdd, IConst, IMul, Indicate, IVar, Mul


def test_symbols_have_identity_and_copies_keep_the_name():
    s = Sym("i")
    t = s.copy()
    assert s != t and s == s
    assert str(t) == "i" and repr(t) != repr(s) and repr(t).startswith("i$")
    assert len({s, t, Sym("i")}) == 3


def test_operator_overloading_builds_the_notebook_nodes():
    A, x = Var("A"), Var("x")
    e = A["i", "j"] * x["j"]
    assert e == Mul(Access(Access(A, IVar("i")), IVar("j")), Access(x, IVar("j")))
    assert x["i"] + 1 == Add(Access(x, IVar("i")), Const(1.0))
    assert 2 * x["i"] == Mul(Const(2.0), Access(x, IVar("i")))
    assert Eq("i", "j") * x["i"] == Indicate(Eq(IVar("i"), IVar("j")), Access(x, IVar("i")))
    assert x["i"] * Eq("i", "j") == Eq("i", "j") * x["i"]


def test_index_arithmetic_and_comparisons():
    i = Idx("i")
    assert i + 1 == IAdd(IVar("i"), IConst(1))
    assert 2 * i == IMul(2, IVar("i"))
    assert (i < 3) == Lt(IVar("i"), IConst(3))
    assert (i >= 1) == Le(IConst(1), IVar("i"))
    assert (i > 1) == Lt(IConst(1), IVar("i"))
    assert Var("x")[0] == Access(Var("x"), IConst(0))
    with pytest.raises(TypeError):
        i * i


def test_bad_node_arguments_are_refused():
    with pytest.raises(ValueError):
        Proj(2, Var("p"))
    with pytest.raises(TypeError):
        Var("x")[1.5]
    with pytest.raises(TypeError):
        Var("x") + "y"


def test_types_print_as_in_the_notebook():
    n = 3
    assert str(R) == "R"
    assert str(TTensor(n, TTensor(n, R))) == "[3][3]R"
    assert str(TTensor(n, TPair(R, R))) == "[3](R,R)"
    assert str(TPair(TTensor(3, R), TTensor(3, R))) == "([3]R,[3]R)"
    assert str(TTensor(2, B)) == "[2]B"


def test_expression_display_precedence():
    A, x, c = Var("A"), Var("x"), Var("c")
    e = Gen("i", 3, c["i"] + Sum("j", 3, A["i", "j"] * x["j"]))
    assert str(e) == "Gen(i:3) c[i] + (+(j:3) A[i][j] * x[j])"
    assert str(Gen("i", 3, Sum("j", 3, A["i", "j"]))["k"]) == "(Gen(i:3) +(j:3) A[i][j])[k]"
    assert str(Proj(0, Proj(1, Var("p")["j"]))) == "p[j].1.0"
    assert str(Pair(x["i"], Const(2.0))) == "(x[i],2.0)"
    assert str(Var("a") * (Var("b") + Var("c"))) == "a * (b + c)"
    assert str(Eq("i", "j") * x["i"]) == "[i=j]*x[i]"
    assert str(Let("m", Const(1.0), Var("m"))) == "let m = 1.0 in\nm"


def test_extension_display():
    i = Idx("i")
    x = Var("x")
    assert str(x[i + 1]) == "x[i+1]"
    assert str(x[i - 1]) == "x[i-1]"
    assert str(x[2 * i]) == "x[2*i]"
    assert str(x[2 * (i + 1)]) == "x[2*(i+1)]"
    assert str((i + 1 < 3) * x[i + 1]) == "[i+1<3]*x[i+1]"
    assert str(Ne("i", "j") * x[i]) == "[i!=j]*x[i]"
    p = (Rel("S", "i", "j") & ~Eq("i", 0)) | (i <= 1)
    assert str(p * x[i]) == "[S(i,j) and not i=0 or i<=1]*x[i]"


def test_latex_display():
    A, x = Var("A"), Var("x")
    e = Gen("i", 3, Sum("j", 3, Eq("i", "j") * A["i", "j"] * x["j"]))
    assert latex(e) == (r"\boxplus_{i < 3}\, \sum_{j < 3}\, "
                        r"[i = j] \cdot A[i][j] \cdot x[j]")
    assert latex(Let("m", Proj(0, Var("p")), Var("m"))) == \
        r"\textrm{let } m = \pi_0\, p \textrm{ in } m"
    assert type_latex(TTensor(3, TPair(R, R))) == r"[3](\mathbb{R} \times \mathbb{R})"
    assert x["i"]._repr_latex_() == "$x[i]$"
