"""`export_onnx`: an einjit forward graph as an ONNX model (opset 17 by default, up to 21).

Each computed tensor is translated from its operation and its projections — how the
operation's loops index the result and the arguments — so the translation does not depend on
which layer or helper built it: iterated axes become einsum letters, a fixed index 0 a size-1
axis reshaped away, affine window axes (`stride*o+k-pad`) the strides, dilations and pads of a
`Conv`, `MaxPool` or `AveragePool`. Contractions are written as `Gemm` or `MatMul` when their
letters match (`w @ x` of a linear layer is `Gemm(x, w, transB=1)`) and as `Einsum` otherwise;
sums as `Einsum`, maxima as `ReduceMax`, pointwise operations as the ONNX operator after the
operands are permuted (`Transpose`) and reshaped to broadcast as NumPy does. Softmax and layer
norm, which einjit composes from these, are recognized (`onnx_fused`) and written as `Softmax`,
`LogSoftmax` and `LayerNormalization`; GELU as `Gelu` from opset 20, before it as its erf (or tanh) formula;
a batch norm stays a composition. Leaves (parameters,
constants, and inputs other than the exported ones, such as a layer's train/eval
mode) become initializers with their current values; inputs and outputs are named after
their labels. An operation with no ONNX form (a random draw, a dropout in training mode) is
refused naming the tensor and the operation.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from einjit.export import onnx_fused
from einjit.export.c_library import identifier, resolve_step
from einjit.export.errors import ExportError
from einjit.ir import assignments as asg
from einjit.ir import bf16
from einjit.ir.indexing import Affine, FixedIdx, Iterator, Projections
from einjit.tensor.tensor import Tensor

OPSET = 17
#: The opsets `export_onnx` writes: 17 (LayerNormalization) up to 21; `Gelu` from 20.
OPSETS = range(17, 22)
GELU_OPSET = 20
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_BINARY = {"+": "Add", "-": "Sub", "*": "Mul", "/": "Div", "**": "Pow"}
_UNARY = {"relu": "Relu", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "tanh": "Tanh", "sigmoid": "Sigmoid",
          "neg": "Neg", "recip": "Reciprocal", "abs": "Abs", "sin": "Sin", "cos": "Cos", "erf": "Erf",
          "reciprocal": "Reciprocal", "identity": "Identity"}
_CONTRACTIONS = ("@", "einsum", "conv", "gather")
_PERMUTES = ("einsum", "sum", "T", "transpose")


class _Writer:
    def __init__(self, helper: Any, numpy_helper: Any):
        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list = []
        self.inits: list = []
        self.names: dict[int, str] = {}
        self.used: set[str] = set()
        self.count = 0

    def fresh(self, base: str) -> str:
        name = identifier(base, "t")
        out, k = name, 1
        while out in self.used:
            k += 1
            out = f"{name}_{k}"
        self.used.add(out)
        return out

    def node(self, op: str, inputs: list[str], base: str, **attrs) -> str:
        out = self.fresh(base)
        self.count += 1
        self.nodes.append(self.helper.make_node(op, inputs, [out], name=f"{op}_{self.count}", **attrs))
        return out

    def const(self, arr: np.ndarray, base: str) -> str:
        name = self.fresh(base)
        self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def reshape(self, value: str, dims: Sequence[int], base: str) -> str:
        return self.node("Reshape", [value, self.const(np.array(list(dims), np.int64), f"{base}_shape")], base)


def _projections(t: Tensor) -> Projections:
    if t.projections is None:
        raise ExportError(f"einjit: export_onnx: tensor {t.describe()} ({t.op_label}) has no projections")
    return t.projections.force()


def _error(t: Tensor, why: str) -> ExportError:
    return ExportError(f"einjit: export_onnx: tensor {t.describe()}, operation {t.op_label!r}: {why}")


class _Exporter:
    def __init__(self, w: _Writer, opset: int):
        self.w = w
        self.opset = opset

    def letters(self, proj: Projections) -> dict:
        if len(proj.product_iterators) > len(_LETTERS):
            raise ExportError("einjit: export_onnx: an operation with more than 52 loops has no Einsum form")
        return {s: _LETTERS[k] for k, s in enumerate(proj.product_iterators)}

    def operand(self, t: Tensor, k: int, proj: Projections, letters: dict) -> tuple[str, str]:
        """Child `k` with its fixed (size-1) axes reshaped away, and its einsum letters."""
        child = t.children[k]
        name = self.w.names[child.id]
        idcs, dims = proj.project_rhs[k], proj.rhs_dims[k]
        keep, text = [], ""
        for idx, d in zip(idcs, dims, strict=True):
            match idx:
                case Iterator(s):
                    keep.append(d)
                    text += letters[s]
                case FixedIdx(0) if d == 1:
                    pass
                case _:
                    raise _error(t, f"argument {child.describe()} is indexed by {idx!r}, which has no ONNX form here")
        if len(set(text)) != len(text):
            raise _error(t, f"argument {child.describe()} is read along a diagonal, which has no ONNX form here")
        if len(keep) != len(dims):
            name = self.w.reshape(name, keep, f"{child.label_str}_squeezed")
        return name, text

    def lhs(self, t: Tensor, proj: Projections, letters: dict) -> str:
        text = ""
        for idx, d in zip(proj.project_lhs, proj.lhs_dims, strict=True):
            match idx:
                case Iterator(s):
                    text += letters[s]
                case FixedIdx(0) if d == 1:
                    pass
                case _:
                    raise _error(t, f"the result is indexed by {idx!r}, which has no ONNX form here")
        return text

    def finish(self, t: Tensor, value: str, proj: Projections) -> str:
        """`value` (the result without its size-1 fixed axes) reshaped to the tensor's dims."""
        if any(isinstance(i, FixedIdx) for i in proj.project_lhs):
            return self.w.reshape(value, proj.lhs_dims, t.label_str)
        return value

    def aligned(self, t: Tensor, k: int, proj: Projections, letters: dict, out: str) -> str:
        """Child `k` permuted to the result's letter order, with size-1 axes where it lacks
        one of the result's letters (NumPy broadcasting does the rest)."""
        name, text = self.operand(t, k, proj, letters)
        missing = [c for c in text if c not in out]
        if missing:
            raise _error(t, f"argument {t.children[k].describe()} has axes the pointwise result lacks")
        order = [c for c in out if c in text]
        if order != list(text):
            name = self.w.node("Transpose", [name], f"{t.label_str}_perm", perm=[text.index(c) for c in order])
        if len(order) != len(out):
            sizes = {letters[s]: n for s, n in proj.iterator_dims().items()}
            dims = [sizes[c] if c in text else 1 for c in out]
            name = self.w.reshape(name, dims, f"{t.label_str}_bcast")
        return name

    def fused(self, t: Tensor, f: onnx_fused.Fused) -> str:
        x = self.w.names[f.x.id]
        base = t.label_str
        if f.op in ("Softmax", "LogSoftmax"):
            return self.w.node(f.op, [x], base, axis=f.axes[0])
        normalized = [f.x.dims[k] for k in f.axes]

        def operand(v: Tensor | None, fill: float, what: str) -> str:
            if v is None:
                return self.w.const(np.full(normalized, fill, np.float32), f"{base}_{what}")
            name = self.w.names[v.id]
            return name if list(v.dims) == normalized else self.w.reshape(name, normalized, f"{base}_{what}")

        return self.w.node("LayerNormalization", [x, operand(f.scale, 1.0, "scale"), operand(f.bias, 0.0, "bias")],
                           base, axis=f.axes[0], epsilon=f.epsilon)

    def tensor(self, t: Tensor, fused: onnx_fused.Fused | None = None) -> str:
        if fused is not None:
            return self.fused(t, fused)
        op = t.op_label
        proj = _projections(t)
        letters = self.letters(proj)
        if any(isinstance(i, Affine) for row in proj.project_rhs for i in row) \
                or any(isinstance(i, Affine) for i in proj.project_lhs):
            return self.windowed(t, proj)
        out = self.lhs(t, proj, letters)
        base = t.label_str
        n = len(t.children)
        if op in _BINARY and n == 2:
            args = [self.aligned(t, k, proj, letters, out) for k in range(2)]
            return self.finish(t, self.w.node(_BINARY[op], args, base), proj)
        if op in ("max", "min") and n == 2:
            args = [self.aligned(t, k, proj, letters, out) for k in range(2)]
            return self.finish(t, self.w.node(op.capitalize(), args, base), proj)
        if op in _UNARY and n == 1:
            return self.finish(t, self.w.node(_UNARY[op], [self.aligned(t, 0, proj, letters, out)], base), proj)
        if op == "rsqrt" and n == 1:
            root = self.w.node("Sqrt", [self.aligned(t, 0, proj, letters, out)], f"{base}_sqrt")
            return self.finish(t, self.w.node("Reciprocal", [root], base), proj)
        if op == "gelu" and n == 2:
            x = self.aligned(t, 0, proj, letters, out)
            return self.finish(t, self.gelu(x, onnx_fused.gelu_approximation(t), base), proj)
        if op == "dropout" and n == 3:
            mode = t.children[2].value_tn.array
            if mode is None or float(np.asarray(mode).reshape(-1)[0]) != 0.0:
                raise _error(t, "a dropout in training mode draws random masks, which have no ONNX form: call "
                                "model.eval() before exporting")
            return self.finish(t, self.w.node("Identity", [self.aligned(t, 0, proj, letters, out)], base), proj)
        if op in ("max", "min") and n == 1:
            name, text = self.operand(t, 0, proj, letters)
            axes = [k for k, c in enumerate(text) if c not in out]
            kept = [c for c in text if c in out]
            red = self.reduce(f"Reduce{op.capitalize()}", name, axes, base) if axes else name
            if kept != list(out):
                red = self.w.node("Transpose", [red], f"{base}_perm", perm=[kept.index(c) for c in out])
            return self.finish(t, red, proj)
        if op in _PERMUTES and n == 1:
            name, text = self.operand(t, 0, proj, letters)
            return self.finish(t, self.w.node("Einsum", [name], base, equation=f"{text}->{out}"), proj)
        if op in _CONTRACTIONS and n == 2:
            return self.finish(t, self.contraction(t, proj, letters, out), proj)
        raise _error(t, "no ONNX form for this operation")

    def reduce(self, op: str, name: str, axes: list[int], base: str) -> str:
        """A reduction without kept axes; from opset 18 its axes are an input, not an attribute."""
        if self.opset >= 18:
            return self.w.node(op, [name, self.w.const(np.array(axes, np.int64), f"{base}_axes")], base, keepdims=0)
        return self.w.node(op, [name], base, axes=axes, keepdims=0)

    def gelu(self, x: str, approximate: str, base: str) -> str:
        """`Gelu` from opset 20; before it, `x * Phi(x)` from `Erf`, or the tanh formula."""
        if self.opset >= GELU_OPSET:
            return self.w.node("Gelu", [x], base, approximate=approximate)

        def number(v: float, what: str) -> str:
            return self.w.const(np.array(v, np.float32), f"{base}_{what}")

        half, one = number(0.5, "half"), number(1.0, "one")
        if approximate == "tanh":
            cube = self.w.node("Mul", [self.w.node("Mul", [x, x], f"{base}_sq"), x], f"{base}_cube")
            inner = self.w.node("Add", [x, self.w.node("Mul", [cube, number(0.044715, "cubic")], f"{base}_cubic")],
                                f"{base}_inner")
            arg = self.w.node("Mul", [inner, number(math.sqrt(2.0 / math.pi), "sqrt_2_pi")], f"{base}_arg")
            phi2 = self.w.node("Add", [self.w.node("Tanh", [arg], f"{base}_tanh"), one], f"{base}_cdf2")
        else:
            erf = self.w.node("Erf", [self.w.node("Div", [x, number(math.sqrt(2.0), "sqrt2")], f"{base}_scaled")],
                              f"{base}_erf")
            phi2 = self.w.node("Add", [erf, one], f"{base}_cdf2")
        return self.w.node("Mul", [x, self.w.node("Mul", [phi2, half], f"{base}_cdf")], base)

    def contraction(self, t: Tensor, proj: Projections, letters: dict, out: str) -> str:
        (a, ta), (b, tb) = self.operand(t, 0, proj, letters), self.operand(t, 1, proj, letters)
        base = t.label_str
        if len(ta) == 2 and len(tb) == 2 and len(out) == 2:
            k = set(ta) & set(tb)
            if len(k) == 1 and k.isdisjoint(out):
                (kk,) = k
                # w @ x of a linear layer: w (o, k), x (b, k) -> (b, o).
                if out == tb[0] + ta[0] and ta[1] == kk and tb[1] == kk:
                    return self.w.node("Gemm", [b, a], base, transB=1)
                if out == ta[0] + tb[1] and ta[1] == kk and tb[0] == kk:
                    return self.w.node("MatMul", [a, b], base)
                if out == tb[0] + ta[1] and tb[1] == kk and ta[0] == kk:
                    return self.w.node("MatMul", [b, a], base)
        return self.w.node("Einsum", [a, b], base, equation=f"{ta},{tb}->{out}")

    def windowed(self, t: Tensor, proj: Projections) -> str:
        """Conv, MaxPool, AveragePool over (N, C, H, W) with affine window axes, and the
        row-major flatten (an affine result axis)."""
        op = t.op_label
        base = t.label_str
        if op == "flatten" and len(t.children) == 1:
            return self.w.reshape(self.w.names[t.children[0].id], proj.lhs_dims, base)
        if op == "reshape" and len(t.children) == 1 and _row_major_split(proj):
            return self.w.reshape(self.w.names[t.children[0].id], proj.lhs_dims, base)
        if op not in ("conv", "einsum", "maxpool", "avgpool") or len(t.children) != 2:
            raise _error(t, "an affine (window) index outside a convolution or pooling has no ONNX form here")
        x_idx, k_idx = proj.project_rhs
        x_dims = proj.rhs_dims[0]
        if len(x_idx) != 4 or not all(isinstance(i, Affine) for i in x_idx[2:]) \
                or not all(isinstance(i, Iterator) or (i == FixedIdx(0) and d == 1)
                           for i, d in zip(x_idx[:2], x_dims[:2], strict=True)):
            raise _error(t, f"window indices {x_idx} are not (N, C, H, W) with affine H and W")
        strides, dilations, pads_begin, pads_end = [], [], [], []
        sizes = proj.iterator_dims()
        for axis, idx in enumerate(x_idx[2:]):
            assert isinstance(idx, Affine)
            out_sym = proj.project_lhs[2 + axis]
            terms = dict((s, c) for c, s in idx.symbols)
            stride = terms.pop(out_sym.symbol, None) if isinstance(out_sym, Iterator) else None
            if stride is None or len(terms) > 1:
                raise _error(t, f"window index {idx!r} is not stride*out+dilation*kernel-pad")
            dil, ksize = (next(iter(terms.values())), sizes[next(iter(terms))]) if terms else (1, 1)
            begin = -idx.offset
            end = (proj.lhs_dims[2 + axis] - 1) * stride + dil * (ksize - 1) + 1 - x_dims[2 + axis] - begin
            strides.append(stride)
            dilations.append(dil)
            pads_begin.append(begin)
            pads_end.append(max(end, 0))
        x = self.w.names[t.children[0].id]
        pads = pads_begin + pads_end
        if op in ("maxpool", "avgpool"):
            kernel = list(proj.rhs_dims[1])
            if any(pads) or dilations != [1, 1]:
                raise _error(t, "pooling with padding or dilation (einjit pads with zeros) has no ONNX form here")
            return self.w.node("MaxPool" if op == "maxpool" else "AveragePool", [x], base, kernel_shape=kernel,
                               strides=strides)
        w = self.w.names[t.children[1].id]
        if len(k_idx) != 4:
            raise _error(t, f"kernel indices {k_idx} are not (C_out, C_in, KH, KW)")
        return self.w.node("Conv", [x, w], base, kernel_shape=list(proj.rhs_dims[1][2:]), strides=strides,
                           dilations=dilations, pads=pads)


