"""The operation library: every tensor operation with its forward and backprop code written in
the `%cd` notation, parameters with initialization, and literals.

A template's slot fillers: `t` the result, `t1 t2 t3` the arguments, `g g1 g2 g3` their
gradients (assignments to a gradient that does not exist are dropped).
"""

from __future__ import annotations

import math
import os
from typing import Callable, Sequence

import numpy as np

from einjit import memory
from einjit import shape as sh
from einjit.ir import assignments as asg
from einjit.ir import bf16, ops, provenance
from einjit.ir.indexing import Iterator, Projections, StaticSymbol
from einjit.ir.tnode import MemoryType, Tnode, hosted
from einjit.tensor import op_scope, validate
from einjit.tensor.notation import Template, make_op
from einjit.tensor.tensor import (
    GradSpec,
    Like,
    Tensor,
    TensorError,
    default_prec,
    make_node,
    new_label,
    register,
)


def _defs(fwd: str, bwd: str | None) -> tuple[Template, Template | None]:
    return Template(fwd), (Template(bwd) if bwd else None)


_BINARY = {
    "+": _defs("t =: t1 + t2", "g1 =+ g; g2 =+ g"),
    "-": _defs("t =: t1 - t2", "g1 =+ g; g2 =- g"),
    "*": _defs("t =: t1 * t2", "g1 =+ g * t2; g2 =+ t1 * g"),
    "/": _defs("t =: t1 / t2", "g1 =+ g / t2; g2 =- (g * t) / t2"),
    "**": _defs("t =: t1 ** t2", "g1 =+ (t2 * t1 ** (t2 - 1)) * g; g2 =+ (t * log(t1)) * g"),
    "max": _defs("t =: max(t1, t2)", "g1 =+ where(t1 < t2, 0, g); g2 =+ where(t1 < t2, g, 0)"),
    "min": _defs("t =: min(t1, t2)", "g1 =+ where(t2 < t1, 0, g); g2 =+ where(t2 < t1, g, 0)"),
}
_CONTRACT = _defs("t =:+ t1 * t2", "g1 =+ g * t2; g2 =+ t1 * g")
_PERMUTE = _defs("t =:+ t1", "g1 =+ g")
_COPY = _defs("t =: t1", "g1 =+ g")

_UNARY = {
    "relu": _defs("t =: relu(t1)", "g1 =+ t -?/ g"),
    "exp": _defs("t =: exp(t1)", "g1 =+ g * t"),
    "log": _defs("t =: log(t1)", "g1 =+ g / t1"),
    "sqrt": _defs("t =: sqrt(t1)", "g1 =+ g / (2 * t)"),
    "sin": _defs("t =: sin(t1)", "g1 =+ g * cos(t1)"),
    "cos": _defs("t =: cos(t1)", "g1 =- g * sin(t1)"),
    "tanh": _defs("t =: tanh(t1)", "g1 =+ g * (1 - t * t)"),
    "neg": _defs("t =: -t1", "g1 =- g"),
    "recip": _defs("t =: recip(t1)", "g1 =- g * (t * t)"),
    "sigmoid": _defs("t =: recip(1 + exp(-t1))", "g1 =+ g * (t * (1 - t))"),
}
_WHERE = _defs("t =: where(t1, t2, t3)", "g2 =+ where(t1, g, 0); g3 =+ where(t1, 0, g)")


def as_tensor(x: Like) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (int, float, np.floating, np.integer)):
        return number(float(x))
    if isinstance(x, np.ndarray):
        return ndarray(x)
    raise TensorError(f"einjit: cannot use a {type(x).__name__} as a tensor")


def binop(op_label: str, a: Like, b: Like, *, label=None, grad_spec: GradSpec = GradSpec.IF_NEEDED) -> Tensor:
    fwd, bwd = _BINARY[op_label]
    return make_op(op_label, [as_tensor(a), as_tensor(b)], logic=None, forward=fwd, backprop=bwd,
                   grad_spec=grad_spec, label=label)


