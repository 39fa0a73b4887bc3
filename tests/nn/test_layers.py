"""einjit.nn layers: forward values against NumPy references (float32, 1e-5), gradients against
finite differences (float64), labels, shape errors, dropout statistics and train/eval switches."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_gradients, weighted_loss

import einjit as ej
from einjit import nn, train
from einjit import shape as sh


def _conv_ref(x, w, b, stride=(1, 1), dilation=(1, 1), padding=(0, 0)):
    x = np.pad(x, ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1])))
    n, _, h, wd = x.shape
    co, _, kh, kw = w.shape
    oh = (h - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, co, oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs = i * stride[0] + dilation[0] * np.arange(kh)
            ws = j * stride[1] + dilation[1] * np.arange(kw)
            patch = x[:, :, hs][:, :, :, ws]
            out[:, :, i, j] = np.einsum("nckl,ockl->no", patch, w)
    return out + (0 if b is None else b[None, :, None, None])


def _pool_ref(x, k, s, fn):
    n, c, h, w = x.shape
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = fn(x[:, :, i * s:i * s + k, j * s:j * s + k], axis=(2, 3))
    return out


def _run(out: ej.Tensor, seed: int = 0) -> np.ndarray:
    if out.params():
        train.init_params(out, seed=seed)
    return train.forward_once(out)


CONV_CASES = [((3, 2), (1, 1), (1, 1), (0, 0)), ((3, 2), (2, 1), (1, 1), (0, 0)), ((3, 2), (1, 1), (2, 1), (0, 0)),
              ((3, 2), (2, 2), (1, 2), (0, 0)), ((1, 1), (1, 1), (1, 1), (0, 0)), ((1, 2), (2, 3), (1, 1), (0, 0)),
              ((3, 3), (1, 1), (1, 1), (1, 1)), ((3, 2), (2, 1), (1, 1), (2, 1)), ((3, 3), (1, 2), (2, 1), (1, 0))]


@pytest.mark.parametrize("kernel,stride,dilation,padding", CONV_CASES)
def test_conv2d_forward(kernel, stride, dilation, padding):
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 8)).astype(np.float32)
    conv = nn.Conv2d(3, 4, kernel, stride=stride, dilation=dilation, padding=padding,
                     label=f"conv_{kernel}_{stride}_{dilation}_{padding}")
    got = _run(conv(ej.ndarray(x, batch_axes=1)))
    w, b = (p.value.numpy() for p in conv.params())
    assert [p.label_str for p in conv.params()] == [f"{conv.label}.w", f"{conv.label}.b"]
    np.testing.assert_allclose(got, _conv_ref(x, w, b, stride, dilation, padding), rtol=1e-5, atol=1e-5)


def test_linear_over_feature_maps_is_flatten_then_linear():
    """A `Linear` consumes every output axis, with or without a `Flatten` before it."""
    x = np.random.default_rng(1).standard_normal((5, 2, 3, 3)).astype(np.float32)
    direct = nn.Linear(18, 4, label="fc_maps")
    got = _run(direct(ej.ndarray(x, batch_axes=1)))
    w, b = (p.value.numpy() for p in direct.params())
    assert w.shape == (4, 2, 3, 3)
    np.testing.assert_allclose(got, x.reshape(5, -1) @ w.reshape(4, -1).T + b, rtol=1e-5, atol=1e-5)
    model = nn.Sequential(nn.Flatten(), nn.Linear(18, 4, label="fc"))
    got = _run(model(ej.ndarray(x, batch_axes=1)))
    w, b = (p.value.numpy() for p in model.params())
    assert w.shape == (4, 18) and [p.label_str for p in model.params()] == ["fc.w", "fc.b"]
    np.testing.assert_allclose(got, x.reshape(5, -1) @ w.T + b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dims", [(3, 4, 5), (2, 1, 3), (1, 1, 6), (4, 7), (1, 1)])
def test_flatten_is_numpy_reshape(dims):
    x = np.random.default_rng(11).standard_normal((2, *dims)).astype(np.float32)
    y = nn.Flatten(label="flat")(ej.ndarray(x, batch_axes=1))
    assert [d.d for d in y.shape.output.dims] == [int(np.prod(dims))]
    np.testing.assert_array_equal(train.forward_once(y), x.reshape(2, -1))
    assert y.shape == (2, int(np.prod(dims)))


def test_flatten_of_a_one_axis_input_is_the_input():
    x = ej.ndarray(np.ones((3, 5), np.float32), batch_axes=1)
    assert nn.Flatten()(x) is x


def test_flatten_after_convolution_and_pooling_has_the_product_size_before_inference_closes():
    """Conv and pool output extents are derived only when inference closes; Flatten still
    knows them, and any pointwise layer (not only Linear) can consume its one axis."""
    images = np.random.default_rng(12).standard_normal((4, 1, 8, 8)).astype(np.float32)
    conv = nn.Conv2d(1, 3, 3, padding=1, label="fconv")
    x = ej.input("fimages", batch_dims=[4], output_dims=[1, 8, 8], values=images)
    pooled = nn.MaxPool2d(2)(conv(x))
    assert not all(isinstance(d, sh.Dim) for d in pooled.shape.output.dims)
    y = nn.Flatten(label="flat2")(pooled)
    assert [d.d for d in y.shape.output.dims] == [48]
    assert not all(isinstance(d, sh.Dim) for d in pooled.shape.output.dims)  # inference is left open
    offset = ej.ndarray(np.arange(48, dtype=np.float32), label="offset")
    got = _run(y + offset)
    w, b = (p.value.numpy() for p in conv.params())
    want = _pool_ref(_conv_ref(images, w, b, padding=(1, 1)), 2, 2, np.max).reshape(4, 48) + np.arange(48)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert y.shape == (4, 48)


def test_flatten_gradient_float64():
    rng = np.random.default_rng(13)
    with ej.default_precision("double"):
        w = ej.param("wflat", values=rng.standard_normal((3, 2, 4)), output_dims=[3, 2, 4])
        x = ej.ndarray(rng.standard_normal((2, 3, 2, 4)), batch_axes=1, label="xflat")
        loss = weighted_loss(nn.Flatten(label="gflat")(x * w), rng)
        train.init_params(loss)
        check_gradients(loss, [w])


def test_flatten_refuses_input_axes_and_unknown_sizes():
    x = ej.ndarray(np.ones((2, 3, 4), np.float32), batch_axes=1, input_axes=1, label="with_inputs")
    with pytest.raises(sh.ShapeError, match=r"Flatten flat3: the input row .* expected no input axes"):
        nn.Flatten(label="flat3")(x)


@pytest.mark.parametrize("layer,fn", [(nn.MaxPool2d(2), np.max), (nn.AvgPool2d(2), np.mean),
                                      (nn.MaxPool2d(3, 2), np.max), (nn.AvgPool2d(3, 1), np.mean)])
def test_pooling_forward(layer, fn):
    x = np.random.default_rng(2).standard_normal((2, 3, 7, 7)).astype(np.float32)
    got = _run(layer(ej.ndarray(x, batch_axes=1)))
    np.testing.assert_allclose(got, _pool_ref(x, layer.kernel[0], layer.stride[0], fn), rtol=1e-5, atol=1e-6)


def test_max_pool_after_strided_conv_on_a_second_input_size():
    """The same model applied to a training batch and to a larger test set (issue 12's 6 vs 5)."""
    model = nn.Sequential(nn.Conv2d(1, 2, 3, label="c"), nn.MaxPool2d(2))
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((4, 1, 8, 8)).astype(np.float32), rng.standard_normal((9, 1, 8, 8)).astype(np.float32)
    ya = _run(model(ej.ndarray(a, batch_axes=1)))
    yb = train.forward_once(model(ej.ndarray(b, batch_axes=1)))
    w, bias = (p.value.numpy() for p in model.params())
    np.testing.assert_allclose(ya, _pool_ref(_conv_ref(a, w, bias), 2, 2, np.max), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(yb, _pool_ref(_conv_ref(b, w, bias), 2, 2, np.max), rtol=1e-5, atol=1e-5)


def test_layer_norm_forward():
    x = np.random.default_rng(4).standard_normal((3, 6)).astype(np.float32) * 3 + 1
    got = _run(nn.LayerNorm(6)(ej.ndarray(x, batch_axes=1)))
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_batch_norm_train_updates_running_statistics_and_eval_uses_them():
    x = np.random.default_rng(5).standard_normal((8, 3, 2, 2)).astype(np.float32) * 2 + 3
    bn = nn.BatchNorm(3, momentum=0.25, label="bn")
    got = _run(bn(ej.ndarray(x, batch_axes=1)))
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    want = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bn.running_mean.value.numpy(), 0.25 * mean, rtol=1e-5)
    np.testing.assert_allclose(bn.running_var.value.numpy(), 0.75 + 0.25 * x.var(axis=(0, 2, 3), ddof=1), rtol=1e-5)
    bn.eval()
    rm, rv = bn.running_mean.value.numpy(), bn.running_var.value.numpy()
    got_eval = train.forward_once(bn(ej.ndarray(x, batch_axes=1)))
    np.testing.assert_allclose(got_eval, (x - rm[None, :, None, None]) / np.sqrt(rv[None, :, None, None] + 1e-5),
                               rtol=1e-5, atol=1e-5)


def test_embedding_picks_rows_and_checks_indices():
    emb = nn.Embedding(5, 3, label="emb")
    idx = np.array([[0, 4], [2, 2]])
    got = _run(emb(idx))
    table = emb.params()[0].value.numpy()
    np.testing.assert_allclose(got, table.T[idx], rtol=1e-6)
    with pytest.raises(ej.TensorError, match=r"Embedding emb: id 5 at index \(0,\) is outside 0..4"):
        emb(np.array([5]))


def test_dropout_keep_fraction_fresh_masks_reproducible_and_eval_identity():
    def masks(seed):
        x = ej.ndarray(np.ones((400, 500), np.float32), batch_axes=1)
        drop = nn.Dropout(0.3, seed=seed)
        y = drop(x)
        routine = train.to_routine(train.forward(y))
        routine()
        first = y.value.numpy()
        routine()
        return drop, first, y.value.numpy()

    drop, m1, m2 = masks(7)
    keep = float(np.mean(m1 != 0))
    assert abs(keep - 0.7) < 0.01 * 0.7
    np.testing.assert_allclose(m1[m1 != 0], 1 / 0.7, rtol=1e-6)
    assert np.mean(m1 != m2) > 0.3
    ej.uniform  # noqa: B018 - the public name exists
    from einjit.tensor import random as rnd
    rnd.reset_streams()
    _, r1, _ = masks(7)
    np.testing.assert_array_equal(r1, m1)
    drop.eval()
    x = ej.ndarray(np.full((2, 3), 2.5, np.float32), batch_axes=1)
    np.testing.assert_array_equal(train.forward_once(drop(x)), np.full((2, 3), 2.5, np.float32))


GRADIENT_LAYERS = {
    "conv": lambda: nn.Conv2d(2, 3, 2, stride=(1, 2), label="gconv"),
    "conv_dilated": lambda: nn.Conv2d(2, 2, 2, dilation=2, bias=False, label="gconvd"),
    "conv_padded": lambda: nn.Conv2d(2, 2, 3, padding=1, stride=2, label="gconvp"),
    "maxpool": lambda: nn.Sequential(nn.Conv2d(2, 2, 1, label="gc1"), nn.MaxPool2d(2)),
    "avgpool": lambda: nn.Sequential(nn.Conv2d(2, 2, 1, label="gc2"), nn.AvgPool2d(2, 1)),
    "linear": lambda: nn.Linear(50, 3, label="glin"),
    "layernorm": lambda: nn.Sequential(nn.Conv2d(2, 2, 1, label="gc3"), nn.LayerNorm(5, label="gln")),
    "batchnorm": lambda: nn.Sequential(nn.Conv2d(2, 2, 1, label="gc4"), nn.BatchNorm(2, label="gbn")),
}


@pytest.mark.parametrize("name", sorted(GRADIENT_LAYERS))
def test_layer_gradients_float64(name):
    rng = np.random.default_rng(6)
    with ej.default_precision("double"):
        x = ej.ndarray(rng.standard_normal((3, 2, 5, 5)), batch_axes=1, label="x")
        layer = GRADIENT_LAYERS[name]()
        loss = weighted_loss(layer(x), rng)
        train.init_params(loss, seed=1)
        params = loss.params()
        assert params
        check_gradients(loss, params, rtol=1e-5, atol=1e-7)


def test_wrong_shapes_name_the_layer_axis_and_expectation():
    x = ej.ndarray(np.ones((2, 3, 8, 8), np.float32), batch_axes=1, label="images")
    with pytest.raises(sh.ShapeError, match=r"Conv2d conv9: the channel axis \(output axis 0\).* is 3, expected "
                                           r"in_channels=1"):
        nn.Conv2d(1, 4, 3, label="conv9")(x)
    with pytest.raises(sh.ShapeError, match=r"Conv2d big: the height axis .* is 8, expected at least 9"):
        nn.Conv2d(3, 4, 9, label="big")(x)
    with pytest.raises(sh.ShapeError, match=r"Linear fc9: the size of the feature axes \[3, 8, 8\].* is 192, "
                                           r"expected in_features=100"):
        nn.Linear(100, 10, label="fc9")(x)
    flat = ej.ndarray(np.ones((2, 5), np.float32), batch_axes=1, label="flat")
    with pytest.raises(sh.ShapeError, match=r"MaxPool2d pool9: the number of output axes .* is 1, expected 3"):
        nn.MaxPool2d(2, label="pool9")(flat)


def test_sequential_params_have_readable_labels():
    model = nn.Sequential(nn.Conv2d(1, 2, 3, label="seq_conv"), nn.ReLU(), nn.Linear(8, 2, label="seq_fc"))
    x = ej.ndarray(np.ones((1, 1, 4, 4), np.float32), batch_axes=1)
    out = model(x)
    assert [p.label_str for p in out.params()] == ["seq_conv.w", "seq_conv.b", "seq_fc.w", "seq_fc.b"]
    assert [p.label_str for p in model.params()] == ["seq_conv.w", "seq_conv.b", "seq_fc.w", "seq_fc.b"]


def test_two_instances_with_one_label_keep_separate_parameters_and_one_instance_shares():
    a, b = nn.Linear(3, 2, label="twin"), nn.Linear(3, 2, label="twin")
    x = ej.ndarray(np.ones((2, 3), np.float32), batch_axes=1)
    ya, yb, ya2 = a(x), b(x), a(ej.ndarray(np.zeros((4, 3), np.float32), batch_axes=1))
    assert yb.params() == b.params()
    assert all(p is not q for p in a.params() for q in b.params())
    assert ya2.params() == ya.params() == a.params()


def test_dropout_gradient_is_the_scaled_mask():
    with ej.default_precision("double"):
        w = ej.param("wdrop", values=np.linspace(-1, 1, 12), output_dims=[3, 4])
        y = nn.Dropout(0.5, seed=2, label="gdrop")(ej.einsum("b,f => b|->f", w)).hosted()
        loss = ej.sum(y * y)
        train.init_params(loss)
        routine = train.to_routine(train.grad_update(loss))
        routine()
    mask = (y.value.numpy() != 0) * 2.0
    wv = w.value.numpy()
    np.testing.assert_allclose(loss.value.numpy()[0], np.sum((mask * wv) ** 2), rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), 2 * mask * mask * wv, rtol=1e-12)
    assert 0 < np.count_nonzero(mask) < 12