def _row_major_split(proj: Projections) -> bool:
    """The result is its one-axis argument split row-major (`onnx_load`'s reshape): the
    argument is read at `sum(stride_k * i_k)` with the row-major strides of the result."""
    (idx,) = proj.project_rhs[0] if len(proj.project_rhs[0]) == 1 else (None,)
    if not isinstance(idx, Affine) or idx.offset != 0:
        return False
    strides = {}
    for k, (i, d) in enumerate(zip(proj.project_lhs, proj.lhs_dims, strict=True)):
        match i:
            case Iterator(s):
                strides[s] = math.prod(proj.lhs_dims[k + 1:])
            case FixedIdx(0) if d == 1:
                pass
            case _:
                return False
    return sorted(((c, s) for c, s in idx.symbols), key=repr) == sorted(((c, s) for s, c in strides.items()
                                                                         if proj.iterator_dims()[s] > 1), key=repr)


def _leaf_values(t: Tensor) -> np.ndarray:
    """A leaf's values: its host array, or the constant its code fills it with (numbers)."""
    arr = t.value_tn.array
    if arr is not None:
        return np.asarray(bf16.as_values(arr, t.value_tn.prec), np.float32).reshape(t.dims)
    match t.own_forward:
        case asg.Fetch(_, asg.FetchConstant() as fill):
            return np.full(t.dims, fill.number(), np.float32)
        case asg.Fetch(_, asg.ConstantFill(values, _)):
            return np.resize(np.asarray(values, np.float32), t.dims)
    raise ExportError(f"einjit: export_onnx: {t.describe()} ({t.op_label}) has no values (initialize the parameters "
                      f"first) and no constant form")


