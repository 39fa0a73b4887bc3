"""`onnx_load(path)`: an ONNX model as einjit tensors, to compile, run, fine-tune and export.

Every ONNX value becomes an einjit tensor whose axes are all output axes, in ONNX's order
(no batch or input rows), so its dims are the ONNX shape and every operator is one einsum spec
over those axes: NumPy broadcasting is a fixed index `0` on a size-1 axis, a convolution or a
pooling window an affine axis `stride*o+k-pad`, a reshape a flatten into one affine axis then
a split of it, a concatenation a sum of pieces, each its input read at an offset with zeros past its ends
(the padding of a window axis). Float initializers become
parameters (labelled by their ONNX names, split at dots, so `ej.save`/`ej.load` key them as ONNX
does); other initializers and `Constant` outputs are NumPy values the operators that need
constants (shapes, indices, axes) read at load time. The shape computations exporters write
(`Shape`, `Cast`, `Gather`, `Slice`, `Unsqueeze`, `Concat`, `Mod` and arithmetic on constants,
as in PyTorch's transformer encoder) are folded at load time into such constants.

Symbolic dims (a dynamic batch axis) are fixed at load (`dims=`; by default 1), since einjit
compiles for fixed sizes. `Gather` of ids given as an integer graph input is `ej.take` (an
embedding lookup); of constant ids, a contraction with a one-hot matrix, which selects rows
exactly.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from einjit.export.errors import ExportError
from einjit.tensor import activations, reductions
from einjit.tensor.gather import take
from einjit.tensor.inputs import input as new_input
from einjit.tensor.notation import Template, make_op
from einjit.tensor.operation import ndarray, param
from einjit.tensor.tensor import Tensor
from einjit.training import fit

Shape = tuple[int, ...]
Value = Tensor | np.ndarray

_BINARY = {
    "Add": ("+", "t =: t1 + t2", "g1 =+ g; g2 =+ g"),
    "Sub": ("-", "t =: t1 - t2", "g1 =+ g; g2 =- g"),
    "Mul": ("*", "t =: t1 * t2", "g1 =+ g * t2; g2 =+ t1 * g"),
    "Div": ("/", "t =: t1 / t2", "g1 =+ g / t2; g2 =- (g * t) / t2"),
    "Pow": ("**", "t =: t1 ** t2", "g1 =+ (t2 * t1 ** (t2 - 1)) * g; g2 =+ (t * log(t1)) * g"),
    "Max": ("max", "t =: max(t1, t2)", "g1 =+ where(t1 < t2, 0, g); g2 =+ where(t1 < t2, g, 0)"),
    "Min": ("min", "t =: min(t1, t2)", "g1 =+ where(t2 < t1, 0, g); g2 =+ where(t2 < t1, g, 0)"),
}
_UNARY = {
    "Relu": ("t =: relu(t1)", "g1 =+ t -?/ g"),
    "Erf": ("t =: erf(t1)", f"g1 =+ g * ({2 / math.sqrt(math.pi)!r} * exp(-(t1 * t1)))"),
    "Sqrt": ("t =: sqrt(t1)", "g1 =+ g / (2 * t)"),
    "Exp": ("t =: exp(t1)", "g1 =+ g * t"),
    "Log": ("t =: log(t1)", "g1 =+ g / t1"),
    "Tanh": ("t =: tanh(t1)", "g1 =+ g * (1 - t * t)"),
    "Sigmoid": ("t =: recip(1 + exp(-t1))", "g1 =+ g * (t * (1 - t))"),
    "Neg": ("t =: -t1", "g1 =- g"),
    "Reciprocal": ("t =: recip(t1)", "g1 =- g * (t * t)"),
    "Identity": ("t =: t1", "g1 =+ g"),
}
_CONTRACT = ("t =:+ t1 * t2", "g1 =+ g * t2; g2 =+ t1 * g")
_PERMUTE = ("t =:+ t1", "g1 =+ g")
_MAXPOOL = ("t =:^^ arg1(t1, t2)", "g1 =+ eq_gate(t1, t, g)")
_AVGPOOL = ("t =:+ t1 * t2", "g1 =+ g * t2")


@dataclass
class OnnxModel:
    """The imported graph: its inputs (`ej.input` tensors), outputs and parameters, by ONNX name."""

    inputs: dict[str, Tensor]
    outputs: dict[str, Tensor]
    params: dict[str, Tensor] = field(default_factory=dict)

    def forward_step(self, name: str = "onnx_forward") -> fit.ForwardStep:
        """The compiled forward routine: `step(*inputs)` returns the outputs."""
        return fit.forward_step(list(self.outputs.values()), inputs=list(self.inputs.values()), name=name)


def _labels(shape: Sequence[int]) -> list[str]:
    return [f"a{k}" for k in range(len(shape))]


def _slot(entries: Sequence[str]) -> str:
    """One output row in multi-character mode (the trailing comma keeps a one-axis row from
    being read as single-character axes)."""
    return ", ".join(entries) + ","


def _op(kind: str, children: list[Tensor], spec: str | None, templates: tuple[str, str | None], shape: Shape,
        label: str) -> Tensor:
    fwd, bwd = templates
    return make_op(kind, children, logic=spec, forward=Template(fwd), backprop=Template(bwd) if bwd else None,
                   label=label, batch_dims=[], input_dims=[], output_dims=list(shape))


class _Importer:
    """The ONNX graph walked node by node in order (ONNX graphs are topologically sorted)."""

    def __init__(self, graph, dims: Mapping[str, int] | int):
        from onnx import numpy_helper
        self.numpy_helper = numpy_helper
        self.graph = graph
        self.dims = dims
        self.values: dict[str, Value] = {}
        self.shapes: dict[str, Shape] = {}
        self.params: dict[str, Tensor] = {}
        self.initializers: set[str] = set()
        self.index_inputs: set[str] = set()
        self.node_name = ""

    # -- values

    def error(self, op: str, what: str) -> ExportError:
        return ExportError(f"einjit: onnx_load: node {self.node_name!r} ({op}): {what}")

    def tensor(self, name: str) -> Tensor:
        """`name` as a tensor: a float initializer becomes a parameter on first use."""
        v = self.values[name]
        if name in self.index_inputs:
            raise ExportError(f"einjit: onnx_load: node {self.node_name!r} reads the integer input {name!r}; integer "
                              f"inputs can only be the indices of a Gather")
        if isinstance(v, Tensor):
            return v
        arr = np.array(v, dtype=np.float32).reshape(self.shapes[name])
        if name in self.initializers:
            t = param(name.split("."), values=arr)
            self.params[name] = t
        else:
            t = ndarray(arr, label=name)
        self.values[name] = t
        return t

    def const(self, name: str, op: str) -> np.ndarray:
        v = self.values.get(name)
        if not isinstance(v, np.ndarray):
            raise self.error(op, f"input {name!r} must be a constant (an initializer or a Constant node)")
        return v

    def set(self, name: str, value: Value, shape: Shape) -> None:
        self.values[name] = value
        self.shapes[name] = shape

    def fixed(self, d, where: str) -> int:
        if d.HasField("dim_value"):
            return int(d.dim_value)
        if isinstance(self.dims, int):
            return self.dims
        if d.dim_param not in self.dims:
            raise ExportError(f"einjit: onnx_load: {where} has the symbolic dim {d.dim_param!r}: give its size with "
                              f"dims={{{d.dim_param!r}: ...}}")
        return int(self.dims[d.dim_param])

    # -- walking

    def run(self) -> OnnxModel:
        self.initializers = {init.name for init in self.graph.initializer}
        for init in self.graph.initializer:
            arr = self.numpy_helper.to_array(init)
            self.set(init.name, arr, tuple(arr.shape) or (1,))
        inputs = {}
        for vi in self.graph.input:
            if vi.name in self.values:
                continue
            ttype = vi.type.tensor_type
            shape = tuple(self.fixed(d, f"graph input {vi.name!r}") for d in ttype.shape.dim) or (1,)
            if ttype.elem_type in (6, 7):
                # Integer ids: int32 for `ej.take`, with a trailing size-1 axis to line up with the
                # table's gathered axis (a step takes arrays of the ONNX shape all the same).
                t = new_input(vi.name, batch_dims=[], output_dims=[*shape, 1], prec="int32")
                self.index_inputs.add(vi.name)
            elif ttype.elem_type == 1:
                t = new_input(vi.name, batch_dims=[], output_dims=list(shape))
            else:
                raise ExportError(f"einjit: onnx_load: graph input {vi.name!r} has element type {ttype.elem_type}; "
                                  f"only float inputs and int32/int64 ids (Gather indices) are supported")
            inputs[vi.name] = t
            self.set(vi.name, t, shape)
        for node in self.graph.node:
            self.node_name = node.name or (node.output[0] if node.output else node.op_type)
            handler = HANDLERS.get(node.op_type)
            if handler is None:
                raise ExportError(f"einjit: onnx_load: operator {node.op_type!r} of node {self.node_name!r} is not "
                                  f"supported; supported operators: {', '.join(sorted(HANDLERS))}")
            handler(self, node, _attributes(node))
        outputs = {}
        for vi in self.graph.output:
            outputs[vi.name] = self.tensor(vi.name)
        return OnnxModel(inputs, outputs, self.params)


def _attributes(node) -> dict[str, object]:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# ---------------------------------------------------------------- shapes and specs


def _broadcast(a: Shape, b: Shape, imp: _Importer, op: str) -> Shape:
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        raise imp.error(op, f"shapes {list(a)} and {list(b)} do not broadcast") from None


def _operand_slot(shape: Shape, out: Shape) -> str:
    """An operand's row against the result's axes (right-aligned): a size-1 axis against a
    larger one is the fixed index 0."""
    labels = _labels(out)[len(out) - len(shape):]
    return _slot(["0" if d == 1 and o != 1 else name for d, o, name in zip(shape, out[len(out) - len(shape):], labels,
                                                                           strict=True)])


def _pointwise(imp: _Importer, kind: str, templates: tuple[str, str | None], names: Sequence[str], out_name: str,
               op: str) -> None:
    shapes = [imp.shapes[n] for n in names]
    out = shapes[0]
    for s in shapes[1:]:
        out = _broadcast(out, s, imp, op)
    children = [imp.tensor(n) for n in names]
    spec = "; ".join(_operand_slot(s, out) for s in shapes) + " => " + _slot(_labels(out))
    imp.set(out_name, _op(kind, children, spec, templates, out, out_name), out)


def _binary(imp: _Importer, node, attrs) -> None:
    a, b = node.input
    va, vb = imp.values[a], imp.values[b]
    if _is_const(imp, a) and _is_const(imp, b):
        fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power,
              "Max": np.maximum, "Min": np.minimum}[node.op_type]
        res = fn(va, vb)
        imp.set(node.output[0], res, tuple(res.shape) or (1,))
        return
    kind, fwd, bwd = _BINARY[node.op_type]
    _pointwise(imp, kind, (fwd, bwd), [a, b], node.output[0], node.op_type)


def _unary(imp: _Importer, node, attrs) -> None:
    if node.op_type == "Identity" and _is_const(imp, node.input[0]):
        imp.set(node.output[0], imp.values[node.input[0]], imp.shapes[node.input[0]])
        return
    fwd, bwd = _UNARY[node.op_type]
    _pointwise(imp, node.op_type.lower(), (fwd, bwd), [node.input[0]], node.output[0], node.op_type)


def _gelu(imp: _Importer, node, attrs) -> None:
    approximate = attrs.get("approximate", b"none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else str(approximate)
    if approximate not in activations.GELU_APPROXIMATIONS:
        raise imp.error("Gelu", f"approximate={approximate!r}; supported: {', '.join(activations.GELU_APPROXIMATIONS)}")
    x = imp.tensor(node.input[0])
    imp.set(node.output[0], activations.gelu(x, approximate, label=node.output[0]), imp.shapes[node.input[0]])


def _matmul_spec(a: Shape, b: Shape, imp: _Importer, op: str) -> tuple[str, Shape]:
    if len(a) < 2 or len(b) < 2:
        raise imp.error(op, f"operands of rank {len(a)} and {len(b)}: only rank >= 2 is supported")
    if a[-1] != b[-2]:
        raise imp.error(op, f"inner dims differ: {list(a)} @ {list(b)}")
    batch = _broadcast(a[:-2], b[:-2], imp, op)
    names = [f"b{k}" for k in range(len(batch))]

    def bslot(s: Shape) -> list[str]:
        own = names[len(names) - len(s):]
        return ["0" if d == 1 and o != 1 else n for d, o, n in zip(s, batch[len(batch) - len(s):], own, strict=True)]

    spec = (f"{_slot(bslot(a[:-2]) + ['m', 'k'])}; {_slot(bslot(b[:-2]) + ['k', 'n'])} => "
            f"{_slot(names + ['m', 'n'])}")
    return spec, (*batch, a[-2], b[-1])


def _matmul(imp: _Importer, node, attrs) -> None:
    a, b = node.input
    spec, out = _matmul_spec(imp.shapes[a], imp.shapes[b], imp, "MatMul")
    imp.set(node.output[0], _op("einsum", [imp.tensor(a), imp.tensor(b)], spec, _CONTRACT, out, node.output[0]), out)


def _gemm(imp: _Importer, node, attrs) -> None:
    a, b = node.input[0], node.input[1]
    sa, sb = imp.shapes[a], imp.shapes[b]
    if len(sa) != 2 or len(sb) != 2:
        raise imp.error("Gemm", f"operands must be matrices, got {list(sa)} and {list(sb)}")
    ia = "k, m," if attrs.get("transA", 0) else "m, k,"
    ib = "n, k," if attrs.get("transB", 0) else "k, n,"
    m = sa[1] if attrs.get("transA", 0) else sa[0]
    n = sb[0] if attrs.get("transB", 0) else sb[1]
    out = (m, n)
    name = node.output[0]
    y = _op("einsum", [imp.tensor(a), imp.tensor(b)], f"{ia}; {ib} => m, n,", _CONTRACT, out, f"{name}.matmul")
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = _op("*", [y, ndarray(np.full((1,), alpha, np.float32), label=f"{name}.alpha")], "m, n,; 0, => m, n,",
                (_BINARY["Mul"][1], _BINARY["Mul"][2]), out, f"{name}.scaled")
    if len(node.input) < 3 or not node.input[2]:
        imp.set(name, y, out)
        return
    imp.set(f"{name}.ab", y, out)
    c = node.input[2]
    if beta != 1.0:
        imp.set(f"{name}.c", np.asarray(imp.const(c, "Gemm"), np.float32) * beta, imp.shapes[c])
        c = f"{name}.c"
    _pointwise(imp, "+", (_BINARY["Add"][1], _BINARY["Add"][2]), [f"{name}.ab", c], name, "Gemm")


def _window_axis(out: str, kernel: str, size: int, stride: int, dilation: int, before: int, after: int) -> str:
    o = out if stride == 1 else f"{stride}*{out}"
    k = "" if size == 1 else f"+{kernel}" if dilation == 1 else f"+{dilation}*{kernel}"
    if before == after:
        pad = f"-{before}" if before else "+0" if stride > 1 and size == 1 else ""
    else:
        pad = f"-{before}:{after}"
    return f"{o}{k}{pad}"


def _window(imp: _Importer, op: str, x: Shape, kernel: Sequence[int], attrs) -> tuple[list[str], Shape]:
    """The spatial entries of the input row and the output's spatial dims, for 2-D windows."""
    if len(x) != 4 or len(kernel) != 2:
        raise imp.error(op, f"only 2-D windows over (N, C, H, W) are supported, got input {list(x)}")
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise imp.error(op, f"auto_pad={attrs['auto_pad']!r} is not supported; give explicit pads")
    strides = list(attrs.get("strides", [1, 1]))
    dilations = list(attrs.get("dilations", [1, 1]))
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if attrs.get("ceil_mode", 0):
        raise imp.error(op, "ceil_mode=1 is not supported")
    entries, dims = [], []
    for k, (o, kn) in enumerate((("oh", "kh"), ("ow", "kw"))):
        before, after = pads[k], pads[k + 2]
        size = (x[2 + k] + before + after - dilations[k] * (kernel[k] - 1) - 1) // strides[k] + 1
        entries.append(_window_axis(o, kn, kernel[k], strides[k], dilations[k], before, after))
        dims.append(size)
    return entries, tuple(dims)


