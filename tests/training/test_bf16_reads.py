"""Every path that hands a bf16 node's values to a user reads them as float32 values, and every
path that writes user data into a bf16 input rounds the values: a bf16 cell is a uint16 bit
pattern, which read or written as a number is a silently wrong value (1.0 is the pattern
0x3F80 = 16256; the pattern 1 is 9.2e-41)."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import checkpoint, data, fit, train
from einjit.ir import bf16, ops

VALUES = np.array([[1.5, -2.0, 3.0], [0.1, 259.0, -7.3]], np.float32)


def _doubler():
    x = ej.input("x", batch_dims=[2], output_dims=[3], prec="bf16")
    with ej.default_precision("bf16"):
        out = x * 3.0
    assert out.value_tn.prec is ops.bf16
    return x, out


def test_forward_step_returns_bf16_outputs_as_float32_values():
    x, out = _doubler()
    step = fit.forward_step(out, inputs=[x], name="bf16_forward")
    got = step(VALUES)
    want = bf16.round_to_bf16(bf16.round_to_bf16(VALUES) * np.float32(3.0))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(out.numpy(), want)
    np.testing.assert_array_equal(np.asarray(out), want)
    np.testing.assert_array_equal(fit.predict(step, np.concatenate([VALUES, VALUES[:1]])),
                                  np.concatenate([want, want[:1]]))


@pytest.mark.parametrize("dtype", [np.uint16, np.uint8, np.int32, np.float64])
def test_step_writes_values_into_bf16_inputs_not_bit_patterns(dtype):
    """A uint16 array was copied straight into the cells (the input read 1 as 9.2e-41)."""
    x, out = _doubler()
    step = fit.forward_step(out, inputs=[x], name=f"bf16_in_{np.dtype(dtype).name}")
    numbers = np.array([[1, 2, 3], [4, 5, 200]], dtype)
    np.testing.assert_array_equal(step(numbers), bf16.round_to_bf16(numbers.astype(np.float32) * 3))
    np.testing.assert_array_equal(x.numpy(), numbers.astype(np.float32))


def test_loader_batches_and_losses_of_a_bf16_model():
    """`fit.fit` gathers rows into the inputs and reads the loss cell itself: both in values."""
    rng = np.random.default_rng(0)
    xs = rng.integers(0, 3, (8, 3)).astype(np.uint16)
    ys = rng.standard_normal((8, 1)).astype(np.float32)
    with ej.default_precision("bf16"):
        x = ej.input("x", batch_dims=[4], output_dims=[3])
        y = ej.input("y", batch_dims=[4], output_dims=[1])
        w = ej.param("w", input_dims=[3], output_dims=[1], values=[[0.5, -0.25, 1.0]])
        loss = ej.mean((w @ x - y) ** 2)
    assert loss.value_tn.prec is ops.bf16
    train.init_params(loss, seed=0)
    step = fit.train_step(loss, train.sgd_update(loss, 0.0), inputs=[x, y], name="bf16_loss")
    history = fit.fit(step, data.Loader(xs, ys, batch_size=4, shuffle=False), epochs=1)
    wv = np.array([0.5, -0.25, 1.0], np.float32)
    per_batch = [np.mean((xs[k:k + 4].astype(np.float32) @ wv - ys[k:k + 4, 0]) ** 2) for k in (0, 4)]
    assert history.losses[0] == pytest.approx(np.mean(per_batch), rel=2e-2)
    assert step.loss_value() == pytest.approx(per_batch[1], rel=2e-2)
    np.testing.assert_array_equal(x.numpy(), xs[4:].astype(np.float32))


def test_printing_and_checkpoints_show_values(tmp_path):
    with ej.default_precision("bf16"):
        p = ej.param("p", output_dims=[3], values=[0.1, 1.0, -7.3])
    train.init_params(p)
    text = str(p)
    assert "-7.3125" in text and "1." in text and "16256" not in text
    checkpoint.save(p, tmp_path / "p.safetensors")
    saved = checkpoint.read(tmp_path / "p.safetensors")
    assert [a.dtype for a in saved.values()] == [np.float32]
    np.testing.assert_array_equal(next(iter(saved.values())), [0.10009765625, 1.0, -7.3125])
    p.set_values([0.0, 0.0, 0.0])
    checkpoint.load(p, tmp_path / "p.safetensors")
    np.testing.assert_array_equal(p.numpy(), [0.10009765625, 1.0, -7.3125])


def test_onnx_export_of_bf16_weights_holds_their_values(tmp_path):
    onnx = pytest.importorskip("onnx", reason="ONNX export needs the onnx package (extra 'onnx')")
    from onnx import numpy_helper

    from einjit.export import export_onnx

    x = ej.input("x", batch_dims=[2], output_dims=[3])
    with ej.default_precision("bf16"):
        w = ej.param("w", input_dims=[3], output_dims=[2], values=[[0.1, 1.0, -7.3], [2.0, 3.0, 4.0]])
    out = w @ x
    train.init_params(out)
    proto = export_onnx([out], tmp_path / "m.onnx", inputs=[x])
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    found = [v for v in inits.values() if v.size == 6]
    assert len(found) == 1
    np.testing.assert_array_equal(np.sort(found[0].reshape(-1)),
                                  np.sort(bf16.round_to_bf16([0.1, 1.0, -7.3, 2.0, 3.0, 4.0])))
    assert onnx is not None
