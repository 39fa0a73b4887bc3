"""The seeds' own forms, run end to end (issue 23): each test follows a sentence of a seed
and checks the values against NumPy or the message a user gets."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

import einjit as ej
from einjit import nn, train
from einjit import shape as sh
from einjit.ir import assignments as asg
from einjit.ir import low_level as ll

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def run_code(code: ej.Code, *names: str) -> list[np.ndarray]:
    """Compile and run `%cd` code once; the values of the tensors it declared."""
    for name in names:
        code[name].hosted()
    train.run(train.to_routine(code))
    return [code[name].value.numpy() for name in names]


# ------------------------------------------------------------------ seed 004: %cd forms


def test_a_declaration_with_a_constant_right_hand_side_compiles():
    """Seed 004 (inline declarations) with seed 003 (closing at jit time): the declared
    tensor meets the number, so it has the number's shape, one output axis of dimension 1."""
    code = ej.cd('"z" =: 2.0')
    (z,) = run_code(code, "z")
    np.testing.assert_array_equal(z, [2.0])
    assert code.z.dims == (1,) and code.z.label == ["z"]


def test_a_declared_constant_takes_a_larger_shape_from_its_uses():
    x = ej.ndarray(np.array([1.0, 2.0, 3.0]), label="x")
    z, y = run_code(ej.cd('"z" =: 2.0; "y" =: z + x', x=x), "z", "y")
    np.testing.assert_array_equal(z, [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(y, [3.0, 4.0, 5.0])


def test_a_labelled_number_labels_the_declared_tensor():
    code = ej.cd("\"z\" =: 'q' 2.0")
    run_code(code, "z")
    assert str(code.z.shape) == "q=1"


def test_shape_messages_never_ask_for_an_internal_call():
    unsolved = sh.Shape.make(debug_name="open")
    with pytest.raises(ej.ShapeError) as err:
        sh.to_dims(unsolved)
    assert "finish_inference" not in str(err.value) and "compiled" in str(err.value)
    w = ej.param("w")
    with pytest.raises(ej.EinjitError) as terr:
        _ = w.value.dims
    assert "finish_inference" not in str(terr.value) and "compile a routine using it" in str(terr.value)


def _relu_gate(acc, x):
    return np.where(acc > 0, x, 0.0)


def test_relu_gate_accumulation_pointwise():
    """`=?/` accumulates with the relu gate `lhs > 0 ? rhs : 0`; `=:?/` starts from its
    neutral element 1 (`relu_gate(1, x) == x`)."""
    v = np.array([1.0, -2.0, 3.0, 0.5])
    w = np.array([4.0, 5.0, -6.0, 7.0])
    vt, wt = ej.ndarray(v, label="v"), ej.ndarray(w, label="w")
    r, s = run_code(ej.cd('"r" =:?/ v * w; "s" =: v; s =?/ w', v=vt, w=wt), "r", "s")
    np.testing.assert_array_equal(r, v * w)
    np.testing.assert_array_equal(s, _relu_gate(v, w))


def test_relu_gate_accumulation_reduced():
    v = np.array([1.0, -2.0, 3.0, 0.5])
    w = np.array([4.0, 5.0, -6.0, 7.0])
    vt, wt = ej.ndarray(v, label="v"), ej.ndarray(w, label="w")
    (s,) = run_code(ej.cd('"s" =:?/ v * w ~logic:"i;i=>0"', v=vt, w=wt), "s")
    np.testing.assert_array_equal(s, [functools.reduce(_relu_gate, v * w, 1.0)])
    positive = np.array([2.0, 3.0, 0.5])
    pt = ej.ndarray(positive, label="p")
    (t,) = run_code(ej.cd('"t" =:?/ p ~logic:"i=>0"', p=pt), "t")
    np.testing.assert_array_equal(t, [0.5])   # every step passes: the last value


def test_prefix_relu_operator():
    v = np.array([1.0, -2.0, 3.0, -0.5])
    vt = ej.ndarray(v, label="v")
    r, q = run_code(ej.cd('"r" =: !/ v; "q" =: !/ (v * 2.0) + 1.0', v=vt), "r", "q")
    np.testing.assert_array_equal(r, np.maximum(v, 0.0))
    np.testing.assert_array_equal(q, np.maximum(2.0 * v, 0.0) + 1.0)


def test_relu_gate_accumulation_prints_in_the_seeds_spelling():
    v = ej.ndarray(np.ones(2), label="v")
    assert "=:?/ v" in str(ej.cd('"r" =:?/ v', v=v))


# ------------------------------------------------------------------ seed 004: labels


def _nested_model(x: ej.Tensor) -> ej.Tensor:
    """The model of the checkpoint fixture: `outer(x, label="A")` calling
    `inner(h, label="inner")`, each declaring a parameter; fresh definitions per call."""

    @ej.op
    def inner(x):
        return ej.param("w", values=[2.0]) * x

    @ej.op
    def outer(x):
        return inner(x, label="inner") + ej.param("b", values=[1.0])

    return outer(x, label="A")


def test_labels_start_with_the_declaring_string_and_end_with_the_configuration():
    """Seed 004: "the first element of the label of the created tensor is the string that
    introduced it"; a `~config` label is appended (`TDSL.param ~more_label:config.label`).
    The display (name, checkpoint key) keeps the scope first."""
    y = _nested_model(ej.ndarray(np.array([3.0]), label="x"))
    params = {p.label_str: p for p in y.params()}
    assert sorted(params) == ["A.b", "A.inner.w"]
    assert params["A.inner.w"].label == ["w", "A", "inner"]
    assert params["A.b"].label == ["b", "A"]
    assert params["A.inner.w"].value_tn.label == ["A", "inner", "w"]


def test_a_checkpoint_written_before_the_label_order_changed_still_loads():
    """`scoped_params_before_issue23.safetensors` was written by einjit before labels
    followed seed 004 (label lists scope-first): `A.inner.w` = 5, `A.b` = -1.5."""
    with ej.default_precision("single"):
        y = _nested_model(ej.ndarray(np.array([3.0], dtype=np.float32), label="x"))
    train.init_params(y)
    ej.load(y, FIXTURES / "scoped_params_before_issue23.safetensors")
    np.testing.assert_array_equal(train.forward_once(y), [5.0 * 3.0 - 1.5])


def test_a_bound_local_is_labelled_name_first_too():
    @ej.op
    def block(x):
        hidden = ej.relu(x)
        return hidden * ej.param("w", values=[1.0])

    out = block(ej.ndarray(np.ones(2), label="x"), label="blk")
    hidden = next(t for t in out.subtree() if t.label_str == "blk.hidden")
    assert hidden.label == ["hidden", "blk"]


# ------------------------------------------------------------------ seed 003: scalars are 1-D


def test_reductions_into_one_cell_are_one_dimensional():
    x = ej.ndarray(np.arange(6.0).reshape(2, 3), label="x")
    total, avg, first = ej.sum(x), ej.mean(x), ej.einsum("i => 0", ej.ndarray(np.array([1.0, 2.0]), label="v"))
    np.testing.assert_array_equal(train.forward_once(total), [15.0])
    np.testing.assert_array_equal(train.forward_once(avg), [2.5])
    np.testing.assert_array_equal(train.forward_once(first), [3.0])
    assert total.dims == avg.dims == first.dims == (1,)


def test_a_parameter_nothing_constrains_is_one_dimensional():
    p = ej.param("p")
    y = p * 2.0
    train.init_params(y)
    got = train.forward_once(y)
    assert p.dims == y.dims == (1,)
    np.testing.assert_allclose(got, 2.0 * p.value.numpy())


def test_a_reduction_result_does_not_give_its_argument_an_axis():
    """The rest of a reduction's argument (`...` in `...->...c => ...->...`) closes to no axes
    even though the reduced result's output row alone would close to one."""
    x = ej.input("x", batch_dims=[5], output_dims=[3])
    logits = nn.Linear(3, 4, label="fc")(x)
    loss = nn.cross_entropy(logits, ej.input("y", batch_dims=[5], output_dims=[4]))
    train.init_params(loss)
    train.forward_once(loss)
    assert logits.dims == (5, 4) and loss.dims == (1,)


# ------------------------------------------------------------------ fixed indices are lower bounds


def test_a_fixed_index_written_then_read_further_grows_the_axis():
    """`"i=>i0"` says the axis has at least one cell; the same tensor read through `"i2=>i"`
    needs three: the axis has three, the cells nothing writes are zero."""
    a = np.array([5.0, 7.0])
    y = ej.einsum("i => i0", ej.ndarray(a, label="a"))
    z = ej.einsum("i2 => i", y)
    y.hosted()
    np.testing.assert_array_equal(train.forward_once(z), [0.0, 0.0])
    assert y.dims == (2, 3)
    np.testing.assert_array_equal(y.value.numpy(), [[5.0, 0.0, 0.0], [7.0, 0.0, 0.0]])


def test_fixed_indices_in_cd_logic_grow_a_declared_tensor():
    a, b = np.array([5.0, 7.0]), np.array([1.0, 2.0])
    at, bt = ej.ndarray(a, label="a"), ej.ndarray(b, label="b")
    code = ej.cd('"y" =: a ~logic:"i=>i0"; y =: b ~logic:"i=>i2"; "z" =: y ~logic:"i1=>i"', a=at, b=bt)
    y, z = run_code(code, "y", "z")
    np.testing.assert_array_equal(y, [[5.0, 0.0, 1.0], [7.0, 0.0, 2.0]])
    np.testing.assert_array_equal(z, [0.0, 0.0])


def test_a_fixed_index_never_reads_a_broadcast_axis():
    """Reading cell 2 of an axis that has one cell is out of range, not a broadcast read of
    cell 0."""
    x = ej.ndarray(np.array([[1.0], [2.0]]), label="x")
    with pytest.raises(ej.ShapeError, match="fixed index 2 is out of range"):
        train.forward_once(ej.einsum("i2 => i", x))


# ------------------------------------------------------------------ seed 003: File_mapped


def _values_file(tmp_path, values: np.ndarray) -> str:
    path = tmp_path / "values.bin"
    values.tofile(path)
    return str(path)


def test_file_mapped_values_and_shape_from_the_file_length(tmp_path):
    vals = np.arange(6.0) * 1.5
    path = _values_file(tmp_path, vals)
    t = ej.file_mapped(path, label="w")
    np.testing.assert_array_equal(train.forward_once(t * 2.0), vals * 2.0)
    assert t.dims == (6,) and isinstance(t.value_tn.array, np.memmap)
    m = ej.file_mapped(path, label="m", output_dims=[2], input_dims=[3])
    x = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(train.forward_once(m @ ej.ndarray(x, label="x")), vals.reshape(2, 3) @ x)


def test_file_mapped_checks_the_file_size(tmp_path):
    path = _values_file(tmp_path, np.arange(6.0))
    with pytest.raises(ej.ShapeError, match=r'"[^"]*values\.bin" has 48 bytes, but dims \[4\] of double '
                                            r"\(8 bytes each\) need 32 bytes"):
        ej.file_mapped(path, output_dims=[4])
    with pytest.raises(ej.ShapeError, match=r"values\.bin\" of 48 bytes = 6 elements of 8 bytes"):
        ej.file_mapped(path, input_dims=[4])
    with pytest.raises(ej.TensorError, match=r'cannot open "[^"]*missing\.bin"'):
        ej.file_mapped(str(tmp_path / "missing.bin"))


# ------------------------------------------------------------------ small points


def test_neutral_initialization_of_plus_accumulation_is_zero_out():
    """As in OCANNL, `=:+` that does not write every cell once starts with the node's
    `Zero_out`."""
    a = ej.ndarray(np.ones((2, 3)), label="a", input_axes=1)
    b = ej.ndarray(np.ones(3), label="b")
    code = ej.cd('"c" =:+ a * b ~logic:"@"', a=a, b=b)
    sh.finish_inference()
    lowered = list(ll.flatten(asg.to_low_level(code.asgns)))
    assert isinstance(lowered[0], ll.ZeroOut) and lowered[0].tn is code.c.value_tn
    (c,) = run_code(code, "c")
    np.testing.assert_array_equal(c, [3.0, 3.0])


def test_reading_an_on_device_tensor_names_the_mode():
    x = ej.ndarray(np.array([1.0, 2.0]), label="x")
    y = (x * 2.0).on_device()
    np.testing.assert_array_equal(train.forward_once(y + 1.0), [3.0, 5.0])
    with pytest.raises(ej.TensorError, match=r"memory mode is On_device \(provenance \d+: on device: "
                                             r"tensor.on_device\(\)\).*call .hosted\(\)"):
        y.value.numpy()