def _conv(imp: _Importer, node, attrs) -> None:
    x, w = node.input[0], node.input[1]
    sx, sw = imp.shapes[x], imp.shapes[w]
    if attrs.get("group", 1) != 1:
        raise imp.error("Conv", f"group={attrs['group']} is not supported (only group=1)")
    entries, (oh, ow) = _window(imp, "Conv", sx, sw[2:], attrs)
    kernel = [kn if size > 1 else "0" for kn, size in zip(("kh", "kw"), sw[2:], strict=True)]
    spec = f"n, ci, {entries[0]}, {entries[1]}; co, ci, {kernel[0]}, {kernel[1]} => n, co, oh, ow"
    out = (sx[0], sw[0], oh, ow)
    name = node.output[0]
    y = _op("conv", [imp.tensor(x), imp.tensor(w)], spec, _CONTRACT, out, name if len(node.input) < 3 else
            f"{name}.conv")
    if len(node.input) < 3 or not node.input[2]:
        imp.set(name, y, out)
        return
    b = imp.tensor(node.input[2])
    imp.set(name, _op("+", [y, b], "n, co, oh, ow; co, => n, co, oh, ow", (_BINARY["Add"][1], _BINARY["Add"][2]),
                      out, name), out)


def _pool(imp: _Importer, node, attrs) -> None:
    op = node.op_type
    x = node.input[0]
    sx = imp.shapes[x]
    kernel = list(attrs["kernel_shape"])
    if op == "MaxPool" and any(attrs.get("pads", [0])) or len(node.output) > 1 and node.output[1]:
        raise imp.error(op, "padding and the indices output are not supported for MaxPool")
    if op == "AveragePool" and any(attrs.get("pads", [0])) and not attrs.get("count_include_pad", 0):
        raise imp.error(op, "padding with count_include_pad=0 is not supported")
    entries, (oh, ow) = _window(imp, op, sx, kernel, attrs)
    spec = f"n, c, {entries[0]}, {entries[1]}; kh, kw => n, c, oh, ow"
    out = (sx[0], sx[1], oh, ow)
    fill = 0.0 if op == "MaxPool" else 1.0 / math.prod(kernel)
    window = ndarray(np.full(kernel, fill, np.float32), label=f"{node.output[0]}.window")
    templates = _MAXPOOL if op == "MaxPool" else _AVGPOOL
    imp.set(node.output[0], _op(op.lower(), [imp.tensor(x), window], spec, templates, out, node.output[0]), out)


