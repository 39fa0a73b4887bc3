"""Layers on OpenMP threads: convolutions with their gradients, and attention (batched
contractions over batch × heads, the softmax) forward and backward, compiled at 1 and at 2
threads. Only loops over output cells run on threads, so both give the same bits, and both
match NumPy. Two threads run on a one-core machine too (time-sliced)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import einjit as ej
from einjit import fit, nn, train
from einjit.backends.c_syntax import C_SYNTAX
from einjit.backends.cc import toolchain as cc
from einjit.ir import optimize
from einjit.ir.optimize import VirtualizeSettings
from einjit.nn.attention import MultiHeadAttention
from test_attention import np_mha

FOR = "#pragma omp for schedule(dynamic"


def _options(threads: int) -> cc.CcOptions:
    """Threads for every nest of at least 256 assignments: most nests of these small layers."""
    return cc.CcOptions(threads=threads, syntax=replace(C_SYNTAX, thread_min_work=256))


def _grads_at(threads, code, params, name, tmp_path, monkeypatch):
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(tmp_path))
    routine = train.to_routine(code, name=f"{name}{threads}", options=_options(threads))
    routine()
    return {p.label_str: p.grad.numpy().copy() for p in params}, (tmp_path / f"{name}{threads}.c").read_text()


def test_conv_layers_and_their_gradients_on_threads(two_conv_model, tmp_path, monkeypatch):
    # one nest per node, so that each of them shows its threaded loop (fused, the pointwise
    # nests share their batch loop with their neighbours)
    monkeypatch.setattr(optimize, "virtualize_settings", VirtualizeSettings(fuse=False))
    net = two_conv_model(8, 18)
    code = train.grad_update(net.loss)
    params = net.model.params()
    serial, _ = _grads_at(1, code, params, "conv_threads", tmp_path, monkeypatch)
    threaded, source = _grads_at(2, code, params, "conv_threads", tmp_path, monkeypatch)
    assert source.count("#pragma omp parallel") >= 1 and source.count(FOR) >= 6
    _, want = net.reference()
    for label, g in want.items():
        np.testing.assert_array_equal(threaded[label], serial[label], err_msg=label)
        np.testing.assert_allclose(threaded[label], g, rtol=1e-4, atol=1e-5 * np.abs(g).max(), err_msg=label)


def test_attention_forward_and_backward_on_threads(tmp_path, monkeypatch):
    b, t, d, heads = 4, 16, 32, 4
    rng = np.random.default_rng(2)
    xv = rng.standard_normal((b, t, d)).astype(np.float32)
    layer = MultiHeadAttention(d, heads, label="mha_threads")
    x = ej.ndarray(xv, batch_axes=2, label="x")
    y = layer(x)
    y.hosted()
    r = rng.standard_normal((b, t, d)).astype(np.float32)
    loss = ej.sum(y * ej.ndarray(r, batch_axes=2, label="r"), label="loss")
    train.init_params(loss, seed=3)
    code = train.grad_update(loss)
    params = layer.params()
    serial, _ = _grads_at(1, code, params, "mha_threads", tmp_path, monkeypatch)
    serial_y = y.value.numpy().copy()
    threaded, source = _grads_at(2, code, params, "mha_threads", tmp_path, monkeypatch)
    assert source.count(FOR) >= 6
    np.testing.assert_array_equal(y.value.numpy(), serial_y)
    np.testing.assert_allclose(y.value.numpy(), np_mha(layer, xv.astype(np.float64)), rtol=1e-4, atol=1e-5)
    for label in serial:
        np.testing.assert_array_equal(threaded[label], serial[label], err_msg=label)
    # the output projection's bias gradient is the sum of r over batch and time
    out_b = next(label for label in threaded if label.endswith("out.b"))
    np.testing.assert_allclose(threaded[out_b], r.astype(np.float64).sum((0, 1)), rtol=1e-5, atol=1e-5)


def test_forward_step_runs_the_same_at_2_threads():
    """`fit.forward_step` on the default backend compiled for 2 threads (`EINJIT_NUM_THREADS`)."""
    b, t, d = 8, 16, 64
    xv = np.random.default_rng(4).standard_normal((b, t, d)).astype(np.float32)
    layer = MultiHeadAttention(d, 4, label="mha_env")
    x = ej.input("mha_env_x", batch_dims=[b, t], output_dims=[d])
    y = layer(x)
    train.init_params(y, seed=5)
    got = fit.forward_step(y, inputs=[x], backend=_backend(2))(xv)
    np.testing.assert_allclose(got, np_mha(layer, xv.astype(np.float64)), rtol=1e-4, atol=1e-5)


def _backend(threads: int):
    from einjit.backends.cc.backend import CcBackend
    return CcBackend(_options(threads))


def _convnet(n: int):
    """The benchmark's convnet (`benchmarks/bench_convnet.py`) on `n` images: its loss, its
    parameters, the images and the one-hot labels."""
    rng = np.random.default_rng(5)
    xv = rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
    yv = np.eye(10, dtype=np.float32)[rng.integers(0, 10, n)]
    model = nn.Sequential(nn.Conv2d(1, 8, 3, label="c1"), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, label="c2"), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(400, 10, label="fc"))
    x = ej.ndarray(xv, batch_axes=1, label="x")
    loss = nn.cross_entropy(model(x), ej.ndarray(yv, batch_axes=1, label="y"))
    train.init_params(loss, seed=2)
    return loss, model.params(), xv, yv


def _convnet_grads(loss, params, name, tmp_path, monkeypatch):
    """The gradients and the C source of the step compiled at 1 and at 2 threads (the default
    thread threshold)."""
    code = train.grad_update(loss)
    grads, sources = {}, {}
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(tmp_path))
    for threads in (1, 2):
        routine = train.to_routine(code, name=f"{name}{threads}", options=cc.CcOptions(threads=threads))
        routine()
        grads[threads] = {p.label_str: p.grad.numpy().copy() for p in params}
        sources[threads] = (tmp_path / f"{name}{threads}.c").read_text()
    return grads, sources


def test_convnet_step_gradients_are_the_same_bits_at_2_threads(tmp_path, monkeypatch):
    """The benchmark's convnet at batch 32 with the default thread threshold: the
    convolutions' batch-block loops move outermost, the first kernel gradient's batch chunks
    go on threads, and the scratch planner's compiler barriers sit inside the parallel regions."""
    loss, params, _, _ = _convnet(32)
    grads, sources = _convnet_grads(loss, params, "convnet_threads", tmp_path, monkeypatch)
    assert "sum split into 4 chunks" in sources[2] and "#pragma omp barrier" in sources[2]
    for label, g in grads[1].items():
        np.testing.assert_array_equal(grads[2][label], g, err_msg=label)
    # the fc bias gradient is the mean over the batch of softmax(logits) - y
    fc_b = next(p for p in params if p.label_str.endswith("fc.b"))
    assert np.all(np.isfinite(grads[2][fc_b.label_str]))
    np.testing.assert_allclose(grads[2][fc_b.label_str].sum(), 0.0, atol=1e-5)


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
def test_convnet_step_gradients_match_pytorch_at_1_and_2_threads(machine, tmp_path, monkeypatch):
    """The same step scheduled for AVX2 and for AVX-512 (`EINJIT_MACHINE`), at 1 and 2 threads:
    the same bits at both thread counts, and PyTorch's float64 gradients within float32
    tolerance (the kernel gradients' sums run in batch chunks: `ir/sched/schedule_conv.py`)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    loss, params, xv, yv = _convnet(32)
    by_label = {p.label_str: p for p in params}
    values = {label: torch.from_numpy(p.value.numpy().astype(np.float64)) for label, p in by_label.items()}
    grads, sources = _convnet_grads(loss, params, f"convnet_torch_{machine}", tmp_path, monkeypatch)
    # c1's kernel gradient sums 32 * 26 * 26 terms per cell, c2's 32 * 11 * 11 (too few to split)
    assert sources[2].count("sum split into 4 chunks") == 1
    ref = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                              torch.nn.Conv2d(8, 16, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                              torch.nn.Flatten(), torch.nn.Linear(400, 10)).double()
    named = {"c1.w": ref[0].weight, "c1.b": ref[0].bias, "c2.w": ref[3].weight, "c2.b": ref[3].bias,
             "fc.w": ref[7].weight, "fc.b": ref[7].bias}
    with torch.no_grad():
        for label, tp in named.items():
            tp.copy_(values[label].reshape(tp.shape))
    logits = ref(torch.from_numpy(xv.astype(np.float64)))
    torch.nn.functional.cross_entropy(logits, torch.from_numpy(yv.argmax(1))).backward()
    for label, tp in named.items():
        want = tp.grad.numpy().reshape(grads[1][label].shape)
        np.testing.assert_array_equal(grads[2][label], grads[1][label], err_msg=label)
        np.testing.assert_allclose(grads[2][label], want, rtol=1e-4, atol=1e-5 * np.abs(want).max(), err_msg=label)


def test_gpt_step_gradients_are_the_same_bits_at_2_threads(tmp_path, monkeypatch):
    """A 2-block GPT's loss and gradients at 1 and 2 threads: the heads loops of the projections
    take the panel threads' place, and the step runs as one parallel region."""
    from einjit.models import GPT, GPTConfig

    b, t = 8, 16
    model = GPT(GPTConfig(vocab_size=40, block_size=t, n_layer=2, n_head=4, d_model=32), label="gpt_threads")
    ids = np.random.default_rng(6).integers(0, 40, (b, t + 1)).astype(np.int32)
    x = ej.input("gpt_threads_x", batch_dims=[b, t], prec="int32", values=ids[:, :-1].copy())
    y = ej.input("gpt_threads_y", batch_dims=[b, t], prec="int32", values=ids[:, 1:].copy())
    loss = nn.cross_entropy(model(x), y)
    train.init_params(loss, seed=7)
    code, params = train.grad_update(loss), model.params()
    serial, _ = _grads_at(1, code, params, "gpt_threads", tmp_path, monkeypatch)
    serial_loss = loss.value.numpy().copy()
    threaded, source = _grads_at(2, code, params, "gpt_threads", tmp_path, monkeypatch)
    assert source.count(FOR) >= 20
    np.testing.assert_array_equal(loss.value.numpy(), serial_loss)
    for label, g in serial.items():
        assert np.all(np.isfinite(g)), label
        np.testing.assert_array_equal(threaded[label], g, err_msg=label)


