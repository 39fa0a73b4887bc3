"""Typechecking: the notebook's typed printouts and its kinds of error, all reported at once."""

import pytest

from atl_notebook import A, Axc, Rn, Rnn, c, diag, i, j, n, tr, x
from einjit.atl import (
    B,
    Const,
    Eq,
    Gen,
    Idx,
    Let,
    Pair,
    Proj,
    R,
    Rel,
    Sum,
    Sym,
    TCError,
    TPair,
    TTensor,
    Var,
    typecheck,
)
from einjit.atl.ir import Access, IVar
from einjit.atl.ir import Gen as GenNode


def test_notebook_typed_functions_print_as_in_the_notebook():
    assert str(typecheck([("A", Rnn), ("x", Rn), ("c", Rn)], Axc)) == (
        "Function(A:[3][3]R, x:[3]R, c:[3]R) : [3]R\n"
        "    Gen(i:3) c[i] + (+(j:3) A[i][j] * x[j])")
    assert str(typecheck([("A", Rnn)], tr)) == (
        "Function(A:[3][3]R) : R\n"
        "    +(i:3) A[i][i]")
    assert str(typecheck([("x", Rn)], diag)) == (
        "Function(x:[3]R) : [3][3]R\n"
        "    Gen(i:3) Gen(j:3) [i=j]*x[i]")


def test_typed_ir_has_fresh_symbols_and_types_everywhere():
    tf = typecheck([("x", Rn)], diag)
    (xs, xt), = tf.args
    assert isinstance(xs, Sym) and xt == Rn
    outer = tf.body
    assert isinstance(outer, GenNode) and isinstance(outer.idx, Sym)
    assert outer.typ == TTensor(3, TTensor(3, R))
    inner = outer.body
    assert inner.idx is not outer.idx
    ind = inner.body
    assert ind.pred.lhs == IVar(outer.idx) and ind.pred.rhs == IVar(inner.idx)
    assert ind.body == Access(Var(xs, Rn), IVar(outer.idx), R)


def test_shadowing_binds_to_the_innermost_binder():
    e = Gen(i, 2, Gen(i, 3, x[i]))
    tf = typecheck([("x", Rn)], e)
    assert tf.body.body.body.idx == IVar(tf.body.body.idx)


def test_a_typed_program_typechecks_again():
    tf = typecheck([("A", Rnn), ("x", Rn), ("c", Rn)], Axc)
    again = typecheck(list(tf.args), tf.body)
    assert str(again) == str(tf)
    assert again.body.idx is not tf.body.idx


def errors_of(args, e) -> list[str]:
    with pytest.raises(TCError) as info:
        typecheck(args, e)
    msg = str(info.value)
    assert msg.startswith("Found errors during typechecking:\n  ")
    assert msg.count("\n  ") == len(info.value.errors)
    return info.value.errors


def test_every_error_is_collected_in_one_exception():
    e = Gen(i, n, Sum(j, n, A[i, j] * Var("z")[j] + c[Idx("q")]))
    errs = errors_of([("A", Rnn), ("c", Rn)], e)
    assert errs == ["variable 'z' was undefined", "index variable 'q' was undefined"]


def test_index_bound_to_a_different_range():
    errs = errors_of([("x", TTensor(4, R))], Sum(i, n, x[i]))
    assert errs == ["index variable 'i' was bound to the range 3, but this tensor "
                    "expects an index of range 4"]


def test_indexing_a_non_tensor_and_projecting_a_non_pair():
    errs = errors_of([("s", R)], Proj(0, Var("s")) + Sum(i, n, Var("s")[i]))
    assert errs == ["Was expecting a pair as argument: s.0",
                    "Was expecting a tensor to index: s[i]"]


def test_arithmetic_needs_numbers():
    errs = errors_of([("x", Rn)], x + Const(1.0))
    assert errs == ["expected number on left-hand-side of addition: x + 1.0"]
    errs = errors_of([("x", Rn), ("p", TPair(R, R))], Const(2.0) * Var("p"))
    assert errs == ["expected number on right-hand-side of multiplication: 2.0 * p"]


def test_sum_body_must_be_a_number():
    errs = errors_of([("A", Rnn)], Sum(i, n, A[i]))
    assert errs == ["Was expecting a number as body: +(i:3) A[i]"]


def test_index_and_value_namespaces_are_kept_apart():
    errs = errors_of([("x", Rn)], Gen(i, n, Var("i") + x[Idx("x")]))
    assert errs == ["variable 'i' was not bound as a variable",
                    "variable 'x' was not bound as an index variable"]


def test_equality_of_indices_from_different_ranges():
    errs = errors_of([("x", Rn)], Gen(i, n, Sum(j, 2, Eq(i, j) * x[i])))
    assert errs == ["index variables 'i' and 'j' in equality are drawn from "
                    "different ranges: 3 and 2"]


def test_literal_indices_must_be_in_range():
    assert typecheck([("x", Rn)], x[2]).ret_type == R
    errs = errors_of([("x", Rn)], x[3])
    assert errs == ["integer index 3 is out of range for a tensor of extent 3: x[3]"]


def test_let_scoping_and_types():
    tf = typecheck([("x", Rn)], Let("y", Pair(x, Const(1.0)), Proj(1, Var("y"))))
    assert tf.ret_type == R
    assert tf.body.rhs.typ == TPair(Rn, R)
    errs = errors_of([("x", Rn)], Let("y", x, Var("y")) + Var("y")[0])
    assert "variable 'y' was undefined" in errs


def test_relations_only_in_predicates():
    S = TTensor(3, TTensor(2, B))
    ok = typecheck([("S", S), ("A", TTensor(3, TTensor(2, R)))],
                   Gen(i, 3, Sum(j, 2, Rel("S", i, j) * A[i, j])))
    assert ok.ret_type == Rn
    errs = errors_of([("S", S)], Sum(i, 3, Var("S")[i, 0]))
    assert errs[0].startswith("relation 'S' can only be used inside a predicate")
    errs = errors_of([("S", S), ("x", Rn)], Sum(i, 3, Rel("S", i) * x[i]))
    assert errs == ["relation 'S' has rank 2 but was given 1 indices: S(i)"]
    errs = errors_of([("x", Rn)], Sum(i, 3, Rel("x", i) * x[i] + Rel("T", i) * x[i]))
    assert errs == ["'x' is not a relation (a tensor of booleans): x(i)",
                    "relation 'T' was undefined"]
    errs = errors_of([("S", S), ("x", Rn)], Sum(i, 3, Rel("S", i, i) * x[i]))
    assert errs == ["index variable 'i' was bound to the range 3, but this tensor "
                    "expects an index of range 2"]


def test_bad_signatures():
    errs = errors_of([("x", Rn), ("x", R)], Var("x"))
    assert errs == ["argument 'x' is declared twice"]
    errs = errors_of([("b", B)], Const(1.0))
    assert errs[0].startswith("argument 'b' has a bad type")
    errs = errors_of([("x", TTensor(0, R))], Const(1.0))
    assert errs[0].startswith("argument 'x' has a bad type")
    errs = errors_of([], Gen(i, 0, Const(1.0)))
    assert errs == ["range of 'i' must be a positive integer, got 0"]