def unop(op_label: str, a: Like, *, label=None, grad_spec: GradSpec = GradSpec.IF_NEEDED) -> Tensor:
    fwd, bwd = _UNARY[op_label]
    return make_op(op_label, [as_tensor(a)], logic=None, forward=fwd, backprop=bwd, grad_spec=grad_spec,
                   label=label)


def relu(x: Like, *, label=None) -> Tensor:
    return unop("relu", x, label=label)


def exp(x: Like, *, label=None) -> Tensor:
    return unop("exp", x, label=label)


def log(x: Like, *, label=None) -> Tensor:
    return unop("log", x, label=label)


def sqrt(x: Like, *, label=None) -> Tensor:
    return unop("sqrt", x, label=label)


def sin(x: Like, *, label=None) -> Tensor:
    return unop("sin", x, label=label)


def cos(x: Like, *, label=None) -> Tensor:
    return unop("cos", x, label=label)


def tanh(x: Like, *, label=None) -> Tensor:
    return unop("tanh", x, label=label)


def sigmoid(x: Like, *, label=None) -> Tensor:
    return unop("sigmoid", x, label=label)


def recip(x: Like, *, label=None) -> Tensor:
    return unop("recip", x, label=label)


def neg(x: Like, *, label=None) -> Tensor:
    return unop("neg", x, label=label)


def maximum(a: Like, b: Like, *, label=None) -> Tensor:
    return binop("max", a, b, label=label)


def minimum(a: Like, b: Like, *, label=None) -> Tensor:
    return binop("min", a, b, label=label)


def where(cond: Like, a: Like, b: Like, *, label=None) -> Tensor:
    fwd, bwd = _WHERE
    return make_op("where", [as_tensor(cond), as_tensor(a), as_tensor(b)], logic=None, forward=fwd,
                   backprop=bwd, label=label)


def matmul(a: Like, b: Like, *, label=None) -> Tensor:
    """OCANNL's compose: the outputs of `b` meet the inputs of `a` (any number of axes)."""
    fwd, bwd = _CONTRACT
    return make_op("@", [as_tensor(a), as_tensor(b)], logic="@", forward=fwd, backprop=bwd, label=label)


def einsum(spec: str, a: Like, b: Like | None = None, *, label=None) -> Tensor:
    """Generalized einsum: `"rhs1;rhs2=>lhs"` for two tensors, `"rhs=>lhs"` for one.

    Convolution axes are affine (`stride*o+dilation*k`); a negative constant is padding, zeros
    read past both ends: `"2*o+k-1, c; k, c -> f => o, f"` is a stride-2, padding-1 convolution
    with `(n + 2 - 3) // 2 + 1` outputs for a kernel of 3 (the full notation: `einjit.shape.einsum`)."""
    validate.text(spec, "the einsum spec", "ij;jk=>ik")
    if b is None:
        fwd, bwd = _PERMUTE
        return make_op("einsum", [as_tensor(a)], logic=spec, forward=fwd, backprop=bwd, label=label)
    fwd, bwd = _CONTRACT
    return make_op("einsum", [as_tensor(a), as_tensor(b)], logic=spec, forward=fwd, backprop=bwd, label=label)


def transpose(a: Like, *, label=None) -> Tensor:
    """Swap input and output axes, keeping batch axes."""
    fwd, bwd = _COPY
    return make_op("T", [as_tensor(a)], logic="T", forward=fwd, backprop=bwd, label=label)


def copy_value(a: Like, *, label=None, prec: ops.Prec | None = None) -> Tensor:
    """A new tensor computing a copy of `a`'s value, without a gradient: a node of its own
    that a routine may keep on the host when `a`'s node is kept inside another routine. It has
    `a`'s precision: it is the same values, not a computation in the default precision; `prec`
    asks for another (a bf16 copy of float32 weights, rounded once)."""
    fwd, _ = _COPY
    source = as_tensor(a)
    return make_op("copy", [source], logic=None, forward=fwd, backprop=None, grad_spec=GradSpec.PROHIBIT_GRAD,
                   label=label, prec=source.value_tn.prec if prec is None else prec)