def _global_average_pool(imp: _Importer, node, attrs) -> None:
    x = node.input[0]
    sx = imp.shapes[x]
    out = (*sx[:2], *[1] * (len(sx) - 2))
    names = _labels(sx)
    spec = f"{_slot(names)} => {_slot(names[:2] + ['0'] * (len(sx) - 2))}"
    summed = _op("sum", [imp.tensor(x)], spec, _PERMUTE, out, f"{node.output[0]}.sum")
    imp.set(f"{node.output[0]}.sum", summed, out)
    imp.set(f"{node.output[0]}.count", np.full((1,), 1.0 / math.prod(sx[2:]), np.float32), (1,))
    _pointwise(imp, "*", (_BINARY["Mul"][1], _BINARY["Mul"][2]), [f"{node.output[0]}.sum", f"{node.output[0]}.count"],
               node.output[0], "GlobalAveragePool")


def _reshape_to(imp: _Importer, name: str, out: Shape, out_name: str, op: str) -> None:
    """Row-major reshape: all axes flattened into one affine axis, then split into `out`'s."""
    shape = imp.shapes[name]
    if math.prod(shape) != math.prod(out):
        raise imp.error(op, f"cannot reshape {list(shape)} ({math.prod(shape)} values) to {list(out)}")
    if shape == out:
        imp.set(out_name, imp.values[name], out)
        return
    v = imp.values[name]
    if _is_const(imp, name):
        assert isinstance(v, np.ndarray)  # _is_const says so
        imp.set(out_name, v.reshape(out), out)
        return

    def affine(dims: Shape, names: list[str]) -> str:
        strides = [math.prod(dims[k + 1:]) for k in range(len(dims))]
        terms = [n if s == 1 else f"{s}*{n}" for n, s, d in zip(names, strides, dims, strict=True) if d > 1]
        return "+".join(terms) or "0"

    x = imp.tensor(name)
    total = (math.prod(shape),)
    ins = _labels(shape)
    flat = x if len(shape) == 1 else _op("flatten", [x], f"{_slot(ins)} => {affine(shape, ins)},", _PERMUTE,
                                         total, f"{out_name}.flat")
    if len(out) == 1:
        imp.set(out_name, flat, out)
        return
    outs = [f"r{k}" for k in range(len(out))]
    entries = [n if d > 1 else "0" for n, d in zip(outs, out, strict=True)]
    imp.set(out_name, _op("reshape", [flat], f"{affine(out, outs)}, => {_slot(entries)}", _PERMUTE, out,
                          out_name), out)