def test_embedding_gradient_float64():
    rng = np.random.default_rng(8)
    with ej.default_precision("double"):
        emb = nn.Embedding(4, 3, label="gemb")
        loss = weighted_loss(emb(np.array([[0, 3], [3, 1], [2, 2]])), rng)
        train.init_params(loss, seed=2)
        check_gradients(loss, emb.params())


def test_linear_feature_size_is_checked_once_inferred():
    x = ej.ndarray(np.ones((2, 3, 6, 6), np.float32), batch_axes=1)
    h = nn.Conv2d(3, 2, 3, label="pre_conv")(x)
    out = nn.Linear(100, 5, label="late_fc")(h)
    with pytest.raises(sh.ShapeError, match=r"Linear late_fc: the size of the feature axes \[2, 4, 4\].* is 32, "
                                           r"expected in_features=100"):
        train.init_params(out)


def test_wrong_shapes_of_normalization_embedding_and_pooling_layers_are_named():
    x = ej.ndarray(np.ones((2, 3, 4, 4), np.float32), batch_axes=1, label="maps")
    with pytest.raises(sh.ShapeError, match=r"BatchNorm bn9: the channel axis \(output axis 0\) of its input maps "
                                           r".* is 3, expected num_features=5"):
        nn.BatchNorm(5, label="bn9")(x)
    with pytest.raises(sh.ShapeError, match=r"LayerNorm ln9: the last output axis of its input maps .* is 4, "
                                           r"expected normalized_shape=6"):
        nn.LayerNorm(6, label="ln9")(x)
    hot = ej.ndarray(np.ones((2, 5), np.float32), batch_axes=1, label="hot")
    with pytest.raises(sh.ShapeError, match=r"Embedding emb9: the one-hot axis of its input hot .* is 5, "
                                           r"expected num_embeddings=7"):
        nn.Embedding(7, 2, label="emb9")(hot)
    with pytest.raises(sh.ShapeError, match=r"AvgPool2d avg9: the height axis of its input maps .* is 4, "
                                           r"expected at least 5 \(kernel 5"):
        nn.AvgPool2d(5, label="avg9")(x)