def batch_slice(a: Like, static_sym: StaticSymbol, *, label=None) -> Tensor:
    """Remove the leftmost batch axis by indexing it with a static symbol (OCANNL's `@|`).

    A symbol without a range gets the sliced axis's size as its range once the projections
    are derived (before any routine using them is compiled), so the routines check its value
    in Python before they run instead of reading outside the array."""
    _static_symbol(static_sym, "batch_slice")
    fwd, bwd = _COPY
    t = make_op("@|", [as_tensor(a)], logic=lambda shapes: sh.Transpose(sh.BatchSlice(static_sym), shapes[0]),
                forward=fwd, backprop=bwd, label=label)
    assert t.projections is not None  # make_op gives every operation its projections
    t.projections.on_force(lambda proj: _range_from_sliced_axis(static_sym, proj))
    return t


def _range_from_sliced_axis(static_sym: StaticSymbol, proj: Projections) -> None:
    for idx, d in zip(proj.project_rhs[0], proj.rhs_dims[0], strict=True):
        if idx == Iterator(static_sym.symbol):
            static_sym.infer_range(d)


# ------------------------------------------------------------------ terminals


def _terminal(lbl: list[str], op_label: str, shape: sh.Shape, grad_spec: GradSpec,
              init: sh.Init | None = None, prec: ops.Prec | None = None, scope: Sequence[str] = ()) -> Tensor:
    """A leaf tensor; `scope`, the configuration labels ending `lbl`, puts its nodes' labels in
    display order (see `Tensor`)."""
    p = default_prec() if prec is None else ops.as_prec(prec)
    sh.track(shape)
    if init is not None:
        sh.propagate_shapes(sh.UpdateStep(shape, sh.Terminal(init)))
    diff = grad_spec is GradSpec.REQUIRE_GRAD
    path = [*scope, *lbl[:len(lbl) - len(scope)]]
    t = Tensor(label=lbl, op_label=op_label, shape=shape, update_step=None, children=(),
               value_tn=make_node(path, shape, p), grad_tn=make_node(path + ["grad"], shape, p) if diff else None,
               projections=None, is_param=diff)
    t.scope = tuple(scope)
    return t


def number(value: float, *, label: str | None = None, grad_spec: GradSpec = GradSpec.PROHIBIT_GRAD) -> Tensor:
    """A number: a tensor of one output axis of dimension 1, optionally dimension-labeled."""
    value = validate.real_number(value, "a number")
    axes = [(label, 1)] if label else None
    shape = sh.Shape.make(batch_dims=[], input_dims=[], output_dims=None if axes else [1], output_axes=axes,
                          debug_name=repr(value))
    t = _terminal([_num_label(value)], "number", shape, grad_spec)
    t.own_forward = asg.Fetch(t.value_tn, asg.FetchConstant(float(value)))
    register(t)
    return t


def _num_label(v: float) -> str:
    return f"{v:g}"


def _lazy_number(value: asg.Lazy) -> Tensor:
    shape = sh.Shape.make(batch_dims=[], input_dims=[], output_dims=[1], debug_name="lazy number")
    t = _terminal(["number"], "number", shape, GradSpec.PROHIBIT_GRAD)
    t.own_forward = asg.Fetch(t.value_tn, asg.FetchConstant(value))
    register(t)
    return t


def range_(n: int, *, label=None) -> Tensor:
    """The values 0 .. n-1 along one output axis."""
    n = validate.count(n, "range's length", minimum=1)
    shape = sh.Shape.make(batch_dims=[], input_dims=[], output_dims=[n], debug_name=f"range {n}")
    t = _terminal(new_label(label, f"range{n}"), "range", shape, GradSpec.PROHIBIT_GRAD)
    t.own_forward = asg.Fetch(t.value_tn, asg.RangeOverOffsets())
    register(t)
    return t