def _reshape(imp: _Importer, node, attrs) -> None:
    x = node.input[0]
    target = [int(d) for d in imp.const(node.input[1], "Reshape")]
    shape = imp.shapes[x]
    dims = [shape[k] if d == 0 and not attrs.get("allowzero", 0) else d for k, d in enumerate(target)]
    if dims.count(-1) > 1:
        raise imp.error("Reshape", f"shape {target} has more than one -1")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = math.prod(shape) // max(known, 1)
    _reshape_to(imp, x, tuple(dims), node.output[0], "Reshape")


def _flatten(imp: _Importer, node, attrs) -> None:
    x = node.input[0]
    shape = imp.shapes[x]
    axis = int(attrs.get("axis", 1)) % (len(shape) + 1)
    _reshape_to(imp, x, (math.prod(shape[:axis]), math.prod(shape[axis:])), node.output[0], "Flatten")


def _transpose(imp: _Importer, node, attrs) -> None:
    x = node.input[0]
    shape = imp.shapes[x]
    perm = list(attrs.get("perm", list(reversed(range(len(shape))))))
    out = tuple(shape[p] for p in perm)
    v = imp.values[x]
    if _is_const(imp, x):
        assert isinstance(v, np.ndarray)  # _is_const says so
        imp.set(node.output[0], np.transpose(v, perm), out)
        return
    names = _labels(shape)
    spec = f"{_slot(names)} => {_slot([names[p] for p in perm])}"
    imp.set(node.output[0], _op("transpose", [imp.tensor(x)], spec, _PERMUTE, out, node.output[0]), out)