def test_mlp_step_with_row_blocks_outside_the_panels_on_threads(tmp_path, monkeypatch):
    """A weight gradient with fewer rows than columns (256 x 784) runs its row blocks on
    threads, each packing its rows into its own copy of the row pack, while the tail rows
    use the routine's pack on one thread. The step's nests are outlined functions that take
    that pack as a pointer: each thread's copy is declared in the region (a `private(..)`
    pointer was unset in every thread and the step crashed). Scheduled for AVX2, whose
    description packs the rows (`Machine.row_pack`; AVX-512 reads them in place). Same bits
    as 1 thread, and NumPy's gradients."""
    monkeypatch.setenv("EINJIT_MACHINE", "avx2")
    rng = np.random.default_rng(8)
    xv = rng.standard_normal((64, 784)).astype(np.float32)
    x = ej.ndarray(xv, batch_axes=1, label="x")
    h = ej.relu(ej.param("b0", output_dims=[256], init="zeros") + ej.param("w0", output_dims=[256]) @ x)
    out = ej.param("w1", output_dims=[10]) @ h
    loss = ej.sum(out * out, "...|... => 0")
    train.init_params(loss, seed=9)
    params = sorted(loss.params(), key=lambda p: p.label_str)
    code = train.grad_update(loss)
    one, _ = _grads_at(1, code, params, "mlp_rows_outer", tmp_path, monkeypatch)
    two, source = _grads_at(2, code, params, "mlp_rows_outer", tmp_path, monkeypatch)
    assert "omp" in source and "apack" in source
    for name, want in one.items():
        np.testing.assert_array_equal(two[name], want, err_msg=name)
    w0, w1 = (p.value.numpy().astype(np.float64) for p in params if p.label_str in ("w0", "w1"))
    pre = xv @ w0.T
    g_out = 2 * (np.maximum(pre, 0) @ w1.T)
    np.testing.assert_allclose(one["w0"], ((g_out @ w1) * (pre > 0)).T @ xv, rtol=1e-3, atol=1e-2)