def embed_symbol(static_sym: StaticSymbol, *, label=None) -> Tensor:
    """The current value of a static symbol as a one-cell tensor (OCANNL's `!@`)."""
    _static_symbol(static_sym, "embed_symbol")
    shape = sh.Shape.make(batch_dims=[], input_dims=[], output_dims=[1], debug_name=f"embed {static_sym!r}")
    t = _terminal(new_label(label, f"embed_{static_sym.symbol.name}"), "!@", shape, GradSpec.PROHIBIT_GRAD)
    t.own_forward = asg.Fetch(t.value_tn, asg.EmbedSymbol(static_sym))
    register(t)
    return t


class Batch(list):
    """Marks a nesting level of a literal as a batch axis (tuples are input, lists output)."""


def _static_symbol(value, what: str) -> None:
    if not isinstance(value, StaticSymbol):
        raise TensorError(f"einjit: {what} takes a StaticSymbol (from einjit.get_static_symbol), got "
                          f"{type(value).__name__} {value!r:.60}")


def _literal_axes(values) -> tuple[np.ndarray, list[str]]:
    kinds: list[str] = []
    level = values
    while isinstance(level, (list, tuple)):
        kinds.append("batch" if isinstance(level, Batch) else "input" if isinstance(level, tuple) else "output")
        if not level:
            break
        level = level[0]
    return validate.literal(values, "ndarray literal"), kinds


def ndarray(values, *, label: str | None = None, batch_axes: int | None = None, input_axes: int | None = None,
            prec: ops.Prec | None = None) -> Tensor:
    """An array literal, a hosted constant.

    Nested Python sequences follow the seed's rule: a tuple level is an input axis, a list level
    an output axis, a `Batch` level a batch axis. A NumPy array is split by `batch_axes`
    (leading) and `input_axes` (trailing); the rest are output axes.
    """
    prec = validate.precision(prec)
    if isinstance(values, np.ndarray):
        data = validate.real_array(values, "ndarray literal")
        if prec is None and data.dtype.kind == "f":
            prec = ops.as_prec(data.dtype)
        nb = validate.count(batch_axes or 0, "batch_axes")
        ni = validate.count(input_axes or 0, "input_axes")
        if nb + ni > data.ndim:
            raise TensorError(f"einjit: ndarray literal of {data.ndim} axes cannot have {nb} batch and {ni} input axes")
        kinds = ["batch"] * nb + ["output"] * (data.ndim - nb - ni) + ["input"] * ni
    else:
        data, kinds = _literal_axes(values)
        if data.ndim != len(kinds):
            raise TensorError("einjit: ndarray literal is ragged: all rows must have the same length")
    order = ([k for k, x in enumerate(kinds) if x == "batch"] + [k for k, x in enumerate(kinds) if x == "output"]
             + [k for k, x in enumerate(kinds) if x == "input"])
    dims = {kind: [data.shape[k] for k, x in enumerate(kinds) if x == kind] for kind in ("batch", "input", "output")}
    data = np.transpose(data, order)
    shape = sh.Shape.make(batch_dims=dims["batch"], input_dims=dims["input"], output_dims=dims["output"] or [1],
                          debug_name=label or "ndarray")
    if not dims["output"]:
        data = data.reshape(data.shape[:len(dims["batch"])] + (1,) + data.shape[len(dims["batch"]):])
    p = default_prec() if prec is None else ops.as_prec(prec)
    t = _terminal(new_label(label, "ndarray"), "ndarray", shape, GradSpec.PROHIBIT_GRAD, prec=p)
    t.value_tn.update_memory_mode(hosted(MemoryType.CONSTANT), provenance.CONSTANT_TENSOR)
    t.value_tn.array = bf16.as_cells(data, p)
    t._fwd_done = True
    register(t)
    return t