def _softmax(imp: _Importer, node, attrs) -> None:
    x = node.input[0]
    axis = int(attrs.get("axis", -1))
    fn = reductions.log_softmax if node.op_type == "LogSoftmax" else reductions.softmax
    imp.set(node.output[0], fn(imp.tensor(x), axis, label=node.output[0]), imp.shapes[x])


def _layer_norm(imp: _Importer, node, attrs) -> None:
    x = node.input[0]
    shape = imp.shapes[x]
    axis = int(attrs.get("axis", -1)) % len(shape)
    eps = float(attrs.get("epsilon", 1e-5))
    name = node.output[0]
    names = _labels(shape)
    full = _slot(names)
    reduced = _slot(names[:axis] + ["0"] * (len(shape) - axis))
    rshape = (*shape[:axis], *[1] * (len(shape) - axis))
    t = imp.tensor(x)
    mean = reductions.mean(t, f"{full} => {reduced}", label=f"{name}.mean")
    centered = reductions.broadcast_op("-", t, mean, f"{full}; {reduced} => {full}", label=f"{name}.centered")
    sq = _op("*", [centered, centered], f"{full}; {full} => {full}", (_BINARY["Mul"][1], _BINARY["Mul"][2]), shape,
             f"{name}.sq")
    var = reductions.mean(sq, f"{full} => {reduced}", label=f"{name}.var")
    imp.set(f"{name}.var", var, rshape)
    imp.set(f"{name}.eps", np.full((1,), eps, np.float32), (1,))
    _pointwise(imp, "+", (_BINARY["Add"][1], _BINARY["Add"][2]), [f"{name}.var", f"{name}.eps"], f"{name}.var_eps",
               "LayerNormalization")
    inv = activations.rsqrt(imp.tensor(f"{name}.var_eps"), label=f"{name}.inv_std")
    normed = reductions.broadcast_op("*", centered, inv, f"{full}; {reduced} => {full}", label=f"{name}.normed")
    imp.set(f"{name}.normed", normed, shape)
    scaled = f"{name}.normed"
    if len(node.input) > 1 and node.input[1]:
        scaled = f"{name}.scaled" if len(node.input) > 2 and node.input[2] else name
        _pointwise(imp, "*", (_BINARY["Mul"][1], _BINARY["Mul"][2]), [f"{name}.normed", node.input[1]], scaled,
                   "LayerNormalization")
    if len(node.input) > 2 and node.input[2]:
        _pointwise(imp, "+", (_BINARY["Add"][1], _BINARY["Add"][2]), [scaled, node.input[2]], name,
                   "LayerNormalization")
    elif scaled != name:
        imp.set(name, imp.values[scaled], shape)


