"""`export_onnx`: the digits MLP and convnet, trained a few steps, written as ONNX: the checker
accepts them, ONNX Runtime matches einjit to 1e-5, contractions become Gemm/Conv; and the
round trip through `onnx_load`."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX export tests need the onnx package (extra 'onnx')")
ort = pytest.importorskip("onnxruntime", reason="ONNX export tests need onnxruntime")

import einjit as ej  # noqa: E402
from digits_models import images, trained  # noqa: E402
from einjit import fit  # noqa: E402
from einjit.export import ExportError, export_onnx, onnx_load  # noqa: E402


def _run(path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("kind", ["mlp", "convnet"])
def test_digits_models_run_in_onnxruntime(tmp_path, kind):
    model = trained(kind)
    step = fit.predictor(model, batch_dims=[8], output_dims=[1, 8, 8])
    path = tmp_path / f"{kind}.onnx"
    proto = export_onnx(step, path)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    ops = {n.op_type for n in proto.graph.node}
    assert "Gemm" in ops and ("Conv" in ops and "MaxPool" in ops if kind == "convnet" else True)
    assert proto.opset_import[0].version >= 17
    xs, _ = images(8, seed=4)
    np.testing.assert_allclose(_run(path, xs), step(xs), rtol=1e-5, atol=1e-5)
    back = onnx_load(path).forward_step(f"{kind}_round_trip")
    np.testing.assert_allclose(back(xs), step(xs), rtol=1e-5, atol=1e-5)


def test_softmax_layer_norm_gelu_and_refusal(tmp_path):
    x = ej.input("tokens", batch_dims=[2, 3], output_dims=[4])
    ln = ej.nn.LayerNorm(4, label="ln")
    w = ej.param("w", output_dims=[4], input_dims=[4])
    y = ej.softmax(ej.gelu(w @ ln(x)), label="probs")
    from einjit import train
    train.init_params(y, seed=0)
    step = fit.forward_step(y, inputs=[x])
    path = tmp_path / "block.onnx"
    export_onnx(step, path)
    xs = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(_run(path, xs), step(xs), rtol=1e-5, atol=1e-5)
    noisy = ej.uniform(x, seed=0, label="noise") + x
    with pytest.raises(ExportError, match=r"tensor 'noise', operation"):
        export_onnx(noisy, tmp_path / "noise.onnx", inputs=[x])
