"""`nn.Embedding` and `nn.cross_entropy` on integer ids (a gather, no one-hot rows), against
NumPy always and `torch.nn.Embedding` / `F.cross_entropy` when installed: values and
gradients; the one-hot forms still work and agree."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import nn, train
from einjit.ir import assignments as asg
from einjit.ir import low_level as ll

B, T, V, D = 3, 4, 11, 5


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def logits(z_np):
    """Logits with batch axes and a gradient: constant data plus a (zero) parameter row."""
    n_batch = z_np.ndim - 1
    bias = ej.param("bias", values=np.zeros(V), output_dims=[V])
    return (ej.ndarray(z_np, batch_axes=n_batch, label="z0") + bias).hosted()


def run_step(loss):
    loss.hosted()
    train.init_params(loss, seed=1)
    train.to_routine(train.grad_update(loss), name="ids_step")()


def log_softmax(z):
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def test_embedding_of_an_integer_input_gathers_rows_and_scatters_the_gradient():
    rng = np.random.default_rng(0)
    ids_np = rng.integers(0, V, (B, T)).astype(np.int32)
    ids_np[0, :2] = ids_np[2, 3] = 4
    emb = nn.Embedding(V, D, label="tok")
    ids = ej.input("ids", batch_dims=[B, T], prec="int32", values=ids_np[..., None])
    x = emb(ids)
    w = rng.standard_normal((B, T, D))
    loss = ej.sum(x * ej.ndarray(w, batch_axes=2), "...|...->... => 0", label="loss")
    x.hosted()
    run_step(loss)
    table = emb.params()[0].value.numpy().T  # (V, D)
    np.testing.assert_allclose(x.value.numpy(), table[ids_np], rtol=1e-13)
    grad = np.zeros((V, D))
    np.add.at(grad, ids_np, w)
    np.testing.assert_allclose(emb.params()[0].grad.numpy().T, grad, rtol=1e-13, atol=1e-15)
    torch = pytest.importorskip("torch")
    ref = torch.nn.Embedding(V, D).double()
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(table))
    out = ref(torch.tensor(ids_np, dtype=torch.long))
    (out * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.value.numpy(), out.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(emb.params()[0].grad.numpy().T, ref.weight.grad.numpy(), rtol=1e-13, atol=1e-15)


def test_embedding_code_has_no_one_hot_contraction():
    emb = nn.Embedding(1000, 4, label="big")
    ids = ej.input("ids", batch_dims=[2], prec="int32")
    x = emb(ids)
    train.init_params(x)
    llc = asg.to_low_level(train.forward(x))
    loops = [s for s in ll.iter_stmts(llc) if isinstance(s, ll.ForLoop)]
    assert all(lp.to_ < 1000 - 1 for lp in loops), "a loop over the 1000 rows means one-hot rows"


def test_embedding_refuses_an_id_axis_longer_than_one():
    emb = nn.Embedding(V, D, label="e2")
    ids = ej.input("ids2", batch_dims=[B], output_dims=[T], prec="int32")
    with pytest.raises(ej.ShapeError, match=r"Embedding e2: the id axis of its input ids2 .* is 4, expected 1"):
        emb(ids)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_on_an_integer_input_matches_numpy_and_torch(reduction):
    rng = np.random.default_rng(1)
    z_np = rng.standard_normal((B, T, V)) * 3
    z_np[0, 0, 2] = 1e4  # a huge logit stays finite
    y_np = rng.integers(0, V, (B, T)).astype(np.int32)
    z = logits(z_np)
    y = ej.input("y", batch_dims=[B, T], prec="int32", values=y_np[..., None])
    loss = nn.cross_entropy(z, y, reduction=reduction)
    r = rng.standard_normal((B, T))
    total = loss if reduction != "none" else ej.sum(loss.hosted() * ej.ndarray(r, batch_axes=2), "...|...->... => 0")
    run_step(total)
    z_np = z.value.numpy().reshape(B, T, V)  # "none" times r may infer a unit output axis before the classes
    z_grad = z.grad.numpy().reshape(B, T, V)
    per = -np.take_along_axis(log_softmax(z_np), y_np[..., None], axis=-1)[..., 0]
    weight = {"mean": np.full((B, T), 1 / (B * T)), "sum": np.ones((B, T)), "none": r}[reduction]
    want = {"mean": per.mean(), "sum": per.sum(), "none": per}[reduction]
    got = loss.value.numpy()
    np.testing.assert_allclose(got.reshape(np.shape(want)) if reduction == "none" else got[0], want, rtol=1e-12)
    soft = np.exp(log_softmax(z_np))
    onehot = np.eye(V)[y_np]
    np.testing.assert_allclose(z_grad, (soft - onehot) * weight[..., None], rtol=1e-10, atol=1e-14)
    assert np.all(np.isfinite(z_grad))
    torch = pytest.importorskip("torch")
    zt = torch.tensor(z_np, requires_grad=True)
    lt = torch.nn.functional.cross_entropy(zt.reshape(-1, V), torch.tensor(y_np.ravel(), dtype=torch.long),
                                           reduction=reduction)
    (lt if reduction != "none" else (lt * torch.tensor(r.ravel())).sum()).backward()
    np.testing.assert_allclose(np.ravel(got), np.ravel(lt.detach().numpy()), rtol=1e-12)
    np.testing.assert_allclose(z_grad, zt.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_cross_entropy_ids_numpy_labels_and_one_hot_rows_agree():
    rng = np.random.default_rng(2)
    z_np = rng.standard_normal((6, V))
    y_np = rng.integers(0, V, 6)
    losses = []
    for target in (lambda: ej.input("yi", batch_dims=[6], prec="int32", values=y_np[:, None].astype(np.int32)),
                   lambda: y_np,
                   lambda: ej.ndarray(np.eye(V)[y_np], batch_axes=1)):
        z = logits(z_np)
        loss = nn.cross_entropy(z, target())
        run_step(loss)
        losses.append((loss.value.numpy()[0], z.grad.numpy().copy()))
    for value, grad in losses[1:]:
        np.testing.assert_allclose(value, losses[0][0], rtol=1e-13)
        np.testing.assert_allclose(grad, losses[0][1], rtol=1e-12, atol=1e-15)


def test_a_bigram_model_trains_on_integer_batches_through_fit_like_numpy_sgd():
    """Embedding of token ids, cross-entropy on next-token ids, SGD through `fit.train_step`
    fed integer batches: three steps equal the same SGD in NumPy."""
    from einjit import fit
    rng = np.random.default_rng(3)
    n, vocab, lr = 8, 6, 0.5
    emb = nn.Embedding(vocab, vocab, label="bigram")
    x = ej.input("tok", batch_dims=[n], prec="int32")
    y = ej.input("next", batch_dims=[n], prec="int32")
    loss = nn.cross_entropy(emb(x), y)
    train.init_params(loss, seed=4)
    table = emb.params()[0].value.numpy().T.copy()  # (vocab, vocab): row = logits after a token
    step = fit.train_step(loss, train.sgd_update(loss, lr), inputs=[x, y])
    for _ in range(3):
        xb, yb = rng.integers(0, vocab, n), rng.integers(0, vocab, n)
        step(xb[:, None], yb[:, None])
        z = table[xb]
        p = np.exp(log_softmax(z))
        want = -np.log(p[np.arange(n), yb]).mean()
        np.testing.assert_allclose(loss.value.numpy()[0], want, rtol=1e-12)
        grad = np.zeros_like(table)
        np.add.at(grad, xb, (p - np.eye(vocab)[yb]) / n)
        table -= lr * grad
    np.testing.assert_allclose(emb.params()[0].value.numpy().T, table, rtol=1e-12, atol=1e-14)