def _gather(imp: _Importer, node, attrs) -> None:
    data, idx = node.input
    v = imp.values.get(idx)
    shape = imp.shapes[data]
    axis = int(attrs.get("axis", 0)) % len(shape)
    if idx in imp.index_inputs:
        ids = imp.values[idx]
        assert isinstance(ids, Tensor)  # graph inputs are tensors
        ishape = imp.shapes[idx]
        names, inames = _labels(shape), [f"i{k}" for k in range(len(ishape))]
        spec = (f"{_slot(names[:axis] + ['g'] + names[axis + 1:])}; {_slot(inames + ['g'])} => "
                f"{_slot(names[:axis] + inames + names[axis + 1:])}")
        out = (*shape[:axis], *ishape, *shape[axis + 1:])
        imp.set(node.output[0], take(imp.tensor(data), ids, spec=spec, label=node.output[0]), out)
        return
    if not isinstance(v, np.ndarray):
        raise imp.error("Gather", f"indices {idx!r} are neither a graph input nor constant")
    indices = np.asarray(v, np.int64)
    n = shape[axis]
    if indices.size and (indices.min() < -n or indices.max() >= n):
        raise imp.error("Gather", f"indices outside [-{n}, {n}) of axis {axis}")
    indices = np.where(indices < 0, indices + n, indices)
    out = (*shape[:axis], *indices.shape, *shape[axis + 1:])
    dv = imp.values[data]
    if _is_const(imp, data):
        assert isinstance(dv, np.ndarray)  # _is_const says so
        _set_const(imp, node.output[0], np.take(dv, indices, axis=axis))
        return
    onehot = np.zeros((*indices.shape, n), np.float32)
    onehot.reshape(-1, n)[np.arange(indices.size), indices.reshape(-1)] = 1.0
    names = _labels(shape)
    inames = [f"i{k}" for k in range(indices.ndim)]
    sel = ndarray(onehot, label=f"{node.output[0]}.onehot")
    spec = (f"{_slot(names[:axis] + ['g'] + names[axis + 1:])}; {_slot(inames + ['g'])} => "
            f"{_slot(names[:axis] + inames + names[axis + 1:])}")
    imp.set(node.output[0], _op("gather", [imp.tensor(data), sel], spec, _CONTRACT, out, node.output[0]), out)


def _concat(imp: _Importer, node, attrs) -> None:
    names = list(node.input)
    if all(_is_const(imp, n) for n in names):
        _set_const(imp, node.output[0], np.concatenate([np.asarray(imp.values[n]) for n in names],
                                                       axis=int(attrs["axis"])))
        return
    shapes = [imp.shapes[n] for n in names]
    axis = int(attrs["axis"]) % len(shapes[0])
    out = (*shapes[0][:axis], sum(s[axis] for s in shapes), *shapes[0][axis + 1:])
    labels = _labels(out)
    offset = 0
    pieces = []
    # Each piece reads its input at `o - offset` as a padded window (zeros outside the input),
    # through a 2-tap kernel (0, 1) whose zero tap adds an exact 0.
    tap = ndarray(np.array([0.0, 1.0], np.float32), label=f"{node.output[0]}.tap")
    for k, (n, s) in enumerate(zip(names, shapes, strict=True)):
        if s[:axis] != out[:axis] or s[axis + 1:] != out[axis + 1:]:
            raise imp.error("Concat", f"input {n!r} of shape {list(s)} does not fit {list(out)} along axis {axis}")
        source = labels[:axis] + [f"o+k-{offset + 1}:{out[axis] - offset - s[axis]}"] + labels[axis + 1:]
        target = labels[:axis] + ["o"] + labels[axis + 1:]
        piece = f"{node.output[0]}.piece{k}"
        imp.set(piece, _op("place", [imp.tensor(n), tap], f"{_slot(source)}; k, => {_slot(target)}", _CONTRACT, out,
                           piece), out)
        pieces.append(piece)
        offset += s[axis]
    total = pieces[0]
    for k, piece in enumerate(pieces[1:], 1):
        nxt = node.output[0] if k == len(pieces) - 1 else f"{node.output[0]}.sum{k}"
        _pointwise(imp, "+", (_BINARY["Add"][1], _BINARY["Add"][2]), [total, piece], nxt, "Concat")
        total = nxt
    if len(pieces) == 1:
        imp.set(node.output[0], imp.values[total], out)


