"""Shape-inference semantics that follow OCANNL (issue 14 item 1): fixed indices bound their
axis from below and give the result a dimension-1 axis, and a strided read of a convolution's
result does not decide the convolution's size."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def test_fixed_index_on_the_result_keeps_a_dimension_one_axis():
    xs = np.array([1.0, 2.0, 4.0])
    x = ej.ndarray(xs, label="x")
    total = ej.sum(x, "i => 0")
    y = x - total
    np.testing.assert_array_equal(train.forward_once(y), xs - 7.0)
    assert str(total.shape) == "1"


def test_keepdims_reduction_with_a_batch_row():
    xs = np.arange(6.0).reshape(2, 3)
    x = ej.ndarray(xs, label="x", batch_axes=1)
    row_sums = ej.sum(x, "...|i => ...|0")
    y = x - row_sums
    np.testing.assert_array_equal(train.forward_once(y), xs - xs.sum(axis=1, keepdims=True))
    assert str(row_sums.shape) == "2|1"


def test_a_fixed_index_grows_an_unknown_axis_to_fit():
    x = ej.param("x")
    y = ej.einsum("i2 => i", x) + ej.ndarray(np.zeros(4), label="z")
    got = train.forward_once(y)
    assert str(x.shape) == "4,3"
    np.testing.assert_array_equal(got, x.value.numpy()[:, 2])


def test_a_fixed_index_on_the_result_past_zero_sizes_the_axis():
    x = ej.ndarray(np.array([1.0, 2.0]), label="x")
    y = ej.sum(x, "i, => 2,")
    np.testing.assert_array_equal(train.forward_once(y), [0.0, 0.0, 3.0])


def test_a_fixed_index_out_of_a_known_axis_is_still_an_error():
    x = ej.ndarray(np.array([1.0, 2.0]), label="x")
    with pytest.raises(ej.ShapeError, match="fixed index 5 is out of range"):
        train.forward_once(ej.einsum("5, => ", x))


@pytest.mark.parametrize("n, expect", [(8, 3), (9, 4)])
def test_strided_read_after_a_convolution_takes_the_convolutions_size(n, expect):
    """`2*p+0` after a valid convolution: p is ceil(conv/2); with p known from elsewhere, the
    convolution's extent comes from its own input, not from the strided read."""
    img, ker = np.arange(float(n)), np.array([1.0, -1.0, 2.0])
    conv = ej.einsum("o+k, ;k, => o,", ej.ndarray(img, label="img"), ej.ndarray(ker, label="k"))
    pooled = ej.einsum("2*p+0, => p,", conv)
    y = pooled + ej.ndarray(np.zeros(expect), label="z")
    ref = np.array([img[o:o + 3] @ ker for o in range(n - 2)])
    np.testing.assert_allclose(train.forward_once(y), ref[::2])
    assert str(conv.shape) == str(n - 2)


def test_strided_read_alone_sizes_an_unknown_argument_minimally():
    x = ej.param("x")
    y = ej.einsum("2*p+1, => p,", x) + ej.ndarray(np.zeros(3), label="z")
    train.forward_once(y)
    assert str(x.shape) == "6"


def test_literal_label_prefixes_label_the_axes_they_meet():
    """Seed 004: in `("hey" * 'q' 2.0) + 'p' 1.0` (einjit spells the product `@`), `hey`'s input
    axis is labelled q and its output axis p."""
    hey = ej.param("hey")
    y = (hey @ ej.number(2.0, label="q")) + ej.number(1.0, label="p")
    train.init_params(y)
    got = train.forward_once(y)
    assert str(hey.shape) == "q=1->p=1"
    assert str(y.shape) == "p=1"
    np.testing.assert_allclose(got, 2.0 * hey.value.numpy().ravel() + 1.0)