def _graph_order(outputs: list[Tensor]) -> tuple[list[Tensor], dict[int, onnx_fused.Fused]]:
    """The tensors the outputs need, in creation (topological) order, and the softmaxes and
    layer norms among them: those need their `Fused.inputs`, not their children (the
    intermediate tensors are written only if something else needs them), and no argument an
    operator computes itself (`_computed_by_the_operator`)."""
    seen: dict[int, Tensor] = {}
    fused: dict[int, onnx_fused.Fused] = {}
    stack = list(outputs)
    while stack:
        t = stack.pop()
        if t.id in seen:
            continue
        seen[t.id] = t
        f = onnx_fused.recognize(t) if t.children else None
        if f is not None:
            fused[t.id] = f
            stack.extend(f.inputs)
        else:
            stack.extend(c for k, c in enumerate(t.children) if not _computed_by_the_operator(t, k))
    return [seen[k] for k in sorted(seen)], fused


def _computed_by_the_operator(t: Tensor, k: int) -> bool:
    """Whether `t`'s argument `k` is part of the ONNX operator `t` becomes, not one of its
    inputs: a dropout's random draw (an exported dropout is the identity), a GELU's gate."""
    return k == 1 and t.op_label in ("dropout", "gelu")


def export_onnx(model: object, path: str | os.PathLike, *, inputs: Sequence[Tensor] | None = None,
                batch_dims: Sequence[int] = (1,), input_dims: Sequence[int] = (), output_dims: Sequence[int] = (1,),
                graph_name: str = "einjit", opset: int = OPSET) -> object:
    """Write `model` (what `export_c` takes: a forward step, output tensors with `inputs=`, or
    a model with its input dims) as an ONNX model of opset `opset` (`OPSETS`) at `path`;
    returns the `onnx.ModelProto`."""
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError:
        raise ExportError("einjit: export_onnx needs the onnx package: pip install 'einjit[onnx]'") from None
    if opset not in OPSETS or opset > onnx.defs.onnx_opset_version():
        raise ExportError(f"einjit: export_onnx: opset {opset!r} is not supported: einjit writes opsets "
                          f"{OPSETS.start} to {min(OPSETS.stop - 1, onnx.defs.onnx_opset_version())} "
                          f"(with onnx {onnx.__version__})")
    outputs, ins = resolve_step(model, inputs, batch_dims, input_dims, output_dims)
    w = _Writer(helper, numpy_helper)
    ex = _Exporter(w, opset)
    graph_inputs = []
    for t in ins:
        name = w.fresh(t.label_str)
        w.names[t.id] = name
        graph_inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(t.dims)))
    order, fused = _graph_order(outputs)
    for t in order:
        if t.id in w.names:
            continue
        if not t.children:
            w.names[t.id] = w.const(_leaf_values(t), t.label_str)
            continue
        w.names[t.id] = ex.tensor(t, fused.get(t.id))
    graph_outputs = []
    computed = {out for n in w.nodes for out in n.output}
    for k, t in enumerate(outputs):
        name = w.names[t.id]
        if name != identifier(t.label_str, f"output{k}") or name not in computed:
            # An output computed under another name, an input or a value itself, or given twice.
            name = w.node("Identity", [name], identifier(t.label_str, f"output{k}"))
        computed.discard(name)
        graph_outputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(t.dims)))
    graph = helper.make_graph(w.nodes, graph_name, graph_inputs, graph_outputs, w.inits)
    opsets = [helper.make_opsetid("", opset)]
    proto = helper.make_model(graph, opset_imports=opsets, producer_name="einjit")
    proto.ir_version = helper.find_min_ir_version_for(opsets)
    onnx.checker.check_model(proto)
    Path(path).write_bytes(proto.SerializeToString())
    return proto
