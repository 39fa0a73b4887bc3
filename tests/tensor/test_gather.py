"""`ej.take`: rows of a table at integer ids, against NumPy (values, `np.add.at` gradients),
PyTorch's `F.embedding` when installed, and the reference interpreter; ids out of range."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.ir import assignments as asg
from einjit.ir import interpret
from einjit.ir.optimize import optimize_proc
from einjit.tensor.gather import check_ids

V, D, B, T = 7, 5, 2, 3


def build(ids_np, *, prec="double", seed=0):
    """`loss = sum(take(table, ids) * w)`: the table's gradient is `w` scatter-added at the ids."""
    rng = np.random.default_rng(seed)
    tab = rng.standard_normal((D, V))
    with ej.default_precision(prec):
        table = ej.param("table", values=tab.ravel(), output_dims=[D], input_dims=[V])
        ids = ej.input("ids", batch_dims=list(ids_np.shape), prec="int32", values=ids_np[..., None])
        rows = ej.take(table, ids, label="rows")
        w = ej.ndarray(rng.standard_normal(ids_np.shape + (D,)), batch_axes=ids_np.ndim, label="w")
        loss = ej.sum(rows * w, "...|...->... => 0", label="loss")
    return table, ids, rows, w, loss


def numpy_reference(table, ids_np, w):
    tab = table.value.numpy().T            # (V, D): row v is table[:, v]
    clamped = np.clip(ids_np, 0, V - 1)
    grad = np.zeros_like(tab)
    np.add.at(grad, clamped, w)
    return tab[clamped], (tab[clamped] * w).sum(), grad.T


@pytest.mark.parametrize("prec,tol", [("double", 1e-12), ("single", 1e-5)])
def test_values_and_scatter_add_gradient_match_numpy(prec, tol):
    ids_np = np.array([[3, 0, 3], [6, 3, 1]], dtype=np.int32)  # id 3 three times
    table, ids, rows, w, loss = build(ids_np, prec=prec)
    rows.hosted()
    train.init_params(loss)
    train.to_routine(train.grad_update(loss), name="take_step")()
    want_rows, want_loss, want_grad = numpy_reference(table, ids_np, w.value.numpy())
    assert rows.value.numpy().shape == (B, T, D)
    np.testing.assert_allclose(rows.value.numpy(), want_rows, rtol=tol, atol=tol)
    np.testing.assert_allclose(loss.value.numpy()[0], want_loss, rtol=tol, atol=tol)
    np.testing.assert_allclose(table.grad.numpy(), want_grad, rtol=tol, atol=tol)
    assert set(np.flatnonzero(np.abs(table.grad.numpy()).sum(axis=0))) == {0, 1, 3, 6}


def test_the_same_routine_reads_new_ids_without_recompiling():
    ids_np = np.zeros((B, T), dtype=np.int32)
    table, ids, rows, w, loss = build(ids_np)
    train.init_params(loss)
    step = train.to_routine(train.grad_update(loss), name="take_rerun")
    for new in (np.array([[1, 2, 3], [4, 5, 6]]), np.array([[6, 6, 6], [0, 0, 0]])):
        ids.set_values(new.astype(np.int32)[..., None])
        step()
        want_rows, want_loss, want_grad = numpy_reference(table, new, w.value.numpy())
        np.testing.assert_allclose(loss.value.numpy()[0], want_loss, rtol=1e-12)
        np.testing.assert_allclose(table.grad.numpy(), want_grad, rtol=1e-12, atol=1e-15)


def test_ids_out_of_range_are_clamped_never_read_out_of_bounds():
    ids_np = np.array([[-5, 0, V], [V + 100, 2, -1]], dtype=np.int32)
    table, ids, rows, w, loss = build(ids_np)
    rows.hosted()
    train.init_params(loss)
    train.to_routine(train.grad_update(loss), name="take_clamped")()
    want_rows, want_loss, want_grad = numpy_reference(table, ids_np, w.value.numpy())
    np.testing.assert_allclose(rows.value.numpy(), want_rows, rtol=1e-12)
    np.testing.assert_allclose(table.grad.numpy(), want_grad, rtol=1e-12, atol=1e-15)


