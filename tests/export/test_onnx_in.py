"""`onnx_load`: each supported operator, an MLP, a convnet and a two-block transformer encoder,
imported, compiled and run by einjit, match ONNX Runtime to 1e-5; imported models fine-tune and
export to C."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX import tests need the onnx package (extra 'onnx')")
ort = pytest.importorskip("onnxruntime", reason="ONNX import tests need onnxruntime")

import onnx_graphs  # noqa: E402
from digits_models import build, run_main  # noqa: E402
from einjit.export import ExportError, export_c, export_onnx, onnx_load  # noqa: E402

RNG_SEED = 0


def _ort(m, values: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, values)


def _einjit(tmp_path, m, values, dims=1):
    path = tmp_path / "model.onnx"
    onnx.save(m, path)
    imported = onnx_load(path, dims=dims)
    step = imported.forward_step()
    outs = step(*[values[n] for n in imported.inputs])
    return imported, step, [outs] if not isinstance(outs, tuple) else list(outs)


@pytest.mark.parametrize("op", sorted(onnx_graphs.single_ops(np.random.default_rng(RNG_SEED))))
def test_operator_matches_onnxruntime(tmp_path, op):
    """Each operator imported matches ONNX Runtime, then exports to C, builds, and the example
    program computes the same outputs from the inputs in a file."""
    m, values = onnx_graphs.single_ops(np.random.default_rng(RNG_SEED))[op]
    want = _ort(m, values)
    imported, step, got = _einjit(tmp_path, m, values)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.reshape(w.shape), w, rtol=1e-5, atol=1e-5)
    lib = export_c(step, tmp_path / "c", name="op")
    build(lib.directory)
    record = np.concatenate([np.zeros(0, np.float32)]
                            + [np.asarray(values[n], np.float32).reshape(-1) for n in imported.inputs])
    out = run_main(lib.directory, record[None, :], sum(w.size for w in want))
    np.testing.assert_allclose(out[0], np.concatenate([w.reshape(-1) for w in want]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", ["mlp", "convnet", "transformer"])
def test_model_matches_onnxruntime_then_exports_to_c(tmp_path, which):
    m, values = getattr(onnx_graphs, which)(np.random.default_rng(RNG_SEED))
    batch = next(iter(values.values())).shape[0]
    want = _ort(m, values)
    imported, step, got = _einjit(tmp_path, m, values, dims=batch)
    np.testing.assert_allclose(got[0].reshape(want[0].shape), want[0], rtol=1e-5, atol=1e-5)
    lib = export_c(step, tmp_path / "c", name=which)
    assert lib.outputs[0].dims == want[0].shape


def test_imported_mlp_fine_tunes(tmp_path):
    """Parameters are einjit parameters: a few SGD steps lower the loss of the imported MLP."""
    import einjit as ej
    from einjit import fit, nn, train
    m, values = onnx_graphs.mlp(np.random.default_rng(RNG_SEED))
    path = tmp_path / "mlp.onnx"
    onnx.save(m, path)
    imported = onnx_load(path, dims=4)
    assert sorted(imported.params) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    logits = imported.outputs["logits"]
    y = ej.input("y", batch_dims=[], output_dims=[4, 10])
    loss = ej.mean(ej.relu(1 - y * logits), label="loss")
    step = fit.train_step(loss, train.sgd_update(loss, 0.05), inputs=[imported.inputs["input"], y])
    target = nn.one_hot(np.array([1, 2, 3, 4]), 10) * 2 - 1
    losses = []
    for _ in range(5):
        step(values["input"], target)
        losses.append(step.loss_value())
    assert losses[-1] < losses[0]


def test_unsupported_operator_is_named(tmp_path):
    from onnx import helper
    m = onnx_graphs.model([helper.make_node("Cos", ["x"], ["y"], name="the_cos")], [("x", [2])], [("y", [2])])
    path = tmp_path / "cos.onnx"
    onnx.save(m, path)
    with pytest.raises(ExportError, match=r"operator 'Cos' of node 'the_cos' is not supported; supported operators: "
                                          r"Add, AveragePool, Cast, Concat, .*Gemm, .*Unsqueeze$"):
        onnx_load(path)


def test_symbolic_dims_and_unreadable_file(tmp_path):
    m, _ = onnx_graphs.mlp(np.random.default_rng(RNG_SEED))
    path = tmp_path / "mlp.onnx"
    onnx.save(m, path)
    assert onnx_load(path, dims={"N": 3}).inputs["input"].dims == (3, 1, 8, 8)
    with pytest.raises(ExportError, match="symbolic dim 'N'"):
        onnx_load(path, dims={"M": 3})
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    with pytest.raises(ExportError, match="cannot read"):
        onnx_load(tmp_path / "bad.onnx")


def _torch_models():
    torch = pytest.importorskip("torch", reason="the PyTorch-exported models need torch")
    torch.manual_seed(0)
    nn = torch.nn
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    conv = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, activation="gelu",
                                       batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    return torch, {"mlp": (mlp, (2, 1, 8, 8)), "convnet": (conv, (2, 1, 8, 8)), "transformer": (encoder, (1, 5, 8))}


@pytest.mark.parametrize("which", ["mlp", "convnet", "transformer"])
def test_pytorch_exported_model(tmp_path, which):
    """torch.onnx.export's TorchScript exporter (the dynamo one needs onnxscript): the graphs
    it writes — with Shape/Slice/Cast/Unsqueeze shape computations for the encoder — import,
    match ONNX Runtime to 1e-5 and export to C."""
    import warnings
    torch, models = _torch_models()
    module, shape = models[which]
    x = torch.randn(*shape)
    path = tmp_path / f"{which}.onnx"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module.eval(), (x,), str(path), dynamo=False, opset_version=17)
    except (ImportError, RuntimeError, TypeError) as e:
        pytest.skip(f"torch.onnx.export cannot run here: {e}")
    m = onnx.load(path)
    values = {m.graph.input[0].name: x.numpy()}
    want = _ort(m, values)
    imported = onnx_load(path)
    step = imported.forward_step(f"torch_{which}")
    got = step(x.numpy())
    np.testing.assert_allclose(got.reshape(want[0].shape), want[0], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        np.testing.assert_allclose(got.reshape(want[0].shape), module(x).numpy(), rtol=1e-4, atol=1e-5)
    export_c(step, tmp_path / "c", name=f"torch_{which}")
    again = export_onnx(step, tmp_path / "again.onnx")
    np.testing.assert_allclose(_ort(again, {again.graph.input[0].name: x.numpy()})[0], want[0], rtol=1e-5, atol=1e-5)
    ops = [n.op_type for n in again.graph.node]
    assert (ops.count("LayerNormalization"), ops.count("Softmax")) == ((4, 2) if which == "transformer" else (0, 0))


def test_gather_of_input_ids_is_an_embedding_lookup(tmp_path):
    """Token ids as an int64 graph input: Gather becomes ej.take; the result matches ONNX
    Runtime, and the C export takes the ids as its integer input."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(RNG_SEED)
    table = rng.standard_normal((7, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["embed.weight", "ids"], ["e"], axis=0), helper.make_node("Relu", ["e"], ["y"])],
        "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])], [numpy_helper.from_array(table,
                                                                                                    "embed.weight")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    ids = np.array([[1, 6, 0], [3, 3, 5]], np.int64)
    want = _ort(m, {"ids": ids})[0]
    path = tmp_path / "embed.onnx"
    onnx.save(m, path)
    imported = onnx_load(path)
    step = imported.forward_step()
    np.testing.assert_array_equal(step(ids).reshape(want.shape), want)
    lib = export_c(step, tmp_path / "c", name="embed")
    assert lib.inputs[0].c_type == "int" and lib.inputs[0].dims == (2, 3, 1)
    build(lib.directory)
    ids.astype(np.int32).tofile(lib.directory / "ids.bin")
    subprocess.run(["./main", "ids.bin", "y.bin"], cwd=lib.directory, check=True)
    np.testing.assert_array_equal(np.fromfile(lib.directory / "y.bin", np.float32).reshape(want.shape), want)
