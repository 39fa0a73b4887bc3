"""The `%cd` grammar: every assignment form of seed 004, and errors that point at the column."""

from __future__ import annotations

import pytest

from einjit.ir import ops
from einjit.tensor import cd_syntax as syn


def one(text):
    items = syn.parse(text)
    assert len(items) == 1
    return items[0]


@pytest.mark.parametrize("asgn,init,accum", [
    ("=:", False, ops.Binop.ARG2), ("=+", False, ops.Binop.ADD), ("=:+", True, ops.Binop.ADD),
    ("=-", False, ops.Binop.SUB), ("=:-", True, ops.Binop.SUB), ("=*", False, ops.Binop.MUL),
    ("=:*", True, ops.Binop.MUL), ("=/", False, ops.Binop.DIV), ("=**", False, ops.Binop.TO_POW_OF),
    ("=?/", False, ops.Binop.RELU_GATE), ("=:^^", True, ops.Binop.MAX), ("=vv", False, ops.Binop.MIN),
])
def test_accumulation_operators(asgn, init, accum):
    st = one(f"c {asgn} a")
    assert (st.initialize_neutral, st.accum) == (init, accum)
    assert st.rhs == syn.Ref("a", None, len(f"c {asgn} ") + 1)


@pytest.mark.parametrize("text,op", [
    ("t =: t1 + t2", ops.Binop.ADD), ("t =: t1 - t2", ops.Binop.SUB), ("t =: t1 * t2", ops.Binop.MUL),
    ("t =: t1 / t2", ops.Binop.DIV), ("t =: t1 ** t2", ops.Binop.TO_POW_OF), ("g1 =+ t -?/ g", ops.Binop.RELU_GATE),
    ("t =: max(t1, t2)", ops.Binop.MAX), ("t =: t1 < t2", ops.Binop.CMPLT),
])
def test_binary_right_hand_sides(text, op):
    st = one(text)
    assert isinstance(st.rhs, syn.Apply) and st.rhs.op is op and len(st.rhs.args) == 2


def test_unary_and_ternary_right_hand_sides():
    assert one("t =: relu(t1)").rhs.op is ops.Unop.RELU
    assert one("t =: -t1").rhs.op is ops.Unop.NEG
    assert one("t =: where(t1, t2, t3)").rhs.op is ops.Ternop.WHERE
    assert one("t =: fma(a, b, c)").rhs.op is ops.Ternop.FMA


def test_precedence_nests_sub_expressions():
    st = one("g1 =+ (t2 * t1 ** (t2 - 1)) * g")
    outer = st.rhs
    assert outer.op is ops.Binop.MUL
    inner = outer.args[0]
    assert inner.op is ops.Binop.MUL and inner.args[1].op is ops.Binop.TO_POW_OF
    assert one("x =: a + b * c").rhs.args[1].op is ops.Binop.MUL
    assert one("x =: a ** b ** c").rhs.args[1].op is ops.Binop.TO_POW_OF


def test_logic_and_projections_options():
    st = one('c =:+ a * b ~logic:"@"')
    assert st.logic == "@"
    assert one("c =:+ a * b ~logic:'ij;jk=>ik'").logic == "ij;jk=>ik"
    assert one("c =: a ~logic:\"T\"").logic == "T"
    assert one("c =: a * b ~projections:p").projections == "p"


def test_slot_fillers_fields_and_literals():
    st = one("p =- lr * p.grad")
    assert st.rhs.args[1] == syn.Ref("p", "grad", 11)
    assert one("x =: y.value").rhs == syn.Ref("y", "value", 6)
    assert one("x =+ y.merge").rhs.field == "merge"
    assert one("x =: 2.5").rhs == syn.Num(2.5, None, 6)
    assert one("x =: 'q' 2.0").rhs == syn.Num(2.0, "q", 6)
    assert one("x =: -3").rhs.value == -3.0


def test_inline_declaration_and_block_comment():
    items = syn.parse('~~("sgd step"; "delta" =: p.grad + 2 * p; p =- delta)')
    block = items[0]
    assert isinstance(block, syn.Block) and block.comment == "sgd step"
    assert block.body[0].lhs == syn.Decl("delta", 16)
    assert len(block.body) == 2