def test_c_backend_equals_the_interpreter_unoptimized_and_optimized():
    ids_np = np.array([[2, 2, 9], [0, -1, 4]], dtype=np.int32)
    table, ids, rows, w, loss = build(ids_np)
    train.init_params(loss)
    code = train.grad_update(loss)
    llc = asg.to_low_level(code)
    inputs = {table.value_tn: table.value.numpy(), ids.value_tn: ids_np[..., None], w.value_tn: w.value.numpy()}
    ref = interpret.run(llc, {k: np.array(v) for k, v in inputs.items()})
    opt = interpret.run(optimize_proc(llc, name="take_interp").llc, {k: np.array(v) for k, v in inputs.items()})
    train.to_routine(code, name="take_cc")()
    want_rows, want_loss, want_grad = numpy_reference(table, ids_np, w.value.numpy())
    for arrays in (ref, opt):
        np.testing.assert_allclose(arrays[loss.value_tn][0], want_loss, rtol=1e-12)
        np.testing.assert_allclose(arrays[table.grad_tn], want_grad, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(table.grad.numpy(), ref[table.grad_tn], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(loss.value.numpy(), ref[loss.value_tn], rtol=1e-12)


def test_matches_torch_embedding_values_and_gradients():
    torch = pytest.importorskip("torch")
    ids_np = np.array([[1, 4, 1], [0, 6, 1]], dtype=np.int32)
    table, ids, rows, w, loss = build(ids_np)
    rows.hosted()
    train.init_params(loss)
    train.to_routine(train.grad_update(loss), name="take_torch")()
    weight = torch.tensor(table.value.numpy().T.copy(), requires_grad=True)
    out = torch.nn.functional.embedding(torch.tensor(ids_np, dtype=torch.long), weight)
    (out * torch.tensor(w.value.numpy())).sum().backward()
    np.testing.assert_allclose(rows.value.numpy(), out.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(table.grad.numpy(), weight.grad.numpy().T, rtol=1e-12, atol=1e-15)


def test_float_ids_are_refused():
    table = ej.param("table", output_dims=[D], input_dims=[V])
    ids = ej.input("ids", batch_dims=[B], prec="single")
    with pytest.raises(ej.TensorError, match="ids .*integer precision"):
        ej.take(table, ids)


def test_one_hot_rows_as_ids_are_a_shape_error():
    table = ej.param("table", output_dims=[D], input_dims=[V])
    ids = ej.input("ids", batch_dims=[B], output_dims=[V], prec="int32")
    rows = ej.take(table, ids)
    with pytest.raises(ej.ShapeError, match="one id per batch cell"):
        train.forward_once(rows)


def test_check_ids_names_the_bad_id_and_its_position():
    np.testing.assert_array_equal(check_ids([[1, 2], [0, 6]], V, "embedding"), [[1, 2], [0, 6]])
    with pytest.raises(ej.TensorError, match=r"embedding: id 7 at index \(1, 0\) is outside 0..6"):
        check_ids([[1, 2], [7, 0]], V, "embedding")
    with pytest.raises(ej.TensorError, match="must be integers"):
        check_ids([0.5], V, "embedding")


def test_a_scheduled_contraction_over_gathered_rows_matches_numpy():
    """Rows gathered then multiplied by a matrix big enough for the loop scheduler (blocking,
    packing): the run-time index survives substitution into packed panels."""
    n, rows, d, o = 96, 50, 64, 80
    rng = np.random.default_rng(4)
    with ej.default_precision("double"):
        table = ej.param("table", values=rng.standard_normal(d * rows), output_dims=[d], input_dims=[rows])
        w = ej.param("W", values=rng.standard_normal(o * d), output_dims=[o], input_dims=[d])
        ids_np = rng.integers(0, rows, n).astype(np.int32)
        ids = ej.input("ids", batch_dims=[n], prec="int32", values=ids_np[:, None])
        y = (w @ ej.take(table, ids)).hosted()
        loss = ej.sum(y * y, "...|...->... => 0")
    train.to_routine(train.grad_update(loss), name="gathered_matmul")()
    x = table.value.numpy()[:, ids_np].T
    np.testing.assert_allclose(y.value.numpy(), x @ w.value.numpy().T, rtol=1e-12)
    grad = np.zeros((rows, d))
    np.add.at(grad, ids_np, 2 * y.value.numpy() @ w.value.numpy())
    np.testing.assert_allclose(table.grad.numpy(), grad.T, rtol=1e-12, atol=1e-12)
