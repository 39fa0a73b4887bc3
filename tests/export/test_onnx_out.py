"""`export_onnx`: the digits MLP and convnet, trained a few steps, written as ONNX: the checker
accepts them, ONNX Runtime matches einjit to 1e-5, contractions become Gemm/Conv; softmax,
layer norm and GELU become their ONNX operators; and the round trip through `onnx_load`."""

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


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


def _block(batch: int, approximate: str = "none"):
    """Layer norm, a matmul, GELU, a softmax over the last axis and one over the middle axis."""
    from einjit import train
    x = ej.input("tokens", batch_dims=[batch, 3], output_dims=[4])
    ln = ej.nn.LayerNorm(4, label="ln")
    w = ej.param("w", output_dims=[4], input_dims=[4])
    h = ej.gelu(w @ ln(x), approximate, label="h")
    probs = ej.softmax(h, label="probs")
    across = ej.softmax(h, 1, label="across")
    train.init_params(probs, seed=0)
    gamma, beta = ln.params()
    gamma.set_values(np.linspace(0.5, 2.0, 4, dtype=np.float32))
    beta.set_values(np.linspace(-0.3, 0.3, 4, dtype=np.float32))
    return x, fit.forward_step([probs, across], inputs=[x])


def _check_ort(path, step, xs) -> None:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    wants = step(xs)
    wants = wants if isinstance(wants, tuple) else (wants,)
    for got, want in zip(session.run(None, {session.get_inputs()[0].name: xs}), wants, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [17, 18, 20])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("batch", [1, 2])
def test_softmax_layer_norm_and_gelu_are_onnx_operators(tmp_path, opset, approximate, batch):
    """einjit's softmax and nn.LayerNorm compositions become `Softmax` and
    `LayerNormalization` (with its scale, shift and epsilon), also at batch 1 where size-1
    axes are fixed indices; GELU becomes `Gelu` from opset 20, its formula before; ONNX Runtime
    and the round trip through onnx_load match einjit."""
    if opset > onnx.defs.onnx_opset_version() or (opset >= 20 and _version(ort.__version__) < (1, 17)):
        pytest.skip(f"opset {opset} needs onnx >= 1.15 and onnxruntime >= 1.17")
    _, step = _block(batch, approximate)
    path = tmp_path / "block.onnx"
    proto = export_onnx(step, path, opset=opset)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    assert proto.opset_import[0].version == opset
    nodes = {n.op_type: n for n in proto.graph.node}
    assert [n.op_type for n in proto.graph.node].count("Softmax") == 2
    assert sorted(onnx.helper.get_attribute_value(a) for n in proto.graph.node if n.op_type == "Softmax"
                  for a in n.attribute) == [1, 2]
    norm = nodes["LayerNormalization"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in norm.attribute}
    assert attrs["axis"] == 2 and attrs["epsilon"] == pytest.approx(1e-5)
    assert list(norm.input[1:]) == ["ln_gamma", "ln_beta"]
    # The primitives the compositions are built from are gone.
    primitives = {"ReduceMax", "Exp", "Sqrt", "Reciprocal", "Sub"} | ({"Div"} if opset >= 20 else set())
    assert not primitives & set(nodes)
    if opset >= 20:
        assert onnx.helper.get_attribute_value(nodes["Gelu"].attribute[0]).decode() == approximate
    else:
        assert "Gelu" not in nodes and ("Tanh" if approximate == "tanh" else "Erf") in nodes
    assert [o.name for o in proto.graph.output] == ["probs", "across"]
    xs = np.random.default_rng(0).standard_normal((batch, 3, 4)).astype(np.float32)
    _check_ort(path, step, xs)
    imported = onnx_load(path)
    back = imported.forward_step(f"block_back_{opset}")
    for got, want in zip(back(xs), step(xs), strict=True):
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)
    again = export_onnx(back, tmp_path / "again.onnx", opset=opset)
    fused = ("Softmax", "LayerNormalization", "Gelu")
    assert sorted(n.op_type for n in again.graph.node if n.op_type in fused) == \
        sorted(n.op_type for n in proto.graph.node if n.op_type in fused)
    _check_ort(tmp_path / "again.onnx", step, xs)


def test_log_softmax_is_an_onnx_operator(tmp_path):
    """ej.log_softmax becomes `LogSoftmax` over its axis; ONNX Runtime and the round trip match."""
    x = ej.input("x", batch_dims=[2], output_dims=[3, 5])
    step = fit.forward_step(ej.log_softmax(x * 3.0, 1, label="logp"), inputs=[x])
    path = tmp_path / "logp.onnx"
    proto = export_onnx(step, path)
    (node,) = [n for n in proto.graph.node if n.op_type == "LogSoftmax"]
    assert onnx.helper.get_attribute_value(node.attribute[0]) == 1
    assert not {"Exp", "Log", "ReduceMax"} & {n.op_type for n in proto.graph.node}
    xs = np.random.default_rng(2).standard_normal((2, 3, 5)).astype(np.float32)
    _check_ort(path, step, xs)
    back = onnx_load(path).forward_step("logp_back")
    np.testing.assert_allclose(back(xs).reshape(2, 3, 5), step(xs), rtol=1e-5, atol=1e-6)


def test_near_misses_stay_primitives(tmp_path):
    """Compositions that are not a softmax or a layer norm — a ratio to a sum, a centering
    scaled by a learned vector, a softmax of a 2-axis reduction — keep their primitives and
    still match."""
    from einjit import train
    x = ej.input("x", batch_dims=[2], output_dims=[3, 4])
    e = ej.exp(x, label="e")
    ratio = e / ej.sum(e, axis=-1, keepdims=True)
    centered = x - ej.mean(x, axis=-1, keepdims=True)
    w = ej.param("w", output_dims=[4])
    y = ej.add(ratio, centered * w, label="y")
    train.init_params(y, seed=0)
    step = fit.forward_step(y, inputs=[x])
    proto = export_onnx(step, tmp_path / "near.onnx")
    ops = {n.op_type for n in proto.graph.node}
    assert not ops & {"Softmax", "LayerNormalization"}
    _check_ort(tmp_path / "near.onnx", step, np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32))


def test_refusals(tmp_path):
    _, step = _block(2)
    with pytest.raises(ExportError, match="opset 16 is not supported"):
        export_onnx(step, tmp_path / "old.onnx", opset=16)
    x = ej.input("tokens", batch_dims=[2, 3], output_dims=[4])
    noisy = ej.uniform(x, seed=0, label="noise") + x
    with pytest.raises(ExportError, match=r"tensor 'noise', operation"):
        export_onnx(noisy, tmp_path / "noise.onnx", inputs=[x])
