"""Writable tensors, inputs and scalars, precision names and NumPy interop, against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.backends.cc import toolchain as cc
from einjit.ir import ops

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield
W = RNG.standard_normal((3, 4))
B = RNG.standard_normal(3)


def affine(batch: int, prec="double"):
    x = ej.input("x", batch_dims=[batch], output_dims=[4], prec=prec)
    w = ej.param("w", values=W, output_dims=[3], input_dims=[4], prec=prec)
    b = ej.param("b", values=B, prec=prec)
    y = ej.add(b, w @ x, label="y")
    return x, w, b, y


def test_params_created_with_values_hold_them_at_creation():
    _, w, b, _ = affine(2)
    np.testing.assert_array_equal(w.numpy(), W)
    np.testing.assert_array_equal(b.numpy(), B)


def test_set_values_then_forward_gives_the_new_result_without_recompiling():
    x, w, b, y = affine(5)
    routine = train.to_routine(train.forward(y))
    compiles = cc.stats.compiler_invocations
    for _ in range(3):
        data = RNG.standard_normal((5, 4))
        x.set_values(data)
        routine()
        np.testing.assert_allclose(y.numpy(), data @ W.T + B, rtol=0, atol=1e-12)
    new_w = RNG.standard_normal((3, 4))
    w.value[...] = new_w
    routine()
    np.testing.assert_allclose(y.numpy(), data @ new_w.T + B, rtol=0, atol=1e-12)
    assert cc.stats.compiler_invocations == compiles


def test_scalar_changes_between_steps_without_recompiling():
    p = ej.param("p", values=[3.0])
    lr = ej.scalar(0.5, label="lr")
    loss = ej.mul(p, p, label="loss")
    train.init_params(loss)
    step = train.to_routine([train.grad_update(loss), train.sgd_update(loss, lr)])
    compiles = cc.stats.compiler_invocations
    want = 3.0
    for rate in (0.5, 0.1, 0.25):
        lr.set_values(rate)
        step()
        want -= rate * 2 * want
        assert p.numpy()[0] == pytest.approx(want, abs=1e-15)
    assert cc.stats.compiler_invocations == compiles
    assert float(lr.numpy()[0]) == 0.25


def test_returned_arrays_are_read_only_copies():
    """A write into a returned array would change nothing: it raises instead (issue 24)."""
    x, w, _, y = affine(2)
    for write in (lambda: w.numpy().__setitem__(Ellipsis, 0), lambda: w.value.numpy().__setitem__((0, 0), 5),
                  lambda: np.asarray(w).__setitem__((1, 1), 7), lambda: w.value[0].__setitem__(Ellipsis, 9)):
        with pytest.raises(ValueError, match="read-only"):
            write()
    np.testing.assert_array_equal(w.numpy(), W)
    mine = w.numpy().copy()
    mine[...] = 0
    np.testing.assert_array_equal(w.numpy(), W)


def test_partial_writes_and_assign():
    x = ej.input("xs", batch_dims=[3], output_dims=[2], prec="single")
    x.value.assign(np.ones((3, 2)))
    x.value[1] = [5, 6]
    x.value[2, 0] = -1
    x.value[np.array([0])] = [[7, 8]]
    np.testing.assert_array_equal(x.numpy(), np.array([[7, 8], [5, 6], [-1, 1]], dtype=np.float32))
    assert x.numpy().dtype == np.float32
    x.set_values(2)
    np.testing.assert_array_equal(x.numpy(), np.full((3, 2), 2, np.float32))


def test_size_one_axes_may_be_left_out():
    y = ej.input("labels", batch_dims=[4], prec="double")
    assert y.dims == (4, 1)
    y.set_values(np.arange(4))
    np.testing.assert_array_equal(y.numpy(), np.arange(4.0).reshape(4, 1))


def test_wrong_shape_names_the_tensor_and_both_shapes():
    x, *_ = affine(5)
    before = x.numpy()
    with pytest.raises(ej.TensorError, match=r"'x'.*\(5, 4\).*\(4, 5\)"):
        x.set_values(np.zeros((4, 5)))
    np.testing.assert_array_equal(x.numpy(), before)


@pytest.mark.parametrize("bad,kind", [(np.zeros((5, 4), np.complex128), "complex"),
                                      (np.full((5, 4), "a"), "string"),
                                      (np.zeros((5, 4), object), "object"),
                                      (np.zeros((5, 4), "datetime64[s]"), "datetime")])
def test_non_numeric_values_are_refused(bad, kind):
    x, *_ = affine(5)
    with pytest.raises(ej.TensorError, match=f"'x'.*{kind}"):
        x.set_values(bad)
    if kind == "object":  # a literal may be an object array of real numbers, checked element by element
        return
    with pytest.raises(ej.TensorError, match=kind):
        ej.ndarray(bad)


def test_lossy_kind_change_is_refused():
    counts = ej.input("counts", output_dims=[3], prec="int32")
    with pytest.raises(ej.TensorError, match=r"'counts'.*float64.*astype"):
        counts.set_values(np.array([1.5, 2.0, 3.0]))
    counts.set_values(np.array([1, 2, 3], np.int64))
    np.testing.assert_array_equal(counts.numpy(), [1, 2, 3])


def test_constants_are_not_writable():
    c = ej.ndarray(np.zeros(3), label="c")
    with pytest.raises(ej.TensorError, match="'c'.*constant.*ej.input"):
        c.set_values(np.ones(3))


def test_unset_parameter_says_what_to_do():
    p = ej.param("q", output_dims=[2])
    with pytest.raises(ej.TensorError, match="'q'.*init_params"):
        p.numpy()


@pytest.mark.parametrize("name,dtype", [("float16", np.float16), ("half", np.float16), ("float32", np.float32),
                                        ("single", np.float32), ("float64", np.float64), ("double", np.float64),
                                        (np.float32, np.float32), (np.dtype("float64"), np.float64)])
def test_precision_names_and_dtypes_work_everywhere(name, dtype):
    assert ops.as_prec(name).dtype == dtype
    with ej.default_precision(name):
        assert ej.param("p", values=[1.0]).dtype == dtype
    assert ej.ndarray([1.0, 2.0], prec=name).dtype == dtype
    assert ej.input("i", output_dims=[2], prec=name).dtype == dtype


def test_unknown_precisions_are_refused_clearly():
    with pytest.raises(ej.EinjitError, match="'quad'.*float64"):
        ej.ndarray([1.0], prec="quad")
    with pytest.raises(ops.PrecisionError, match="uint16"):
        ops.as_prec(np.uint16)  # bf16's storage dtype is not a precision of its own


@pytest.mark.parametrize("name", ["bf16", "bfloat16", "BF16"])
def test_bf16_values_are_read_and_written_as_float32(name):
    """bf16 cells hold bit patterns; the host sees float32 values, rounded to nearest even
    when written (1 + 2**-8 is a tie: down to 1; 1 + 3 * 2**-8 up to 1 + 2**-6; 259 up to 260)."""
    assert ops.as_prec(name) is ops.bf16
    t = ej.input("b", output_dims=[4], prec=name)
    assert t.dtype == np.float32 and t.value_tn.prec is ops.bf16
    t.set_values(np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, -3.0, 259.0], np.float32))
    np.testing.assert_array_equal(t.numpy(), np.array([1.0, 1 + 2.0**-6, -3.0, 260.0], np.float32))
    assert t.value_tn.array.dtype == np.uint16 and t.value_tn.array[2] == 0xC040
    t.value[1] = 2.5
    assert t.numpy()[1] == 2.5 and t.value[1:3].tolist() == [2.5, -3.0]
    with pytest.raises(ej.EinjitError, match="bf16.*numpy"):
        np.from_dlpack(t)
    c = ej.ndarray([0.1, 0.2], prec="bf16")
    np.testing.assert_array_equal(c.numpy(), np.array([0.10009765625, 0.2001953125], np.float32))


def test_bf16_parameters_are_initialized_rounded():
    with ej.default_precision("bf16"):
        p = ej.param("p", output_dims=[3], values=[0.1, 1.0, -7.3])
    train.init_params(p)
    np.testing.assert_array_equal(p.numpy(), np.array([0.10009765625, 1.0, -7.3125], np.float32))


def test_numpy_arrays_keep_their_float_dtype():
    assert ej.ndarray(np.ones(3, np.float64)).dtype == np.float64
    assert ej.ndarray(np.ones(3, np.float16)).dtype == np.float16
    assert ej.ndarray(np.ones(3, np.float32)).dtype == np.float32


def test_numpy_interop():
    x, w, b, y = affine(2)
    data = RNG.standard_normal((2, 4))
    x.set_values(data)
    np.testing.assert_array_equal(np.asarray(x), data)
    np.testing.assert_array_equal(np.from_dlpack(x), data)
    assert np.asarray(w, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError, match="'w'.*copy.*from_dlpack"):
        np.asarray(w, copy=False)
    live = np.from_dlpack(x)
    live[0, 0] = 42.0
    assert x.numpy()[0, 0] == 42.0
    x.set_values(data)
    assert x.dtype == np.float64 and x.dims == (2, 4)
    left, right = np.full(4, 2.0) * x, x * np.full(4, 2.0)
    assert isinstance(left, ej.Tensor) and isinstance(right, ej.Tensor)
    routine = train.to_routine([train.forward(left), train.forward(right)])
    routine()
    np.testing.assert_allclose(left.numpy(), 2 * data, rtol=0, atol=0)
    np.testing.assert_allclose(right.numpy(), 2 * data, rtol=0, atol=0)


def test_shape_compares_and_indexes_like_a_numpy_shape():
    x = ej.input("x", batch_dims=[5], output_dims=[3])
    assert x.shape == (5, 3) and x.shape != (3, 5) and tuple(x.shape) == (5, 3)
    assert len(x.shape) == 2 and x.shape[-1] == 3 and str(x.shape) == "5|3"
    w = ej.param("w", output_dims=[4])
    y = w @ x
    assert y.shape != (5, 4)                      # not inferred yet: never equal to a guess
    with pytest.raises(ej.ShapeError, match="not fully inferred"):
        len(y.shape)
    train.to_routine(train.forward(y))
    assert y.shape == (5, 4) and w.shape == (4, 3) and list(y.shape) == list(y.dims)
    assert {y.shape: 1}[y.shape] == 1            # still hashable by identity