def test_a_parameter_on_both_sides_of_a_pointwise_product_gets_both_rows():
    w = ej.param("w")
    y, x = ej.ndarray(np.arange(3.0), label="y"), ej.ndarray(np.arange(4.0), label="x")
    c, d = w * y, w.T * x
    loss = ej.sum(c, "...|...->... => 0") + ej.sum(d, "...|...->... => 0")
    train.init_params(loss)
    got = train.forward_once(loss)
    assert (str(w.shape), str(c.shape), str(d.shape)) == ("4->3", "4->3", "3->4")
    wv = w.value.numpy()  # layout: output (3) then input (4)
    np.testing.assert_allclose(got, [(wv * np.arange(3.0)[:, None]).sum() + (wv * np.arange(4.0)[None, :]).sum()])


def test_a_parameter_on_both_sides_of_a_matrix_product():
    w = ej.param("w")
    a = w @ ej.ndarray(np.ones(3), label="y")
    b = w.T @ ej.ndarray(np.ones(4), label="x")
    train.forward_once(ej.sum(a, "i, => ") + ej.sum(b, "i, => "))
    assert str(w.shape) == "3->4"


# How rows that nothing else constrains close, as OCANNL's `Row.close_row_terminal` and the
# stages of its `shape_inference.md` close them: a leaf's row takes its least upper bound (stage
# 3), else what its `Total_elems` constraint needs (stage 5: no axes when that satisfies it,
# else one axis with the remaining elements), else no further axes (`Bounds_row {lub = None;
# constr = Unconstrained}` → `no_further_axes`). A literal is made with one output axis of
# dimension 1 (OCANNL's `number` passes `~output_dims:[1]`), so it is the literal that brings
# the dimension-1 axis to whatever it meets.


def test_a_parameter_meeting_a_literal_takes_its_dimension_one_axis():
    h = ej.param("h")
    z = h + ej.number(1.0)
    train.init_params(z)
    got = train.forward_once(z)
    assert (str(h.shape), str(z.shape)) == ("1", "1")
    np.testing.assert_allclose(got, h.value.numpy().ravel() + 1.0)


def test_parameters_that_nothing_constrains_close_to_one_output_axis():
    """Both leaves of `p * q` have no LUB and no element count. Later OCANNL closes their rows
    to no further axes (rank 0); seed 003 says a fully inferred shape has non-empty output
    axes, scalars being 1-D, and einjit follows the seed: one output axis of dimension 1."""
    p, q = ej.param("p"), ej.param("q")
    r = p * q
    train.init_params(r)
    got = train.forward_once(r)
    assert p.dims == q.dims == r.dims == (1,)
    assert str(p.shape) == str(r.shape) == "1"
    np.testing.assert_allclose(got, p.value.numpy() * q.value.numpy())


def test_an_element_count_gives_the_open_output_row_its_remaining_axis():
    """Stage 5 of OCANNL: six values with a 2-wide input row leave one output axis of 3, even
    though the product's result row (above the parameter's) could otherwise close first."""
    w = ej.param("w", values=np.arange(6.0), input_dims=[2])
    y = w @ ej.ndarray(np.array([1.0, 10.0]), label="x")
    got = train.forward_once(y)
    assert (str(w.shape), str(y.shape)) == ("2->3", "3")
    np.testing.assert_allclose(got, np.arange(6.0).reshape(3, 2) @ np.array([1.0, 10.0]))


def test_an_element_count_that_no_axes_satisfy_adds_none():
    """One value with a 1-wide input row: no further axes satisfy the count, so the output row
    takes only what it meets (here the literal's dimension-1 axis, its LUB)."""
    v = ej.param("v", values=[5.0], input_dims=[1])
    alone = ej.param("u", values=[5.0], input_dims=[1])
    y = v * 2.0
    np.testing.assert_allclose(train.forward_once(y), [[10.0]])
    assert str(v.shape) == "1->1"
    train.forward_once(alone * alone)
    assert str(alone.shape) == "1->"
