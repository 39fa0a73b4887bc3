"""The `%cd` and `%op` forms evaluated end to end: values against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.ir import assignments as asg


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def run(code, *tensors):
    for t in tensors:
        t.hosted()
    train.to_routine(code, name="notation")()


def const(values, **kw):
    return ej.ndarray(np.asarray(values, dtype=np.float64), **kw)


def test_compose_logic_is_matrix_multiplication():
    a = const([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], input_axes=1)   # output 3, input 2
    b = const([[1.0, 0.5, 0.0], [2.0, 1.0, -1.0]], input_axes=1)    # output 2, input 3
    code = ej.cd('"c" =:+ a * b ~logic:"@"', a=a, b=b)
    run(code, code.c)
    want = a.value.numpy() @ b.value.numpy()
    np.testing.assert_allclose(code.c.value.numpy(), want, rtol=1e-12)
    assert code.c.dims == (3, 3)


def test_pointwise_default_and_accumulation_operators():
    a, b = const([1.0, 2.0, 3.0]), const([4.0, 5.0, 6.0])
    code = ej.cd('"c" =: a + b; c =+ a * b; c =- b; c =* a; c =/ b', a=a, b=b)
    run(code, code.c)
    av, bv = a.value.numpy(), b.value.numpy()
    np.testing.assert_allclose(code.c.value.numpy(), ((av + bv + av * bv - bv) * av) / bv, rtol=1e-12)


def test_initialize_neutral_clears_before_accumulating():
    a = const([[1.0, 2.0], [3.0, 4.0]])
    code = ej.cd('"s" =:+ a ~logic:"ij=>i"; "m" =:^^ a ~logic:"ij=>j"; "p" =:* a ~logic:"ij=>i"', a=a)
    run(code, code.s, code.m, code.p)
    np.testing.assert_allclose(code.s.value.numpy(), [3.0, 7.0])
    np.testing.assert_allclose(code.m.value.numpy(), [3.0, 4.0])
    np.testing.assert_allclose(code.p.value.numpy(), [2.0, 12.0])


@pytest.mark.parametrize("accum, pointwise, reduced", [
    ("-", lambda x: -x, lambda rows: -rows.sum(axis=1)),
    ("/", lambda x: 1 / x, lambda rows: 1 / rows.prod(axis=1)),
    ("**", lambda x: np.ones_like(x), lambda rows: np.ones(len(rows))),
    ("+", lambda x: x, lambda rows: rows.sum(axis=1)),
    ("^^", lambda x: x, lambda rows: rows.max(axis=1)),
])
def test_initialize_neutral_means_the_same_pointwise_and_reduced(accum, pointwise, reduced):
    """Seed 004: `lhs = neutral; lhs = lhs accum rhs` whether or not a cell is written once:
    `=:-` negates pointwise as it negates the sum of a reduction."""
    xv = np.array([[2.0, 4.0], [0.5, 8.0]])
    a = const(xv)
    code = ej.cd(f'"p" =:{accum} a; "r" =:{accum} a ~logic:"ij=>i"', a=a)
    run(code, code.p, code.r)
    np.testing.assert_allclose(code.p.value.numpy(), pointwise(xv), rtol=1e-12)
    np.testing.assert_allclose(code.r.value.numpy(), reduced(xv), rtol=1e-12)


def test_array_literals_inside_cd_text():
    v = const([1.0, 1.0])
    code = ej.cd('"m" =:+ [(1, 2); (3, 4)] * v ~logic:"@"; "s" =: v * [10, 20]; "b" =: [|[1, 2], [3, 4]|] + 0.5',
                 v=v)
    run(code, code.m, code.s, code.b)
    np.testing.assert_allclose(code.m.value.numpy(), [3.0, 7.0])
    np.testing.assert_allclose(code.s.value.numpy(), [10.0, 20.0])
    assert str(code.b.shape) == "2|2"
    np.testing.assert_allclose(code.b.value.numpy(), [[1.5, 2.5], [3.5, 4.5]])


def test_non_operator_product_makes_an_intermediate_tensor():
    """Seed 004: `p =+ lr *. p.grad` adds an intermediate product (Accum_unop, Identity); the
    same values as `p =+ lr * p.grad`."""
    p, lr, g = const([1.0, 2.0]), const([0.5]), const([4.0, 6.0])
    code = ej.cd("p =+ lr *. g", p=p, lr=lr, g=g)
    last = list(asg.flatten(code.asgns))[-1]
    assert isinstance(last, asg.AccumUnop) and last.op is ej.ops.Unop.IDENTITY and last.accum is ej.ops.Binop.ADD
    direct = ej.cd("p =+ lr * g", p=p, lr=lr, g=g)
    assert isinstance(list(asg.flatten(direct.asgns))[-1], asg.AccumBinop)
    x = ej.param("x", values=[1.0, 2.0])
    code = ej.cd("x =+ lr *. g", x=x, lr=lr, g=g)
    train.init_params(x)
    train.to_routine(code)()
    np.testing.assert_allclose(x.value.numpy(), [3.0, 5.0])


def test_grad_merge_reads_the_merge_buffer_of_the_gradient():
    p, q = ej.param("p", values=[1.0, 2.0]), ej.param("q", values=[0.0, 0.0])
    code = ej.cd("q =+ p.grad.merge", p=p, q=q)
    (a,) = list(asg.flatten(code.asgns))
    assert a.rhs == asg.MergeBuffer(p.grad_tn)


def test_inline_declaration_takes_its_label_from_the_right_hand_side():
    x = const([1.0, 2.0], label="x")
    code = ej.cd('"s" =:+ x ~logic:"i=>0"; "t" =: 2.0 * s', x=x)
    assert code.s.label_str == "s.x" and code.t.label_str == "t.s.x"
    run(code, code.t)
    np.testing.assert_allclose(code.t.value.numpy(), [6.0])


def test_zero_fills_lower_to_zero_out():
    """As in OCANNL, `x := 0` (the gradients' zeroing) lowers to the node's `Zero_out`; other
    constants stay a fill loop. Running the step twice gives the same gradient."""
    from einjit.ir import low_level as ll
    w = ej.param("w", values=[1.0, -2.0, 3.0])
    loss = ej.sum(w * w, "i, => ")
    code = train.grad_update(loss)
    stmts = list(ll.block_statements(asg.to_low_level(code)))
    zeroed = {s.tn for s in stmts if isinstance(s, ll.ZeroOut)}
    assert w.grad_tn in zeroed and loss.grad_tn in zeroed
    fill = asg.to_low_level(ej.cd("w =: 7.0", w=w).asgns)
    assert not [s for s in ll.block_statements(fill) if isinstance(s, ll.ZeroOut)]
    train.init_params(loss)
    routine = train.to_routine(code, name="zero_out")
    routine()
    routine()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, -4.0, 6.0])


def test_transpose_logic_and_einsum_specs():
    a = const([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], input_axes=1)
    b = const([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    code = ej.cd('"t" =: a ~logic:"T"; "e" =:+ a * b ~logic:"i->j;i k=>j k"', a=a, b=b)
    run(code, code.t, code.e)
    np.testing.assert_allclose(code.t.value.numpy(), a.value.numpy().T)
    assert (len(code.t.shape.input.dims), code.t.dims) == (1, (3, 2))
    np.testing.assert_allclose(code.e.value.numpy(), a.value.numpy() @ b.value.numpy())


def test_unary_binary_ternary_right_hand_sides():
    a, b, c = const([-1.0, 0.5, 2.0]), const([3.0, -2.0, 1.0]), const([1.0, 0.0, 1.0])
    code = ej.cd('"u" =: relu(a); "v" =: max(a, b); "w" =: where(c, a, b); "x" =: a -?/ b; "y" =: -a',
                 a=a, b=b, c=c)
    run(code, code.u, code.v, code.w, code.x, code.y)
    av, bv, cv = (t.value.numpy() for t in (a, b, c))
    np.testing.assert_allclose(code.u.value.numpy(), np.maximum(av, 0))
    np.testing.assert_allclose(code.v.value.numpy(), np.maximum(av, bv))
    np.testing.assert_allclose(code.w.value.numpy(), np.where(cv != 0, av, bv))
    np.testing.assert_allclose(code.x.value.numpy(), np.where(av > 0, bv, 0))
    np.testing.assert_allclose(code.y.value.numpy(), -av)


def test_nested_sub_expressions_become_tensors_and_numbers_broadcast():
    a, b = const([1.0, 2.0, 3.0]), const([2.0, 2.0, 2.0])
    code = ej.cd('"r" =: (a + 1) * (b ** 2) - 0.5 * exp(a)', a=a, b=b)
    run(code, code.r)
    av, bv = a.value.numpy(), b.value.numpy()
    np.testing.assert_allclose(code.r.value.numpy(), (av + 1) * bv ** 2 - 0.5 * np.exp(av), rtol=1e-12)


def test_keyword_numbers_and_grad_and_value_fields():
    p = ej.param("p", values=[1.0, 2.0])
    train.init_params(p)
    p.grad_tn.host_array()[...] = [10.0, 20.0]
    code = ej.cd("p =- lr * p.grad; p =+ p.value", p=p, lr=0.05)
    train.to_routine(code)()
    np.testing.assert_allclose(p.value.numpy(), 2 * (np.array([1.0, 2.0]) - 0.05 * np.array([10.0, 20.0])))


def test_block_comment_appears_in_assignments():
    a = const([1.0])
    code = ej.cd('~~("double it"; "d" =: a + a)', a=a)
    assert isinstance(code.asgns, asg.Seq) or isinstance(code.asgns, asg.BlockComment)
    assert "# double it" in asg.to_doc(code.asgns)
    run(code, code.d)
    assert code.d.value.numpy()[0] == 2.0


def test_projections_passed_through():
    a = const([[1.0, 2.0], [3.0, 4.0]])
    first = ej.cd('"s" =:+ a ~logic:"ij=>i"', a=a)
    proj = first.asgns.projections
    second = ej.cd("s2 =:+ a ~projections:pr", s2=first.s.value, a=a, pr=proj)
    run(asg.sequence(first.asgns, second.asgns), first.s)
    np.testing.assert_allclose(first.s.value.numpy(), [3.0, 7.0])


def test_label_prefixed_number_gives_a_labeled_axis():
    t = ej.number(2.0, label="q") * ej.param("w", output_dims=[3])
    assert "q" in str(ej.number(1.0, label="q").shape)
    assert t.shape is not None


def test_unknown_name_points_at_the_column():
    with pytest.raises(ej.CdError, match=r'cd "c =: a \+ zz": column 10: unknown name \'zz\''):
        ej.cd("c =: a + zz", c=const([1.0]), a=const([1.0]))


def test_grad_of_non_differentiable_tensor_is_an_error():
    with pytest.raises(ej.CdError, match=r"column 6: tensor ndarray .* is not differentiable"):
        ej.cd("c =: a.grad", c=const([1.0]), a=const([1.0]))


def test_shape_error_names_the_column():
    a, b = const([1.0, 2.0]), const([1.0, 2.0, 3.0])
    with pytest.raises(ej.ShapeError, match=r'cd ""c" =: a \+ b": column 1: dimension mismatch .* 2 .* vs 3'):
        ej.cd('"c" =: a + b', a=a, b=b)


# ------------------------------------------------------------------ literals


def test_tuple_is_input_list_is_output_batch_is_marked():
    m = ej.ndarray([(1.0, 2.0, 3.0), (4.0, 5.0, 6.0)])
    assert (len(m.shape.output.dims), len(m.shape.input.dims)) == (1, 1)
    assert m.dims == (2, 3)
    t = ej.ndarray(([1.0, 2.0], [3.0, 4.0], [5.0, 6.0]))   # input 3 (outer), output 2 (inner)
    assert t.dims == (2, 3)
    np.testing.assert_allclose(t.value.numpy(), [[1.0, 3.0, 5.0], [2.0, 4.0, 6.0]])
    b = ej.ndarray(ej.Batch([[1.0, 2.0], [3.0, 4.0]]))
    assert (len(b.shape.batch.dims), len(b.shape.output.dims)) == (1, 1)


def test_number_is_a_one_axis_output():
    n = ej.number(3.5)
    assert n.dims == (1,) or str(n.shape) == "1"
    assert train.forward_once(n)[0] == 3.5


def test_range_and_embedded_static_symbol():
    r = ej.range(5)
    np.testing.assert_allclose(train.forward_once(r), np.arange(5.0))
    sym = ej.get_static_symbol(10)
    e = ej.embed_symbol(sym) * 2
    routine = train.to_routine(train.forward(e), bindings=[sym])
    routine.bindings[sym].value = 7
    routine()
    assert e.value.numpy()[0] == 14.0


def test_wildcard_form_only_adds_shape_constraints():
    w = ej.param("w")
    x = const([1.0, 2.0, 3.0])
    with ej.unchanged_roots():
        _ = w * x
    y = w + 1
    assert w.id not in {t.id for t in ()}
    train.init_params(y)
    assert y.dims == (3,)


def test_wildcard_cd_gives_back_the_forward_code_it_names():
    """Issue 14 item 3: a `cd` inside `unchanged_roots` restores the forward code of the roots
    it names, so a later routine for them is not empty."""
    x = const([1.0, 2.0, 3.0])
    t = x * 2.0 + 1.0
    with ej.unchanged_roots():
        ej.cd('"probe" =: t * 10', t=t)
    np.testing.assert_array_equal(train.forward_once(t), [3.0, 5.0, 7.0])


def test_consuming_code_twice_is_an_error():
    a = ej.param("a", values=[1.0])
    b = a * 2
    train.grad_update(b)
    with pytest.raises(ej.TensorError, match="already consumed"):
        train.grad_update(b)
    c = a + 1
    _ = c * 3
    with pytest.raises(ej.TensorError, match="not a forward root"):
        train.forward(c)


def test_tensors_print_with_axis_kinds_values_and_gradients():
    a = ej.param("a", values=[[1.0, 2.0]])
    loss = ej.sum(a * a, "...|...->... => 0", label="loss")
    train.init_params(loss)
    train.to_routine(train.grad_update(loss))()
    text = str(a)
    assert "Tensor a" in text and "differentiable" in text
    assert "value [output 1, output 2]" in text and "grad [output 1, output 2]" in text
    assert "4." in text


@pytest.mark.parametrize("text, ref", [
    ("c =: a < b", lambda a, b: a < b),
    ("c =: b == a", lambda a, b: b == a),
    ("c =: a <> b", lambda a, b: a != b),
    ("c =: (a < b) * b", lambda a, b: (a < b) * b),
    ("c =: where(b < a, a, b)", lambda a, b: np.where(b < a, a, b)),
    ("c =+ (a < 1.5) + (b == 2)", lambda a, b: (a < 1.5) * 1.0 + (b == 2)),
])
@pytest.mark.parametrize("a_shape, b_shape", [((2, 3), (3,)), ((3,), (2, 1)), ((2, 1), (1, 3))])
def test_comparisons_broadcast_as_other_pointwise_binops(text, ref, a_shape, b_shape):
    rng = np.random.default_rng(len(text))
    av, bv = rng.integers(0, 4, a_shape).astype(np.float64), rng.integers(0, 4, b_shape).astype(np.float64)
    c = ej.input("c", output_dims=[2, 3], values=np.zeros((2, 3)))
    run(ej.cd(text, c=c, a=const(av, label="a"), b=const(bv, label="b")))
    np.testing.assert_array_equal(c.value.numpy(), np.broadcast_to(ref(av, bv), (2, 3)))