def file_mapped(path: str, *, label: str | None = None, prec: ops.Prec | str | np.dtype | type | None = None,
                batch_dims: Sequence[int] | None = None, input_dims: Sequence[int] | None = None,
                output_dims: Sequence[int] | None = None) -> Tensor:
    """Seed 003's `File_mapped` terminal: a constant whose values are memory-mapped from a file
    of raw values in the precision `prec` (native byte order, row-major in the layout order
    batch, output, input). The mapping is copy-on-write: routines take writable arrays, and
    the file is never written. The file length is the element count, as the seed's
    shape inference reads it: given dims must account for every byte, and an unknown output
    row takes the remaining elements. The file is mapped once the dims are known (when a
    routine using the tensor is compiled), so it must not shrink in between."""
    p = default_prec() if prec is None else ops.as_prec(prec)
    path = os.fspath(path)
    itemsize = p.dtype.itemsize
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise TensorError(f'einjit: file_mapped: cannot open "{path}": {e.strerror}') from None
    for d, name in ((batch_dims, "batch_dims"), (input_dims, "input_dims"), (output_dims, "output_dims")):
        validate.dims(d, name)
    batch = list(batch_dims or [])
    inp = list(input_dims or [])
    out = None if output_dims is None else list(output_dims)
    if out is not None:
        expected = math.prod([*batch, *inp, *out]) * itemsize
        if expected != size:
            raise sh.ShapeError(f'einjit: file_mapped: "{path}" has {size} bytes, but dims {[*batch, *out, *inp]} '
                                f"of {p.name} ({itemsize} bytes each) need {expected} bytes")
    lbl = new_label(label, "file_mapped")
    shape = sh.Shape.make(batch_dims=batch, input_dims=inp, output_dims=out, debug_name=label or path)
    sh.track(shape)
    sh.propagate_shapes(sh.UpdateStep(shape, sh.Terminal(sh.FileMapped(path, itemsize))))
    t = Tensor(label=lbl, op_label="file_mapped", shape=shape, update_step=None, children=(),
               value_tn=Tnode(lbl, lambda: _map_file(t, shape, path, p), p), grad_tn=None, projections=None)
    t.value_tn.update_memory_mode(hosted(MemoryType.CONSTANT), provenance.CONSTANT_TENSOR)
    t._fwd_done = True
    register(t)
    return t


def _map_file(t: Tensor, shape: sh.Shape, path: str, p: ops.Prec) -> tuple[int, ...]:
    """The node's dims, once known: the file is mapped as its host array then."""
    d = sh.to_dims(shape)
    expected = math.prod(d) * p.dtype.itemsize
    size = os.path.getsize(path)
    if size != expected:
        raise sh.ShapeError(f'einjit: file_mapped: "{path}" has {size} bytes now, but tensor {t.label_str} '
                            f"of dims {list(d)} needs {expected} bytes")
    t.value_tn.array = np.memmap(path, dtype=p.dtype, mode="c", shape=d)
    return d


_INITS: dict[str, Callable[[np.random.Generator, tuple[int, ...], int, int], np.ndarray]] = {
    "uniform": lambda rng, dims, fi, fo: rng.uniform(-1.0, 1.0, dims),
    "normal": lambda rng, dims, fi, fo: rng.standard_normal(dims),
    "xavier": lambda rng, dims, fi, fo: rng.uniform(-1, 1, dims) * math.sqrt(6.0 / max(1, fi + fo)),
    "kaiming": lambda rng, dims, fi, fo: rng.standard_normal(dims) * math.sqrt(2.0 / max(1, fi)),
    "zeros": lambda rng, dims, fi, fo: np.zeros(dims),
}


