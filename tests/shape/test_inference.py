"""Global shape inference: propagation, closing, labels, terminals, errors and recovery."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from einjit import shape as sh
from einjit.ir.indexing import get_static_symbol
from einjit.shape import ShapeError


def known(name="", batch=(), inp=(), out=()):
    return sh.Shape.make(batch_dims=list(batch), input_dims=list(inp), output_dims=list(out), debug_name=name)


def unknown(name=""):
    return sh.Shape.make(debug_name=name)


def step(cur, kind, *args):
    logic = sh.Broadcast(kind, *args) if len(args) == 2 else sh.Transpose(kind, *args)
    return sh.UpdateStep(cur, logic)


def propagate(cur, kind, *args):
    s = step(cur, kind, *args)
    sh.propagate_shapes(s)
    return s


# ------------------------------------------------------------------ propagation and closing

def test_propagation_updates_shapes_in_place_before_finishing():
    x = known("x", batch=[8], out=[3])
    y = unknown("y")
    propagate(y, sh.PointwiseUn(), x)
    assert str(y).endswith(",8|..input" + str(y).split("|..input")[1])  # still open rows ...
    assert y.batch.dims[-1].d == 8 and y.output.dims[-1].d == 3
    sh.finish_inference()
    assert str(y) == "8|3"
    assert sh.to_dims(y) == (8, 3)


def test_compose_is_a_generalized_matmul_over_several_axes():
    w = known("w", inp=[4, 5], out=[6])
    x = known("x", batch=[2], inp=[7], out=[4, 5])
    y = unknown("y")
    propagate(y, sh.Compose(), w, x)
    sh.finish_inference()
    assert str(y) == "2|7->6"
    assert sh.to_dims(y) == (2, 6, 7)


def test_compose_infers_an_unknown_operator_from_its_use():
    x = known("x", batch=[32], out=[2])
    w = sh.Shape.make(batch_dims=[], debug_name="w")
    b = known("b", out=[16])
    m, y = unknown("m"), unknown("y")
    propagate(m, sh.Compose(), w, x)
    propagate(y, sh.PointwiseBin(), m, b)
    sh.finish_inference()
    assert str(w) == "2->16"
    assert str(y) == "32|16"


def test_transpose_swaps_input_and_output():
    x = known("x", batch=[2], inp=[3], out=[4, 5])
    y = unknown("y")
    propagate(y, sh.TransposeIO(), x)
    sh.finish_inference()
    assert str(y) == "2|4,5->3"


def test_pointwise_broadcasts_dimension_one_and_missing_axes():
    a = known("a", out=[3, 1])
    b = known("b", out=[4])
    c = unknown("c")
    propagate(c, sh.PointwiseBin(), a, b)
    sh.finish_inference()
    assert sh.to_dims(c) == (3, 4)


def test_result_takes_the_least_upper_bound_of_its_uses():
    """An unconstrained argument takes the shape of the context it is used in."""
    p = unknown("p")
    x = known("x", batch=[5], out=[3])
    y = unknown("y")
    propagate(y, sh.PointwiseBin(), p, x)
    sh.finish_inference()
    assert str(p) == "5|3"


def test_closing_defaults_to_dimension_one_and_no_axes_for_results():
    """Rows nothing constrains close to no further axes (the result of an operation takes its
    axes from its arguments)..."""
    p, q = unknown("p"), unknown("q")
    propagate(q, sh.PointwiseUn(), p)
    sh.finish_inference()
    assert str(p) == "" and sh.to_dims(p) == ()
    v = sh.Shape.make(batch_dims=[], input_dims=[], output_dims=[None], debug_name="v")
    propagate(unknown(), sh.PointwiseUn(), v)
    sh.finish_inference()
    assert sh.to_dims(v) == (1,)


def test_a_leaf_output_row_nothing_constrains_closes_to_one_axis():
    """... but seed 003 says a fully inferred shape has non-empty output axes (scalars are 1-D):
    a leaf (`track`: a parameter, an inline declaration) gets one output axis of dimension 1,
    and so does the result built from it; its other rows close to none."""
    p, q = unknown("p"), unknown("q")
    sh.track(p)
    propagate(q, sh.PointwiseUn(), p)
    sh.finish_inference()
    assert (str(p), str(q)) == ("1", "1") and sh.to_dims(p) == sh.to_dims(q) == (1,)


def test_input_equals_output_is_deduced_within_a_shape():
    s = sh.Shape.make(batch_dims=[], input_dims=[3], deduced=sh.InputEqualsOutput(), debug_name="sq")
    assert str(s) == "3->3"


def test_to_dims_of_an_unsolved_shape_is_an_error():
    s = sh.Shape.make(batch_dims=[], input_dims=[], debug_name="open")
    with pytest.raises(ShapeError, match=r'shape "open" #\d+ is not fully inferred: output row'):
        sh.to_dims(s)


def test_einsum_with_row_variables_and_reduction():
    x = known("x", batch=[2, 3], out=[4, 5])
    y = unknown("y")
    propagate(y, sh.Permute("...|ij=>...|i"), x)
    sh.finish_inference()
    assert str(y) == "2,3|4"


def test_einsum_lhs_only_axis_takes_the_result_size():
    x = known("x", out=[4])
    y = known("y", out=[4, 6])
    propagate(y, sh.Permute("i=>ij"), x)
    sh.finish_inference()
    assert str(y) == "4,6"


def test_batch_slice_removes_the_leftmost_batch_axis():
    sym = get_static_symbol(10)
    data = known("data", batch=[10, 4], out=[3])
    s = unknown("s")
    propagate(s, sh.BatchSlice(sym), data)
    assert str(s) == "4|3"


def test_batch_slice_infers_the_sliced_shape_from_the_slice():
    sym = get_static_symbol(10)
    data = sh.Shape.make(input_dims=[], output_dims=[3], debug_name="data")
    s = known("s", batch=[4], out=[3])
    propagate(s, sh.BatchSlice(sym), data)
    assert str(data) == "10,4|3"


def test_batch_slice_without_batch_axis_is_an_error():
    with pytest.raises(ShapeError, match='batch slice: "flat" .* has no batch axis to remove'):
        propagate(unknown("s"), sh.BatchSlice(get_static_symbol()), known("flat", out=[3]))


# ------------------------------------------------------------------ labels

def test_labels_propagate_to_unlabelled_and_unknown_axes():
    a = sh.Shape.make(batch_dims=[], input_dims=[], output_axes=[("rgb", 3)], debug_name="img")
    b = known("b", out=[3])
    c = unknown("c")
    propagate(c, sh.PointwiseBin(), a, b)
    sh.finish_inference()
    assert str(b) == "rgb=3" and str(c) == "rgb=3"
    assert "label rgb" in c.describe()


def test_label_mismatch_names_both_shapes_and_labels():
    a = sh.Shape.make(batch_dims=[], input_dims=[], output_axes=[("rgb", 3)], debug_name="img")
    b = sh.Shape.make(batch_dims=[], input_dims=[], output_axes=[("xyz", 3)], debug_name="pt")
    with pytest.raises(ShapeError) as err:
        propagate(unknown("sum"), sh.PointwiseBin(), a, b)
    msg = str(err.value)
    assert msg.startswith("label mismatch")
    assert '"img"' in msg and '"pt"' in msg and "rgb=3" in msg and "xyz=3" in msg and "output axis 0" in msg


def test_labels_do_not_constrain_broadcast_dimension_one():
    a = sh.Shape.make(batch_dims=[], input_dims=[], output_axes=[("rgb", 3)], debug_name="img")
    b = sh.Shape.make(batch_dims=[], input_dims=[], output_axes=[("one", 1)], debug_name="b")
    c = unknown("c")
    propagate(c, sh.PointwiseBin(), a, b)
    sh.finish_inference()
    assert str(c) == "rgb=3"


# ------------------------------------------------------------------ terminals

def test_constant_fill_infers_the_one_unknown_dimension():
    s = sh.Shape.make(batch_dims=[], input_dims=[2], output_dims=[None], debug_name="lit")
    sh.propagate_shapes(sh.UpdateStep(s, sh.Terminal(sh.ConstantFill(6))))
    assert str(s) == "2->3"


def test_constant_fill_of_an_unknown_shape_closes_to_an_output_axis():
    s = unknown("lit")
    sh.propagate_shapes(sh.UpdateStep(s, sh.Terminal(sh.ConstantFill(6))))
    sh.finish_inference()
    assert str(s) == "6"


def test_constant_fill_respects_shape_information_from_elsewhere():
    s = unknown("lit")
    sh.propagate_shapes(sh.UpdateStep(s, sh.Terminal(sh.ConstantFill(6))))
    y = unknown("y")
    propagate(y, sh.PointwiseBin(), s, known("x", batch=[3], out=[1]))
    sh.finish_inference()
    assert str(s) == "3|2" and str(y) == "3|2"


def test_constant_fill_not_strict_has_no_count_constraint():
    s = known("s", out=[4, 4])
    sh.propagate_shapes(sh.UpdateStep(s, sh.Terminal(sh.ConstantFill(3, strict=False))))
    sh.finish_inference()
    assert sh.to_dims(s) == (4, 4)


def test_constant_fill_count_that_does_not_divide():
    s = sh.Shape.make(batch_dims=[], input_dims=[], output_dims=[3, None], debug_name="lit")
    with pytest.raises(ShapeError) as err:
        sh.propagate_shapes(sh.UpdateStep(s, sh.Terminal(sh.ConstantFill(10))))
    msg = str(err.value)
    assert 'ConstantFill of 10 values for "lit"' in msg and "product 3" in msg and "do not divide 10" in msg


def test_file_mapped_reads_the_element_count(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(4 * 24))
    s = sh.Shape.make(batch_dims=[None], input_dims=[], output_dims=[3, 2], debug_name="file")
    sh.propagate_shapes(sh.UpdateStep(s, sh.Terminal(sh.FileMapped(str(path), 4))))
    assert str(s) == "4|3,2"
    with pytest.raises(ShapeError, match="not a multiple of the item size 5"):
        sh.propagate_shapes(sh.UpdateStep(unknown(), sh.Terminal(sh.FileMapped(str(path), 5))))
    with pytest.raises(ShapeError, match="cannot read the length"):
        sh.propagate_shapes(sh.UpdateStep(unknown(), sh.Terminal(sh.FileMapped(str(tmp_path / "nope"), 4))))


# ------------------------------------------------------------------ errors and recovery

def test_dimension_mismatch_names_shapes_kinds_positions_and_dims():
    a, b, c = known("a", out=[2, 3]), known("b", out=[4, 3]), unknown("c")
    with pytest.raises(ShapeError) as err:
        propagate(c, sh.PointwiseBin(), a, b)
    msg = str(err.value)
    assert msg.startswith("dimension mismatch")
    assert '"a"' in msg and '"b"' in msg and '"c"' in msg
    assert "output axis 0" in msg and "2 (from" in msg and "4 (from" in msg


def test_einsum_mismatch_names_the_spec_and_both_arguments():
    x, y = known("x", out=[2, 3]), known("y", out=[4, 5])
    with pytest.raises(ShapeError) as err:
        propagate(unknown("z"), sh.Einsum("ij;jk=>ik"), x, y)
    msg = str(err.value)
    assert 'einsum "ij;jk=>ik" rhs2' in msg
    assert '"x"' in msg and '"y"' in msg and "3 (from" in msg and "4 (from" in msg


def test_too_many_axes_for_a_row_without_row_variable():
    x, small = known("x", out=[2, 3]), known("small", out=[3])
    with pytest.raises(ShapeError) as err:
        propagate(small, sh.PointwiseUn(), x)
    msg = str(err.value)
    assert msg.startswith("too many axes: 2 axes do not fit into 1")
    assert '"x"' in msg and '"small"' in msg and "output row [2,3]" in msg and "output row [3]" in msg


def test_cannot_broadcast_a_larger_argument_into_dimension_one():
    with pytest.raises(ShapeError, match=r'cannot broadcast between "r" .* output axis 0 and "x" .*: 1 .* vs 5'):
        propagate(known("r", out=[1]), sh.PointwiseUn(), known("x", out=[5]))


def test_fixed_index_out_of_range():
    with pytest.raises(ShapeError, match=r'fixed index 7 is out of range for einsum "i7=>i" rhs for "x"'):
        propagate(unknown("y"), sh.Permute("i7=>i"), known("x", out=[2, 3]))


def test_bad_spec_is_reported_when_the_logic_is_made():
    with pytest.raises(ShapeError, match=r'einsum spec "ab;bc=>a\*c": column 9'):
        sh.Einsum("ab;bc=>a*c")
    with pytest.raises(ShapeError, match="expected 2 argument slot"):
        sh.Einsum("ab=>a")


def test_bad_dimension_in_make():
    with pytest.raises(ShapeError, match="dimension must be a positive int, got 0"):
        sh.Shape.make(output_dims=[0])
    with pytest.raises(ShapeError, match="not both"):
        sh.Shape.make(output_dims=[1], output_axes=[("a", 1)])


def test_failed_propagation_leaves_inference_usable_and_unchanged():
    x = known("x", batch=[2], out=[3])
    y = unknown("y")
    propagate(y, sh.PointwiseUn(), x)
    before = str(y)
    bad = known("bad", batch=[2], out=[4])
    with pytest.raises(ShapeError):
        propagate(y, sh.PointwiseUn(), bad)
    assert str(y) == before and str(bad) == "2|4"
    z = unknown("z")
    good = known("good", batch=[2], out=[1])
    propagate(z, sh.PointwiseBin(), y, good)
    sh.finish_inference()
    assert str(y) == "2|3" and str(z) == "2|3"


def test_failed_finish_leaves_state_untouched():
    s = sh.Shape.make(batch_dims=[], input_dims=[], output_dims=[None, None], debug_name="two")
    sh.propagate_shapes(sh.UpdateStep(s, sh.Terminal(sh.ConstantFill(6))))
    with pytest.raises(ShapeError, match="6 elements do not fit"):
        sh.finish_inference()
    assert str(s).count("_") == 2
    sh.reset_state()
    t = known("t", out=[2])
    propagate(unknown("u"), sh.PointwiseUn(), t)
    sh.finish_inference()


# ------------------------------------------------------------------ printing

def test_printing_and_parsing_the_notation_round_trip():
    s = sh.Shape.make(batch_dims=[2], input_dims=[3], output_axes=[("rgb", 3), (None, 4)], debug_name="s")
    assert str(s) == "2|3->rgb=3,4"
    t = sh.Shape.of_spec(str(s), debug_name="t")
    assert str(t) == str(s) and sh.to_dims(t) == (2, 3, 4, 3)
    assert str(known(out=[5])) == "5" and str(known(inp=[2], out=[5])) == "2->5"
    desc = s.describe()
    assert 'shape "s"' in desc
    assert "axis 0: batch 0, size 2" in desc
    assert "axis 1: output 0, size 3, label rgb" in desc
    assert "axis 3: input 0, size 3" in desc


def test_shape_of_spec_with_unknowns():
    s = sh.Shape.of_spec("...|_->10", debug_name="p")
    propagate(unknown(), sh.PointwiseUn(), s)
    sh.finish_inference()
    assert str(s) == "1->10"


# ------------------------------------------------------------------ order independence

def _network(rng: random.Random):
    """A small network of operations on partly unknown shapes, as (shapes, steps)."""
    batch = rng.choice([[], [2], [3, 2], None])
    x = sh.Shape.make(batch_dims=batch, input_dims=[], output_dims=[rng.choice([2, 3])], debug_name="x")
    shapes, steps, h = [x], [], x
    for layer in range(rng.randint(1, 4)):
        w = sh.Shape.make(batch_dims=rng.choice([[], None]), debug_name=f"w{layer}")
        size = rng.choice([1, 4, 5])
        b = known(f"b{layer}", out=[size])
        m, a = unknown(f"m{layer}"), unknown(f"a{layer}")
        steps += [step(m, sh.Compose(), w, h), step(a, sh.PointwiseBin(), m, b)]
        shapes += [w, b, m, a]
        extra = rng.choice(["none", "permute", "transpose", "einsum", "literal"])
        t = unknown(f"t{layer}")
        if extra == "permute":
            steps.append(step(t, sh.Permute("...|...->i => ...|...->i"), a))
        elif extra == "transpose":
            u = unknown(f"u{layer}")
            steps += [step(u, sh.TransposeIO(), a), step(t, sh.TransposeIO(), u)]
            shapes.append(u)
        elif extra == "einsum":
            g = sh.Shape.make(batch_dims=[], input_dims=[], debug_name=f"g{layer}")
            steps.append(step(t, sh.Einsum("...|...->...i; j => ...|...->...i"), a, g))
            shapes.append(g)
        elif extra == "literal":
            lit = unknown(f"lit{layer}")
            steps += [sh.UpdateStep(lit, sh.Terminal(sh.ConstantFill(rng.choice([1, size])))),
                      step(t, sh.PointwiseBin(), a, lit)]
            shapes.append(lit)
        else:
            steps.append(step(t, sh.PointwiseUn(), a))
        shapes.append(t)
        h = t
    return shapes, steps


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6))
def test_same_constraints_in_any_order_give_the_same_solution(seed):
    results = []
    for attempt in range(3):
        sh.reset_state()
        rng = random.Random(seed)
        shapes, steps = _network(rng)
        order = list(steps)
        random.Random(seed * 7 + attempt).shuffle(order)
        for s in order:
            sh.propagate_shapes(s)
        sh.finish_inference()
        results.append([str(s) for s in shapes])
    assert results[0] == results[1] == results[2]