def test_params_before_the_first_call_are_listed_or_refused_never_empty():
    """A layer whose parameter shapes follow its input (`Linear` spans all of the input's
    output axes) refuses `params()` before its first call, naming itself; layers whose shapes
    the constructor fixes list their parameters at once; after a call, every parameter is there."""
    model = nn.Sequential(nn.Linear(2, 4, label="fc1"), nn.BatchNorm(4, label="bn"), nn.ReLU(),
                          nn.Linear(4, 3, label="fc2"))
    for layer in (model, model.layers[0]):
        with pytest.raises(ej.TensorError, match=r"Linear fc1 makes its parameters on its first call.*call the model"):
            layer.params()
    with pytest.raises(ej.TensorError, match=r"Conv2d c1 makes its parameters on its first call"):
        nn.Conv2d(1, 2, 3, label="c1").params()
    with pytest.raises(ej.TensorError, match=r"Embedding e1 makes its parameters on its first call"):
        nn.Embedding(5, 2, label="e1").state_tensors()
    assert [p.label_str for p in model.layers[1].params()] == ["bn.gamma", "bn.beta"]
    assert [p.dims for p in nn.LayerNorm(3, label="ln").params()] == [(3,), (3,)]
    assert nn.ReLU().params() == [] and nn.Dropout(0.5).params() == [] and nn.Flatten().params() == []
    y = model(ej.input("x", batch_dims=[5], output_dims=[2]))
    listed = [p.label_str for p in model.params()]
    assert listed == ["fc1.w", "fc1.b", "bn.gamma", "bn.beta", "fc2.w", "fc2.b"]
    assert sorted(listed) == sorted(p.label_str for p in y.params())