def param(label: str | Sequence[str], values=None, *, output_dims: list[int] | None = None,
          input_dims: list[int] | None = None, init: str = "kaiming", prec: ops.Prec | None = None) -> Tensor:
    """A trainable parameter; its dims not given are inferred from its uses.

    Initial values come from `values`: with no dims given, the values' own shape gives the
    output axes (a number is one axis of dimension 1); with dims given, the values fill them in
    row-major order and constrain the number of elements. Without values, `init` ("uniform",
    "normal", "xavier", "kaiming", "zeros") draws them in `train.init_params` from a seeded
    generator, so runs are reproducible. Inside an `@einjit.op` function the parameter is
    declared once per definition (see `op_scope`).
    """
    prec = validate.precision(prec)
    validate.label(label, "a parameter's label")
    validate.dims(output_dims, "output_dims")
    validate.dims(input_dims, "input_dims")
    if init not in _INITS:
        raise TensorError(f"einjit: unknown init {init!r} for parameter {label}; use one of {sorted(_INITS)}")
    declared, scope = op_scope.lookup(label) if isinstance(label, str) else (None, [])
    if declared is not None:
        return declared
    lbl = [label, *scope] if isinstance(label, str) else new_label(label, "param")
    path = [*scope, *lbl[:len(lbl) - len(scope)]]
    shape = sh.Shape.make(batch_dims=[], input_dims=input_dims, output_dims=output_dims, debug_name=".".join(path))
    fill = None
    if values is not None:
        arr = validate.literal(values, f"initial values of parameter {label}")
        if output_dims is None and input_dims is None:
            output_dims, input_dims = list(arr.shape) or [1], []
            shape = sh.Shape.make(batch_dims=[], input_dims=input_dims, output_dims=output_dims,
                                  debug_name=".".join(path))
        fill = arr.ravel()
    t = _terminal(lbl, "param", shape, GradSpec.REQUIRE_GRAD,
                  init=sh.ConstantFill(fill.size) if fill is not None else None, prec=prec, scope=scope)
    t.value_tn.update_memory_mode(hosted(MemoryType.CHANGED_ON_DEVICES), provenance.PARAM_VALUE)
    assert t.grad_tn is not None  # a parameter requires its gradient
    t.grad_tn.update_memory_mode(hosted(MemoryType.CHANGED_ON_DEVICES), provenance.PARAM_GRAD)
    if fill is not None:
        t.init = lambda rng: _fill_values(t, fill)
        if output_dims is not None and input_dims is not None:
            t.set_values(_fill_values(t, fill))
    else:
        t.init = lambda rng: _INITS[init](rng, _fitting_dims(t), _row_size(shape.input), _row_size(shape.output))
    t._fwd_done = True
    register(t)
    if isinstance(label, str):
        op_scope.remember(label, t)
    return t


def _fitting_dims(t: Tensor) -> tuple[int, ...]:
    """The parameter's dims, once checked to fit in memory (the generator draws float64s)."""
    memory.check_fits(f"parameter {t.label_str}", t.dims, np.float64)
    return t.dims


def _row_size(row) -> int:
    return int(np.prod([d.d for d in row.dims], dtype=np.int64))


def _fill_values(t: Tensor, fill: np.ndarray) -> np.ndarray:
    if fill.size != int(np.prod(t.dims)):
        raise TensorError(f"einjit: parameter {t.label_str} has dims {t.dims} but {fill.size} initial values")
    return fill.reshape(t.dims)


def add(a: Like, b: Like, *, label=None) -> Tensor:
    return binop("+", a, b, label=label)


def sub(a: Like, b: Like, *, label=None) -> Tensor:
    return binop("-", a, b, label=label)


def mul(a: Like, b: Like, *, label=None) -> Tensor:
    return binop("*", a, b, label=label)


def div(a: Like, b: Like, *, label=None) -> Tensor:
    return binop("/", a, b, label=label)


def pow(a: Like, b: Like, *, label=None) -> Tensor:  # noqa: A001 - the operation's name
    return binop("**", a, b, label=label)