def _einsum(imp: _Importer, node, attrs) -> None:
    equation = attrs["equation"]
    equation = equation.decode() if isinstance(equation, bytes) else str(equation)
    if "->" not in equation or "..." in equation or len(node.input) > 2:
        raise imp.error("Einsum", f"equation {equation!r}: only explicit '->' equations of one or two operands "
                                  f"without '...' are supported")
    lhs, out_text = equation.replace(" ", "").split("->")
    terms = lhs.split(",")
    sizes: dict[str, int] = {}
    for term, name in zip(terms, node.input, strict=True):
        shape = imp.shapes[name]
        if len(term) != len(shape) or len(set(term)) != len(term):
            raise imp.error("Einsum", f"term {term!r} does not fit operand {name!r} of shape {list(shape)}")
        for c, d in zip(term, shape, strict=True):
            sizes.setdefault(c, d)
    out = tuple(sizes[c] for c in out_text)
    spec = "; ".join(_slot([f"e{c}" for c in term]) for term in terms) + " => " + _slot([f"e{c}" for c in out_text])
    templates = _CONTRACT if len(terms) == 2 else _PERMUTE
    children = [imp.tensor(n) for n in node.input]
    imp.set(node.output[0], _op("einsum", children, spec, templates, out or (1,), node.output[0]), out or (1,))


def _reduce_max(imp: _Importer, node, attrs) -> None:
    x = node.input[0]
    shape = imp.shapes[x]
    given = _axes(imp, node, attrs, "ReduceMax")
    axes = {int(a) % len(shape) for a in (range(len(shape)) if given is None else given)}
    keep = bool(attrs.get("keepdims", 1))
    names = _labels(shape)
    kept = [("0" if keep else None) if k in axes else n for k, n in enumerate(names)]
    out = tuple(1 if k in axes else d for k, d in enumerate(shape) if keep or k not in axes)
    entries = [e for e in kept if e is not None]
    spec = f"{_slot(names)} => {_slot(entries) if entries else '0,'}"
    imp.set(node.output[0], reductions.max(imp.tensor(x), spec, label=node.output[0]), out or (1,))


def _is_const(imp: _Importer, name: str) -> bool:
    """A NumPy value shape computations fold: not a float initializer (those are parameters)."""
    v = imp.values.get(name)
    return isinstance(v, np.ndarray) and (name not in imp.initializers or v.dtype.kind in "iub")


def _set_const(imp: _Importer, name: str, arr: np.ndarray) -> None:
    imp.set(name, arr, tuple(arr.shape) or (1,))


def _shape_op(imp: _Importer, node, attrs) -> None:
    shape = np.array(imp.shapes[node.input[0]], np.int64)
    _set_const(imp, node.output[0], shape[int(attrs.get("start", 0)):attrs.get("end")])


def _cast(imp: _Importer, node, attrs) -> None:
    from onnx import TensorProto, helper
    x, to = node.input[0], int(attrs["to"])
    if _is_const(imp, x):
        _set_const(imp, node.output[0], np.asarray(imp.values[x]).astype(helper.tensor_dtype_to_np_dtype(to)))
    elif to == TensorProto.FLOAT:
        imp.set(node.output[0], imp.values[x], imp.shapes[x])
    else:
        raise imp.error("Cast", f"a cast of tensor {x!r} to element type {to}: einjit computes in float")


def _mod(imp: _Importer, node, attrs) -> None:
    a, b = node.input
    if not (_is_const(imp, a) and _is_const(imp, b)):
        raise imp.error("Mod", "only constant operands (shape computations) are supported")
    fn = np.fmod if attrs.get("fmod", 0) else np.mod
    _set_const(imp, node.output[0], fn(imp.values[a], imp.values[b]))


def _axes(imp: _Importer, node, attrs, op: str) -> list[int] | None:
    if len(node.input) > 1 and node.input[1]:
        return [int(a) for a in imp.const(node.input[1], op)]
    return [int(a) for a in attrs["axes"]] if "axes" in attrs else None


