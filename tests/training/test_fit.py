"""Training over a NumPy data set with shuffled batches, against a NumPy reference of the same
steps; forward steps that run after training; prediction and evaluation in batches."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import data, fit, train
from einjit.backends.cc import toolchain as cc
from mlp_model import build, dataset, params_of, reference_step


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def lr_for(epoch: int) -> float:
    return 0.1 / (1 + epoch)


@pytest.mark.parametrize("weighted", [False, True], ids=["drop_last", "keep_last_weighted"])
def test_shuffled_training_equals_numpy_reference(weighted):
    xs, ys = dataset(1000)
    mlp, inputs, loss, lr = build(64, weighted=weighted)
    ref = params_of(loss)
    step = fit.train_step(loss, train.sgd_update(loss, lr), inputs=inputs)
    loader = data.Loader(xs, ys, batch_size=64, seed=5, drop_last=not weighted, weights=weighted)
    assert len(loader) == (16 if weighted else 15)
    epochs = 3
    history = fit.fit(step, loader, epochs=epochs, progress=False,
                      on_epoch=lambda e, _: lr.set_values(lr_for(e + 1)))
    ref_losses = []
    for epoch in range(epochs):
        order = np.random.default_rng([5, epoch]).permutation(1000)
        total, count = 0.0, 0
        for start in range(0, 1000, 64):
            rows = order[start:start + 64]
            if len(rows) < 64 and not weighted:
                break
            wb = np.full(len(rows), 1.0 / len(rows))
            total += reference_step(ref, xs[rows], ys[rows], wb, lr_for(epoch))
            count += 1
        ref_losses.append(total / count)
    got = params_of(loss)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=0, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(history.losses, ref_losses, rtol=0, atol=1e-6)
    assert history.losses[-1] < history.losses[0]


def test_forward_after_training_on_new_inputs_without_recompiling():
    xs, ys = dataset(300)
    mlp, inputs, loss, lr = build(32)
    step = fit.train_step(loss, train.sgd_update(loss, lr), inputs=inputs)
    fit.fit(step, data.Loader(xs, ys, batch_size=32), epochs=2, progress=False)
    x1 = ej.input("x1", batch_dims=[1], output_dims=[2])
    predict_one = fit.forward_step(mlp(x1), inputs=[x1])
    compiles = cc.stats.compiler_invocations
    p = params_of(loss)
    for k in range(5):
        sample = xs[k:k + 1]
        want = np.maximum(sample @ p["w1"].T + p["b1"], 0) @ p["w2"].T + p["b2"]
        np.testing.assert_allclose(predict_one(sample), want, rtol=0, atol=1e-12)
    step(xs[:32], ys[:32])
    p2 = params_of(loss)
    want = np.maximum(xs[:1] @ p2["w1"].T + p2["b1"], 0) @ p2["w2"].T + p2["b2"]
    np.testing.assert_allclose(predict_one(xs[:1]), want, rtol=0, atol=1e-12)
    assert cc.stats.compiler_invocations == compiles


def test_forward_of_the_training_graph_after_a_step():
    xs, ys = dataset(64)
    mlp, inputs, loss, lr = build(64)
    step = fit.train_step(loss, train.sgd_update(loss, lr), inputs=inputs)
    step(xs, ys)
    with pytest.raises(ej.TensorError, match="'loss'.*already consumed.*forward_step"):
        train.forward(loss)
    evaluate_loss = fit.forward_step(loss, inputs=inputs)
    p = params_of(loss)
    out = np.maximum(xs @ p["w1"].T + p["b1"], 0) @ p["w2"].T + p["b2"]
    want = np.mean(np.maximum(1 - ys[:, None] * out, 0))
    np.testing.assert_allclose(evaluate_loss(xs, ys), [want], rtol=0, atol=1e-12)
    step(xs, ys)
    assert step.loss_value() == pytest.approx(want, abs=1e-12)
    assert not np.array_equal(params_of(loss)["w1"], p["w1"])


def test_a_tensor_kept_inside_the_training_step_is_recomputed_by_a_forward_step():
    """Issue 24: the training step inlined the pre-activation, so a forward step computes it
    again (through a copy it can keep on the host) instead of refusing."""
    xs, ys = dataset(16)
    mlp, inputs, loss, lr = build(16)
    step = fit.train_step(loss, train.sgd_update(loss, lr), inputs=inputs)
    step(xs, ys)
    inlined = [t for t in loss.subtree() if t.value_tn.is_virtual() and t.children]
    assert inlined, "the training step inlines the pre-activations of the MLP"
    [pre] = [t for t in inlined if t.op_label == "+" and "b1" in {c.label_str for c in t.children}]
    p = params_of(loss)
    got = fit.forward_step(pre, inputs=inputs)(xs, ys)
    np.testing.assert_allclose(got, xs @ p["w1"].T + p["b1"], rtol=1e-5, atol=1e-6)


def test_uninitialized_parameters_are_refused_before_compiling():
    mlp, inputs, loss, lr = build(8, init=False)
    with pytest.raises(ej.TensorError, match=r"\['b1', 'b2', 'w1', 'w2'\].*init_params"):
        fit.train_step(loss, train.sgd_update(loss, lr), inputs=inputs)


def test_predict_and_evaluate_in_batches_with_a_short_last_batch():
    xs, ys = dataset(100)
    mlp, inputs, loss, lr = build(16)
    xe = ej.input("xe", batch_dims=[32], output_dims=[2])
    forward = fit.forward_step(mlp(xe), inputs=[xe])
    p = params_of(loss)
    want = np.maximum(xs @ p["w1"].T + p["b1"], 0) @ p["w2"].T + p["b2"]
    got = fit.predict(forward, xs)
    assert got.shape == (100, 1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    accuracy = fit.evaluate(forward, [xs], ys, lambda pred, y: np.mean(np.sign(pred[:, 0]) == y))
    assert accuracy == pytest.approx(np.mean(np.sign(want[:, 0]) == ys), abs=0)


def test_step_argument_errors_name_the_inputs():
    mlp, inputs, loss, lr = build(8)
    step = fit.train_step(loss, train.sgd_update(loss, lr), inputs=inputs)
    with pytest.raises(ej.TensorError, match=r"2 arrays.*\['x', 'y'\]"):
        step(np.zeros((8, 2)))
    with pytest.raises(ej.TensorError, match=r"'x'.*\(8, 2\).*\(5, 2\)"):
        step(np.zeros((5, 2)), np.zeros(5))


def test_progress_bar_runs_with_tqdm(capsys):
    pytest.importorskip("tqdm")
    xs, ys = dataset(64)
    mlp, inputs, loss, lr = build(16)
    step = fit.train_step(loss, train.sgd_update(loss, lr), inputs=inputs)
    history = fit.fit(step, data.Loader(xs, ys, batch_size=16), epochs=2, progress=True)
    assert len(history.losses) == 2 and "epoch 2" in capsys.readouterr().err


def test_private_contexts_get_writes_through_from_host_and_reads_through_to_host():
    from einjit import backends
    xs, ys = dataset(128)
    mlp, inputs, loss, lr = build(32)
    ref = params_of(loss)
    context = backends.get("cc").init("private")
    step = fit.train_step(loss, train.sgd_update(loss, lr), inputs=inputs, context=context)
    assert step.routine.context is context
    loader = data.Loader(xs, ys, batch_size=32, seed=3)
    fit.fit(step, loader, epochs=1, progress=False)
    for rows, _ in loader.index_batches(0):
        reference_step(ref, xs[rows], ys[rows], np.full(32, 1 / 32), 0.1)
    for name, value in params_of(loss).items():
        np.testing.assert_allclose(value, ref[name], rtol=0, atol=1e-12, err_msg=name)
    w1 = next(p for p in loss.params() if p.label_str == "w1")
    w1.set_values(np.zeros((8, 2)))
    lr.set_values(0.0)
    step(xs[:32], ys[:32])
    np.testing.assert_array_equal(w1.numpy(), np.zeros((8, 2)))
    p = params_of(loss)
    out = (np.maximum(p["b1"], 0) @ p["w2"].T)[0] + p["b2"][0]
    assert step.loss_value() == pytest.approx(np.mean(np.maximum(1 - ys[:32] * out, 0)), abs=1e-12)


def test_predictor_is_one_routine_per_model_and_dims():
    xs, _ = dataset(10)
    mlp, _, loss, _ = build(8)
    one = fit.predictor(mlp, batch_dims=[1], output_dims=[2])
    compiles = cc.stats.compiler_invocations
    assert fit.predictor(mlp, batch_dims=[1], output_dims=[2]) is one
    p = params_of(loss)
    for k in range(3):
        want = np.maximum(xs[k:k + 1] @ p["w1"].T + p["b1"], 0) @ p["w2"].T + p["b2"]
        np.testing.assert_allclose(one(xs[k:k + 1]), want, rtol=0, atol=1e-12)
    assert cc.stats.compiler_invocations == compiles
    assert fit.predictor(mlp, batch_dims=[4], output_dims=[2]) is not one


def test_training_and_prediction_on_the_multicore_backend_match_numpy():
    xs, ys = dataset(128)
    mlp, inputs, loss, lr = build(32)
    ref = params_of(loss)
    step = fit.train_step(loss, train.sgd_update(loss, lr), inputs=inputs, backend="multicore")
    loader = data.Loader(xs, ys, batch_size=32, seed=3)
    history = fit.fit(step, loader, epochs=1, progress=False)
    losses = [reference_step(ref, xs[rows], ys[rows], np.full(32, 1 / 32), 0.1) for rows, _ in loader.index_batches(0)]
    for name, value in params_of(loss).items():
        np.testing.assert_allclose(value, ref[name], rtol=0, atol=1e-12, err_msg=name)
    assert history.losses[0] == pytest.approx(np.mean(losses), abs=1e-12)
    x1 = ej.input("x1", batch_dims=[1], output_dims=[2])
    predict_one = fit.forward_step(mlp(x1), inputs=[x1], backend="multicore")
    want = np.maximum(xs[:1] @ ref["w1"].T + ref["b1"], 0) @ ref["w2"].T + ref["b2"]
    np.testing.assert_allclose(predict_one(xs[:1]), want, rtol=0, atol=1e-12)