def test_several_statements():
    assert len(syn.parse("g1 =+ g; g2 =+ g;")) == 2


@pytest.mark.parametrize("text,col,fragment", [
    ("c =:+ a * ", 11, "expected a tensor"),
    ("c = a", 3, "'=' must be followed"),
    ("c =: foo(a)", 6, "unknown operation 'foo'"),
    ("3 =: a", 1, "starts with the assigned-to tensor"),
    ("c =: a.grud", 8, "expected grad, value or merge"),
    ("c =: relu(a, b)", 6, "relu takes 1 argument"),
    ("c =: a b", 8, "expected ';'"),
    ("c =: a ~logic:b", 15, "~logic: takes a string"),
    ("c =: a ~logic:@", 15, "unexpected character '@'"),
    ("c =: a $ b", 8, "unexpected character '$'"),
    ('"1x" =: a', 1, "needs an identifier"),
])
def test_errors_point_at_the_column(text, col, fragment):
    with pytest.raises(syn.CdSyntaxError) as e:
        syn.parse(text)
    msg = str(e.value)
    assert msg.startswith(f'cd "{text}": column {col}: ')
    assert fragment in msg


def test_parse_is_cached():
    assert syn.parse("a =: b") is syn.parse("a =: b")


def test_grad_merge_is_one_reference():
    assert one("q =+ p.grad.merge").rhs == syn.Ref("p", "grad.merge", 6)
    assert one("g1 =+ t1.grad.merge").rhs.field == "grad.merge"


def test_non_operator_binary_form_is_marked_intermediate():
    st = one("p =+ lr *. p.grad")
    assert st.rhs == syn.Apply(ops.Binop.MUL, (syn.Ref("lr", None, 6), syn.Ref("p", "grad", 12)), 9, True)
    assert one("p =+ a +. b *. c").rhs.op is ops.Binop.ADD
    # a number after '*' stays a number: `x*.5` is x times 0.5
    st = one("y =: x*.5")
    assert st.rhs == syn.Apply(ops.Binop.MUL, (syn.Ref("x", None, 6), syn.Num(0.5, None, 8)), 7)


def test_array_literals_nest_output_input_and_batch_axes():
    lit = one('"m" =: [(1, 2, 3); (4, -5, 6)]').rhs
    assert lit == syn.Literal("output", (syn.Literal("input", (1.0, 2.0, 3.0), 9),
                                         syn.Literal("input", (4.0, -5.0, 6.0), 20)), 8)
    assert one("b =: [|[1, 2], [3, 4]|]").rhs.kind == "batch"
    paren = one("y =: (a + 1) * 2").rhs
    assert isinstance(paren, syn.Apply) and paren.op is ops.Binop.MUL


@pytest.mark.parametrize("text,col,fragment", [
    ("m =: [(1, 2); (3, 4, 5)]", 6, "ragged"),
    ("m =: [1, a]", 10, "holds numbers or nested literals"),
    ("m =: [1, 2", 11, "expected ']'"),
])
def test_array_literal_errors(text, col, fragment):
    with pytest.raises(syn.CdSyntaxError) as err:
        syn.parse(text)
    assert f"column {col}:" in str(err.value) and fragment in str(err.value)


def test_prefix_relu_operator_of_seed_004():
    """Seed 004, Preliminaries: `Relu` gets the operator `!/`; it binds like prefix minus."""
    st = one('"r" =: !/ v')
    assert isinstance(st.lhs, syn.Decl) and st.rhs == syn.Apply(ops.Unop.RELU, (syn.Ref("v", None, 11),), 8)
    nested = one("r =: !/ -v + 1.0").rhs
    assert nested.op is ops.Binop.ADD
    assert nested.args[0].op is ops.Unop.RELU and nested.args[0].args[0].op is ops.Unop.NEG
    with pytest.raises(syn.CdSyntaxError, match="column 9: expected a tensor"):
        syn.parse("r =: !/ ;")


def test_relu_gate_accumulation_with_initialization():
    st = one('"s" =:?/ v * w ~logic:"i;i=>0"')
    assert (st.initialize_neutral, st.accum, st.logic) == (True, ops.Binop.RELU_GATE, "i;i=>0")