def _unsqueeze(imp: _Importer, node, attrs) -> None:
    x = node.input[0]
    axes = _axes(imp, node, attrs, "Unsqueeze") or []
    if _is_const(imp, x):
        _set_const(imp, node.output[0], np.expand_dims(imp.values[x], [a for a in axes]))
        return
    rank = len(imp.shapes[x]) + len(axes)
    picked = {a % rank for a in axes}
    dims = iter(imp.shapes[x])
    _reshape_to(imp, x, tuple(1 if k in picked else next(dims) for k in range(rank)), node.output[0], "Unsqueeze")


def _squeeze(imp: _Importer, node, attrs) -> None:
    x = node.input[0]
    shape = imp.shapes[x]
    axes = _axes(imp, node, attrs, "Squeeze")
    picked = {a % len(shape) for a in axes} if axes is not None else {k for k, d in enumerate(shape) if d == 1}
    if any(shape[a] != 1 for a in picked):
        raise imp.error("Squeeze", f"axes {sorted(picked)} of shape {list(shape)} are not all of size 1")
    if _is_const(imp, x):
        _set_const(imp, node.output[0], np.squeeze(imp.values[x], tuple(sorted(picked))))
        return
    out = tuple(d for k, d in enumerate(shape) if k not in picked) or (1,)
    _reshape_to(imp, x, out, node.output[0], "Squeeze")


def _slice(imp: _Importer, node, attrs) -> None:
    x = node.input[0]
    shape = imp.shapes[x]
    starts = [int(v) for v in imp.const(node.input[1], "Slice")]
    ends = [int(v) for v in imp.const(node.input[2], "Slice")]
    axes = [int(v) % len(shape) for v in imp.const(node.input[3], "Slice")] if len(node.input) > 3 and \
        node.input[3] else list(range(len(starts)))
    steps = [int(v) for v in imp.const(node.input[4], "Slice")] if len(node.input) > 4 and node.input[4] \
        else [1] * len(starts)
    ranges = {a: slice(b, e, st).indices(shape[a]) for a, b, e, st in zip(axes, starts, ends, steps, strict=True)}
    if _is_const(imp, x):
        index = tuple(slice(*ranges[k]) if k in ranges else slice(None) for k in range(len(shape)))
        _set_const(imp, node.output[0], np.asarray(imp.values[x])[index])
        return
    if any(r[2] != 1 for r in ranges.values()):
        raise imp.error("Slice", f"steps {steps}: only step 1 is supported on tensors")
    out = tuple(len(range(*ranges[k])) if k in ranges else d for k, d in enumerate(shape))
    names = _labels(shape)
    # Each sliced axis reads `o + start` through the 2-tap kernel (0, 1), as Concat does.
    source = [f"{n}+k{ranges[k][0] - 1:+d}" if k in ranges else n for k, n in enumerate(names)]
    tap = ndarray(np.array([0.0, 1.0], np.float32), label=f"{node.output[0]}.tap")
    if len(ranges) != 1:
        raise imp.error("Slice", f"a slice along {len(ranges)} axes of a tensor: only one axis is supported")
    imp.set(node.output[0], _op("slice", [imp.tensor(x), tap], f"{_slot(source)}; k, => {_slot(names)}", _CONTRACT,
                                out, node.output[0]), out)


def _constant(imp: _Importer, node, attrs) -> None:
    if "value" not in attrs:
        raise imp.error("Constant", f"only the 'value' attribute is supported, got {sorted(attrs)}")
    arr = imp.numpy_helper.to_array(attrs["value"])
    imp.set(node.output[0], arr, tuple(arr.shape) or (1,))


HANDLERS: dict[str, Callable[[_Importer, object, dict], None]] = {
    **{op: _binary for op in _BINARY}, **{op: _unary for op in _UNARY},
    "Gelu": _gelu, "MatMul": _matmul, "Gemm": _gemm, "Conv": _conv, "MaxPool": _pool, "AveragePool": _pool,
    "GlobalAveragePool": _global_average_pool, "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose,
    "Softmax": _softmax, "LogSoftmax": _softmax, "LayerNormalization": _layer_norm, "Gather": _gather,
    "Concat": _concat, "Constant": _constant, "Einsum": _einsum, "ReduceMax": _reduce_max, "Shape": _shape_op,
    "Cast": _cast, "Mod": _mod, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Slice": _slice,
}


def onnx_load(path: str | os.PathLike, *, dims: Mapping[str, int] | int = 1) -> OnnxModel:
    """Import the ONNX model at `path`; symbolic dims get the sizes of `dims` (one size for
    all, or by name)."""
    try:
        import onnx
    except ImportError:
        raise ExportError("einjit: onnx_load needs the onnx package: pip install 'einjit[onnx]'") from None
    try:
        model = onnx.load(os.fspath(path))
    except Exception as e:  # protobuf's DecodeError, OSError: the file is not a readable model
        raise ExportError(f"einjit: onnx_load: cannot read {path}: {e}") from None
    return _Importer(model.graph, dims).run()
