"""ONNX graphs built with `onnx.helper`: one per supported operator, and an MLP, a convnet and a
two-block transformer encoder (the graphs PyTorch's exporter writes for them, built by hand so
the tests need neither torch nor its exporter's extra packages)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def model(nodes, inputs, outputs, inits=(), opset: int = OPSET) -> onnx.ModelProto:
    """A checked model; `inputs`/`outputs` are (name, shape) pairs, `inits` (name, array) pairs."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def rand(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def single_ops(rng) -> dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]]:
    """Per operator: a small model using it and its input values."""
    x = rand(rng, 2, 3, 4)
    img = rand(rng, 2, 3, 6, 6)
    out: dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]] = {}

    def add(name, nodes, inputs, outputs, inits=(), values=None, opset=OPSET):
        out[name] = (model(nodes, inputs, outputs, inits, opset), values)

    for op in ("Add", "Sub", "Mul", "Div"):
        add(op, [helper.make_node(op, ["x", "b"], ["y"])], [("x", [2, 3, 4])], [("y", [2, 3, 4])],
            [("b", rand(rng, 3, 1) + (3.0 if op == "Div" else 0.0))], {"x": x})
    add("Relu", [helper.make_node("Relu", ["x"], ["y"])], [("x", [2, 3, 4])], [("y", [2, 3, 4])], values={"x": x})
    add("Gelu", [helper.make_node("Gelu", ["x"], ["y"])], [("x", [2, 3, 4])], [("y", [2, 3, 4])], values={"x": x},
        opset=20)
    add("Gelu-tanh", [helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")], [("x", [2, 3, 4])],
        [("y", [2, 3, 4])], values={"x": x}, opset=20)
    add("ReduceMax", [helper.make_node("ReduceMax", ["x"], ["y"], axes=[1], keepdims=0)], [("x", [2, 3, 4])],
        [("y", [2, 4])], values={"x": x})
    add("ReduceMax-18", [helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=1)], [("x", [2, 3, 4])],
        [("y", [2, 3, 1])], [("axes", np.array([-1], np.int64))], {"x": x}, opset=18)
    add("Erf-GELU", [helper.make_node("Div", ["x", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                     helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["x", "p"], ["m"]),
                     helper.make_node("Mul", ["m", "half"], ["y"])],
        [("x", [2, 3, 4])], [("y", [2, 3, 4])],
        [("sqrt2", np.float32(np.sqrt(2))), ("one", np.float32(1)), ("half", np.float32(0.5))], {"x": x})
    add("MatMul", [helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [2, 3, 4])], [("y", [2, 3, 5])],
        [("w", rand(rng, 4, 5))], {"x": x})
    add("Gemm", [helper.make_node("Gemm", ["a", "w", "c"], ["y"], transB=1, alpha=0.5, beta=2.0)],
        [("a", [2, 4])], [("y", [2, 5])], [("w", rand(rng, 5, 4)), ("c", rand(rng, 5))], {"a": rand(rng, 2, 4)})
    add("Conv", [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                  strides=[2, 2])],
        [("x", [2, 3, 6, 6])], [("y", [2, 4, 3, 3])], [("w", rand(rng, 4, 3, 3, 3)), ("b", rand(rng, 4))],
        {"x": img})
    add("Softmax", [helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", [2, 3, 4])], [("y", [2, 3, 4])],
        values={"x": x})
    add("LogSoftmax", [helper.make_node("LogSoftmax", ["x"], ["y"], axis=-1)], [("x", [2, 3, 4])],
        [("y", [2, 3, 4])], values={"x": x})
    add("Log", [helper.make_node("Log", ["x"], ["y"])], [("x", [2, 3, 4])], [("y", [2, 3, 4])],
        values={"x": np.abs(x) + 0.5})
    add("LayerNormalization", [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], epsilon=1e-5)],
        [("x", [2, 3, 4])], [("y", [2, 3, 4])], [("g", rand(rng, 4)), ("b", rand(rng, 4))], {"x": x})
    add("MaxPool", [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
        [("x", [2, 3, 6, 6])], [("y", [2, 3, 3, 3])], values={"x": img})
    add("AveragePool", [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[1, 1])],
        [("x", [2, 3, 6, 6])], [("y", [2, 3, 4, 4])], values={"x": img})
    add("GlobalAveragePool", [helper.make_node("GlobalAveragePool", ["x"], ["y"])], [("x", [2, 3, 6, 6])],
        [("y", [2, 3, 1, 1])], values={"x": img})
    add("Flatten", [helper.make_node("Flatten", ["x"], ["y"], axis=1)], [("x", [2, 3, 6, 6])], [("y", [2, 108])],
        values={"x": img})
    add("Reshape", [helper.make_node("Reshape", ["x", "s"], ["y"])], [("x", [2, 3, 4])], [("y", [4, 6])],
        [("s", np.array([4, -1], np.int64))], {"x": x})
    add("Transpose", [helper.make_node("Transpose", ["x"], ["y"], perm=[2, 0, 1])], [("x", [2, 3, 4])],
        [("y", [4, 2, 3])], values={"x": x})
    add("Gather", [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], [], [("y", [2, 3, 4])],
        [("table", rand(rng, 7, 4)), ("ids", np.array([[1, 6, 1], [0, -1, 3]], np.int64))], {})
    add("Concat", [helper.make_node("Concat", ["x", "c"], ["y"], axis=1)], [("x", [2, 3, 4])], [("y", [2, 5, 4])],
        [("c", rand(rng, 2, 2, 4))], {"x": x})
    add("Constant", [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(rand(rng, 4), "c")),
                     helper.make_node("Add", ["x", "c"], ["y"])], [("x", [2, 3, 4])], [("y", [2, 3, 4])],
        values={"x": x})
    add("Slice", [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"])], [("x", [2, 3, 4])],
        [("y", [2, 3, 2])], [("starts", np.array([1], np.int64)), ("ends", np.array([3], np.int64)),
                             ("axes", np.array([-1], np.int64))], {"x": x})
    add("Unsqueeze-Squeeze", [helper.make_node("Unsqueeze", ["x", "axes"], ["u"]),
                              helper.make_node("Squeeze", ["u", "axes"], ["y"])],
        [("x", [2, 3, 4])], [("y", [2, 3, 4])], [("axes", np.array([1], np.int64))], {"x": x})
    add("Shape-Cast-Mod", [helper.make_node("Shape", ["x"], ["s"]),
                           helper.make_node("Cast", ["s"], ["f"], to=TensorProto.FLOAT),
                           helper.make_node("Cast", ["f"], ["i"], to=TensorProto.INT64),
                           helper.make_node("Mod", ["i", "three"], ["m"]),
                           helper.make_node("Slice", ["m", "zero", "one"], ["lead"]),
                           helper.make_node("Concat", ["lead", "minus1"], ["target"], axis=0),
                           helper.make_node("Reshape", ["x", "target"], ["y"])],
        [("x", [2, 3, 4])], [("y", [2, 12])],
        [("three", np.array([3], np.int64)), ("minus1", np.array([-1], np.int64)),
         ("zero", np.array([0], np.int64)), ("one", np.array([1], np.int64))], {"x": x})
    return out


def mlp(rng) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """torch: Flatten -> Linear(64, 32) -> ReLU -> Linear(32, 10), as its exporter writes it."""
    nodes = [helper.make_node("Flatten", ["input"], ["flat"], axis=1),
             helper.make_node("Gemm", ["flat", "fc1.weight", "fc1.bias"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["logits"], transB=1)]
    inits = [("fc1.weight", 0.2 * rand(rng, 32, 64)), ("fc1.bias", rand(rng, 32)),
             ("fc2.weight", 0.2 * rand(rng, 10, 32)), ("fc2.bias", rand(rng, 10))]
    return model(nodes, [("input", ["N", 1, 8, 8])], [("logits", ["N", 10])], inits), {"input": rand(rng, 4, 1, 8, 8)}


def convnet(rng) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """torch: Conv(1->8, 3, pad 1) -> ReLU -> MaxPool 2 -> Conv(8->16, 3, pad 1) -> ReLU -> global
    average pool -> Flatten -> Linear(16, 10)."""
    nodes = [helper.make_node("Conv", ["input", "c1.weight", "c1.bias"], ["c1"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "c2.weight", "c2.bias"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"], axis=1),
             helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], transB=1)]
    inits = [("c1.weight", 0.3 * rand(rng, 8, 1, 3, 3)), ("c1.bias", rand(rng, 8)),
             ("c2.weight", 0.1 * rand(rng, 16, 8, 3, 3)), ("c2.bias", rand(rng, 16)),
             ("fc.weight", 0.3 * rand(rng, 10, 16)), ("fc.bias", rand(rng, 10))]
    return (model(nodes, [("input", ["N", 1, 8, 8])], [("logits", ["N", 10])], inits),
            {"input": rand(rng, 2, 1, 8, 8)})


def transformer(rng, seq: int = 5, d: int = 8, heads: int = 2, ff: int = 16, vocab: int = 11
                ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Two post-norm encoder blocks (torch.nn.TransformerEncoderLayer, GELU, batch_first) over a
    token embedding (Gather of constant token ids) plus the input: self-attention through
    MatMul/Reshape/Transpose/Softmax, LayerNormalization, an Erf-form GELU feed-forward."""
    dh = d // heads
    nodes = [helper.make_node("Gather", ["embed.weight", "tokens"], ["emb"], axis=0),
             helper.make_node("Add", ["emb", "input"], ["x0"])]
    inits = [("embed.weight", rand(rng, vocab, d)), ("tokens", rng.integers(0, vocab, (1, seq)).astype(np.int64)),
             ("heads_shape", np.array([1, seq, heads, dh], np.int64)), ("model_shape", np.array([1, seq, d], np.int64)),
             ("scale", np.float32(1 / np.sqrt(dh))), ("sqrt2", np.float32(np.sqrt(2))), ("one", np.float32(1)),
             ("half", np.float32(0.5))]
    x = "x0"
    for b in range(2):
        p = f"layers.{b}"

        def lin(src, name, n_in, n_out, p=p):
            inits.extend([(f"{p}.{name}.weight", (rand(rng, n_in, n_out) / np.sqrt(n_in)).astype(np.float32)),
                          (f"{p}.{name}.bias", 0.1 * rand(rng, n_out))])
            nodes.extend([helper.make_node("MatMul", [src, f"{p}.{name}.weight"], [f"{p}.{name}.mm"]),
                          helper.make_node("Add", [f"{p}.{name}.mm", f"{p}.{name}.bias"], [f"{p}.{name}"])])
            return f"{p}.{name}"

        heads_of = {}
        for proj in ("q", "k", "v"):
            y = lin(x, proj, d, d)
            nodes.extend([helper.make_node("Reshape", [y, "heads_shape"], [f"{y}.split"]),
                          helper.make_node("Transpose", [f"{y}.split"], [f"{y}.heads"],
                                           perm=[0, 2, 3, 1] if proj == "k" else [0, 2, 1, 3])])
            heads_of[proj] = f"{y}.heads"
        nodes.extend([helper.make_node("MatMul", [heads_of["q"], heads_of["k"]], [f"{p}.scores"]),
                      helper.make_node("Mul", [f"{p}.scores", "scale"], [f"{p}.scaled"]),
                      helper.make_node("Softmax", [f"{p}.scaled"], [f"{p}.attn"], axis=-1),
                      helper.make_node("MatMul", [f"{p}.attn", heads_of["v"]], [f"{p}.ctx"]),
                      helper.make_node("Transpose", [f"{p}.ctx"], [f"{p}.ctx_t"], perm=[0, 2, 1, 3]),
                      helper.make_node("Reshape", [f"{p}.ctx_t", "model_shape"], [f"{p}.merged"])])
        o = lin(f"{p}.merged", "out_proj", d, d)

        def norm(src, name, p=p):
            inits.extend([(f"{p}.{name}.weight", 1 + 0.1 * rand(rng, d)), (f"{p}.{name}.bias", 0.1 * rand(rng, d))])
            nodes.append(helper.make_node("LayerNormalization", [src, f"{p}.{name}.weight", f"{p}.{name}.bias"],
                                          [f"{p}.{name}"], axis=-1, epsilon=1e-5))
            return f"{p}.{name}"

        nodes.append(helper.make_node("Add", [x, o], [f"{p}.res1"]))
        h = norm(f"{p}.res1", "norm1")
        f1 = lin(h, "linear1", d, ff)
        nodes.extend([helper.make_node("Div", [f1, "sqrt2"], [f"{p}.gd"]),
                      helper.make_node("Erf", [f"{p}.gd"], [f"{p}.ge"]),
                      helper.make_node("Add", [f"{p}.ge", "one"], [f"{p}.gp"]),
                      helper.make_node("Mul", [f1, f"{p}.gp"], [f"{p}.gm"]),
                      helper.make_node("Mul", [f"{p}.gm", "half"], [f"{p}.gelu"])])
        f2 = lin(f"{p}.gelu", "linear2", ff, d)
        nodes.append(helper.make_node("Add", [h, f2], [f"{p}.res2"]))
        x = norm(f"{p}.res2", "norm2")
    nodes.append(helper.make_node("Identity", [x], ["output"]))
    return (model(nodes, [("input", [1, seq, d])], [("output", [1, seq, d])], inits),
            {"input": rand(rng, 1, seq, d)})
