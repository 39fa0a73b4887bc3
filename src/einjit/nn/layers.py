"""Layers: thin `@ej.op` definitions over einjit's notation, so a whole model still compiles to
one routine and its parameters carry readable labels (`conv1.w`, `fc.b`).

Conventions: batch axes are einjit batch axes; features are output axes (`batch|->features`);
images are `batch|->channels, height, width`. A `Linear` consumes *all* output axes of its
input (einjit's `@` composes whole rows), which is what a flatten followed by a linear layer
computes; `Flatten` is a real reshape to one axis, for any other consumer and for
PyTorch-shaped weights (`fc.w` of `out x C*H*W`). A layer instance wraps its own `@ej.op`
definition, labelled by the instance's label: calling one instance on two inputs shares its
parameters, two instances never do.

`train()` / `eval()` switch `Dropout` (identity in eval) and `BatchNorm` (running statistics in
eval) in every graph already built, as PyTorch's do: the mode is a hosted one-cell tensor per
layer (`drop.training`, 1 or 0) that the compiled code reads at each call, so switching writes
one number and recompiles nothing. Both branches are computed in either mode and mixed by the
mode (a multiplication by exactly 1 or 0), which costs the other branch's arithmetic but keeps
one routine per graph.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np

from einjit.ir import assignments as asg
from einjit.ir import ops
from einjit.nn import init as nn_init
from einjit.shape import Dim, Kind, RowVar, ShapeError, Var
from einjit.shape.inference import provisional_row
from einjit.tensor import activations, reductions
from einjit.tensor import random as rnd
from einjit.tensor.gather import check_ids, take
from einjit.tensor.inputs import scalar
from einjit.tensor.notation import Template, cd, make_op
from einjit.tensor.op_scope import op
from einjit.tensor.operation import _lazy_number, einsum, ndarray, param, relu
from einjit.tensor.state import state
from einjit.tensor.tensor import Tensor, TensorError

_counts: dict[str, Iterator[int]] = {}


def _auto_label(kind: str) -> str:
    return f"{kind}{next(_counts.setdefault(kind, itertools.count(1)))}"


def _size(d: Var | Dim) -> int:
    assert isinstance(d, Dim)  # read once shapes are inferred: every dimension is known
    return d.d


def _cells(row) -> int:
    return int(np.prod([d.d for d in row.dims]))


def _fans_linear(p: Tensor) -> tuple[int, int]:
    """fan_in = cells of the input row (all feature axes), fan_out = cells of the output row."""
    return _cells(p.shape.input), _cells(p.shape.output)


def _fans_conv(p: Tensor) -> tuple[int, int]:
    """Input row `[in_channels, kh, kw]`: fan_in = its cells, fan_out = out_channels * kh * kw."""
    kernel = int(np.prod([_size(d) for d in p.shape.input.dims[1:]]))
    return _cells(p.shape.input), _cells(p.shape.output) * kernel


def _output_dims(x: Tensor) -> tuple[list[int | None], bool]:
    """The known output axes of `x` (None where not inferred yet) and whether more may lead."""
    row = x.shape.output
    return [d.d if isinstance(d, Dim) else None for d in row.dims], isinstance(row.bcast, RowVar)


class Layer:
    """A labelled definition with a train/eval flag."""

    kind = "layer"
    #: Whether the layer makes its parameters on its first call, their shapes following the
    #: input's axes (`Linear`'s weight spans every output axis of its input): before that call
    #: `params()` has nothing true to list, and says so rather than answering `[]`.
    params_on_call = False

    def __init__(self, label: str | None = None):
        self.label = label or _auto_label(self.kind.lower())
        self.training = True
        self._params: list[Tensor] = []
        self._mode: Tensor | None = None

    def train(self, mode: bool = True) -> Layer:
        self.training = bool(mode)
        if self._mode is not None:
            self._mode.set_values(float(self.training))
        return self

    def mode_tensor(self) -> Tensor:
        """The hosted one-cell tensor, 1 in training and 0 in evaluation, that this layer's
        compiled code reads: `train()` / `eval()` write it."""
        if self._mode is None:
            self._mode = scalar(float(self.training), label=f"{self.label}.training")
        return self._mode

    def eval(self) -> Layer:
        return self.train(False)

    def params(self) -> list[Tensor]:
        if self.params_on_call and not self._params:
            raise TensorError(f"einjit: {self.kind} {self.label} makes its parameters on its first call (their "
                              f"shapes follow the input's axes), and has not been called yet: call the model on an "
                              f"input once (`y = model(x)`) before asking for its params() or saving it")
        return list(self._params)

    def buffers(self) -> list[Tensor]:
        """The state tensors this layer keeps between calls (none unless it says so)."""
        return []

    def state_tensors(self) -> dict[str, Tensor]:
        """Parameters and buffers by label: what `einjit.save(layer, path)` writes. A label
        met again (a Dropout in a training and a prediction graph has a random counter in
        each) is numbered in the order the graphs were built: `drop.uniform.counter.1`."""
        named: dict[str, Tensor] = {}
        for t in [*self.params(), *self.buffers()]:
            if any(t is u for u in named.values()):
                continue
            name, k = t.label_str, 0
            while name in named:
                k += 1
                name = f"{t.label_str}.{k}"
            named[name] = t
        return named

    def _own_param(self, name: str, n: int, init: str) -> Tensor:
        """A parameter of this instance outside any `@op` definition (normalization scales)."""
        found = [p for p in self._params if p.label == [self.label, name]]
        if found:
            return found[0]
        p = param([self.label, name], output_dims=[n], input_dims=[])
        nn_init.set_init(p, init, lambda q: (n, n))
        self._params.append(p)
        return p

    def _keep(self, *ps: Tensor) -> None:
        for p in ps:
            if all(p is not q for q in self._params):
                self._params.append(p)

    def _error(self, axis: str, got, expected: str, x: Tensor) -> ShapeError:
        return ShapeError(f"einjit: {self.kind} {self.label}: {axis} of its input {x.label_str} (shape {x.shape}) "
                          f"is {got}, expected {expected}")

    def _expect_axes(self, x: Tensor, names: Sequence[str]) -> list[int | None]:
        dims, open_row = _output_dims(x)
        if len(dims) > len(names) or (len(dims) < len(names) and not open_row):
            raise self._error("the number of output axes", len(dims), f"{len(names)} ({', '.join(names)})", x)
        return [None] * (len(names) - len(dims)) + dims

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label})"


# ------------------------------------------------------------------ linear


def _linear(x: Tensor, out_features: int, bias: bool, weight_init: str) -> Tensor:
    w = param("w", output_dims=[out_features])
    nn_init.set_init(w, weight_init, _fans_linear)
    y = w @ x
    if not bias:
        return y
    b = param("b", output_dims=[out_features])
    nn_init.set_init(b, "bias_uniform", lambda p: _fans_linear(w))
    return b + y


class Linear(Layer):
    """`w @ x + b` over all output axes of `x` (`in_features` is their total size)."""

    kind = "Linear"
    params_on_call = True

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, init: str = "kaiming_uniform",
                 label: str | None = None):
        super().__init__(label)
        self.in_features, self.out_features, self.bias, self.init = in_features, out_features, bias, init
        self._definition = op(_linear)
        self._init_checked = False

    def __call__(self, x: Tensor) -> Tensor:
        dims, open_row = _output_dims(x)
        known = math.prod(d for d in dims if d is not None)
        if known > self.in_features or (dims and None not in dims and not open_row and known != self.in_features):
            raise self._error(f"the size of the feature axes {dims}", known, f"in_features={self.in_features}", x)
        y = self._definition(x, self.out_features, self.bias, self.init, label=self.label)
        w = self._definition.params(self.label)[0]
        if not self._init_checked:
            self._init_checked = True
            draw = w.init

            def checked_draw(rng):
                self._check_features(w, x)
                return draw(rng)

            w.init = checked_draw
        self._keep(*self._definition.params(self.label))
        return y

    def _check_features(self, w: Tensor, x: Tensor) -> None:
        """Once shapes are inferred, the weight's input row is the input's feature axes."""
        if _cells(w.shape.input) != self.in_features:
            raise self._error(f"the size of the feature axes {[_size(d) for d in w.shape.input.dims]}",
                              _cells(w.shape.input), f"in_features={self.in_features}", x)


# ------------------------------------------------------------------ convolution and pooling


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _conv_axis(out: str, kernel: str, size: int, stride: int, dilation: int, padding: int) -> str:
    """`stride*out+dilation*kernel-padding`; a kernel of size 1 contributes no term (its only
    index is 0), which also keeps shape inference from reading the size-1 axis as a broadcast.
    A negative offset is padding: reads past either end give zeros."""
    o = out if stride == 1 else f"{stride}*{out}"
    k = "" if size == 1 else f"+{kernel}" if dilation == 1 else f"+{dilation}*{kernel}"
    offset = f"-{padding}" if padding else "+0" if stride > 1 and size == 1 else ""
    return f"{o}{k}{offset}"


def _window_spec(kernel, stride, dilation, padding, channel_in: str, channel_out: str, kernel_slot: str) -> str:
    ah = _conv_axis("oh", "kh", kernel[0], stride[0], dilation[0], padding[0])
    aw = _conv_axis("ow", "kw", kernel[1], stride[1], dilation[1], padding[1])
    return f"... | -> {channel_in}, {ah}, {aw}; {kernel_slot} => ... | -> {channel_out}, oh, ow"


_BIAS = (Template("t =: t1 + t2"), Template("g1 =+ g; g2 =+ g"))


def _conv2d(x: Tensor, out_channels: int, in_channels: int, kernel: tuple[int, int], spec: str, bias: bool,
            weight_init: str) -> Tensor:
    w = param("w", output_dims=[out_channels], input_dims=[in_channels, *kernel])
    nn_init.set_init(w, weight_init, _fans_conv)
    y = einsum(spec, x, w, label="conv")
    if not bias:
        return y
    b = param("b", output_dims=[out_channels])
    nn_init.set_init(b, "bias_uniform", lambda p: _fans_conv(w))
    fwd, bwd = _BIAS
    return make_op("+", [y, b], logic="... | -> co, oh, ow; co => ... | -> co, oh, ow", forward=fwd, backprop=bwd)


def _check_window(layer: Layer, x: Tensor, h: int | None, w: int | None, kernel, padding, dilation) -> None:
    for name, size, k, p, d in (("height", h, kernel[0], padding[0], dilation[0]),
                                ("width", w, kernel[1], padding[1], dilation[1])):
        extent = d * (k - 1) + 1 - 2 * p
        if size is not None and size < extent:
            raise layer._error(f"the {name} axis", size, f"at least {extent} (kernel {k}, dilation {d}, "
                               f"padding {p})", x)


class Conv2d(Layer):
    """2-D convolution over `batch|->channels, height, width` (cross-correlation, as PyTorch)."""

    kind = "Conv2d"
    params_on_call = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size, *, stride=1, padding=0, dilation=1,
                 bias: bool = True, init: str = "kaiming_uniform", label: str | None = None):
        super().__init__(label)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel, self.stride, self.dilation = _pair(kernel_size), _pair(stride), _pair(dilation)
        self.padding = _pair(padding)
        if min(self.padding) < 0 or max(self.padding) >= max(self.kernel) * max(self.dilation):
            raise TensorError(f"einjit: Conv2d {self.label}: padding {padding} must be non-negative and smaller "
                              f"than the kernel's extent")
        self.bias, self.init = bias, init
        self._definition = op(_conv2d)
        self.spec = _window_spec(self.kernel, self.stride, self.dilation, self.padding, "ci", "co", "ci, kh, kw -> co")

    def __call__(self, x: Tensor) -> Tensor:
        c, h, w = self._expect_axes(x, ("channels", "height", "width"))
        if c is not None and c != self.in_channels:
            raise self._error("the channel axis (output axis 0)", c, f"in_channels={self.in_channels}", x)
        _check_window(self, x, h, w, self.kernel, self.padding, self.dilation)
        y = self._definition(x, self.out_channels, self.in_channels, self.kernel, self.spec, self.bias, self.init,
                             label=self.label)
        self._keep(*self._definition.params(self.label))
        return y


_MAXPOOL = (Template("t =:^^ arg1(t1, t2)"), Template("g1 =+ eq_gate(t1, t, g)"))
_AVGPOOL = (Template("t =:+ t1 * t2"), Template("g1 =+ g * t2"))


class _Pool(Layer):
    def __init__(self, kernel_size, stride=None, *, label: str | None = None):
        super().__init__(label)
        self.kernel = _pair(kernel_size)
        self.stride = _pair(stride) if stride is not None else self.kernel
        self.spec = _window_spec(self.kernel, self.stride, (1, 1), (0, 0), "c", "c", "kh, kw")

    def _kernel(self, value: float) -> Tensor:
        return ndarray(np.full(self.kernel, value), label=f"{self.label}.window")

    def _check(self, x: Tensor) -> None:
        _, h, w = self._expect_axes(x, ("channels", "height", "width"))
        _check_window(self, x, h, w, self.kernel, (0, 0), (1, 1))


class MaxPool2d(_Pool):
    """Maximum over windows; the gradient goes to the window's maximal cells."""

    kind = "MaxPool2d"

    def __call__(self, x: Tensor) -> Tensor:
        self._check(x)
        fwd, bwd = _MAXPOOL
        return make_op("maxpool", [x, self._kernel(0.0)], logic=self.spec, forward=fwd, backprop=bwd,
                       label=self.label)


class AvgPool2d(_Pool):
    """Mean over windows: a convolution with a constant kernel of `1 / window size`."""

    kind = "AvgPool2d"

    def __call__(self, x: Tensor) -> Tensor:
        self._check(x)
        fwd, bwd = _AVGPOOL
        return make_op("avgpool", [x, self._kernel(1.0 / math.prod(self.kernel))], logic=self.spec, forward=fwd,
                       backprop=bwd, label=self.label)


_FLATTEN = (Template("t =: t1"), Template("g1 =+ g"))


class Flatten(Layer):
    """All output axes of its input as one axis of their total size, in row-major order, as
    PyTorch's `Flatten()` after the batch axes: `y[c*H*W + h*W + w] = x[c, h, w]`, an einsum
    whose result axis is indexed affinely (so any layer can consume it, and its gradient is
    the same index read back). The strides need the input's sizes: a size still being derived
    (a convolution's output extent, found only when inference closes) is read from what
    closing would give now, and the result is pinned to the product, so a later operation
    that changes those sizes is a shape error, not a wrong layout."""

    kind = "Flatten"

    def __call__(self, x: Tensor) -> Tensor:
        dims = self._sizes(x)
        if len(dims) == 1:
            return x
        names = [f"f{k}" for k in range(len(dims))]
        strides = [math.prod(dims[k + 1:]) for k in range(len(dims))]
        terms = [name if stride == 1 else f"{stride}*{name}"
                 for name, stride, size in zip(names, strides, dims, strict=True) if size > 1]
        spec = f"... | -> {', '.join(names)} => ... | -> {'+'.join(terms) or '0'}"
        fwd, bwd = _FLATTEN
        return make_op("flatten", [x], logic=spec, forward=fwd, backprop=bwd, label=self.label,
                       output_dims=[math.prod(dims)])

    def _sizes(self, x: Tensor) -> list[int]:
        if x.shape.input.dims:
            raise self._error("the input row", x.shape.input, "no input axes (flatten output axes only)", x)
        dims, open_row = _output_dims(x)
        if open_row or None in dims:
            try:
                row = provisional_row(x.shape, Kind.OUTPUT)
            except ShapeError as e:
                raise self._error("the output row", "not inferred yet", f"sizes inference can derive ({e})",
                                  x) from e
            dims = [d.d if isinstance(d, Dim) else None for d in row.dims]
        if not dims or None in dims:
            raise self._error("the output row", "empty or not inferred", "the feature axes to flatten", x)
        return [d for d in dims if d is not None]


# ------------------------------------------------------------------ dropout


@functools.cache
def _dropout_templates(p: float) -> tuple[Template, Template]:
    """`t3` is the mode: in training cells under `p` are dropped and the rest scaled by
    `1/(1-p)`; in evaluation the threshold is 0 (nothing dropped) and the scale 1."""
    extra = 1.0 / (1.0 - p) - 1.0
    return (Template(f"t =: where(t2 < {p!r} * t3, 0, t1 * (1 + {extra!r} * t3))"),
            Template(f"g1 =+ where(t2 < {p!r} * t3, 0, g * (1 + {extra!r} * t3))"))


class Dropout(Layer):
    """Zeroes each cell with probability `p` in training, scaling the rest by `1/(1-p)`, and is
    the identity in evaluation; the mask is drawn inside the compiled routine
    (`einjit.uniform`), fresh at every run (in either mode, so masks resume after `eval()`)."""

    kind = "Dropout"

    def __init__(self, p: float = 0.5, *, seed: int = 0, label: str | None = None):
        super().__init__(label)
        if not 0.0 <= p < 1.0:
            raise TensorError(f"einjit: Dropout {self.label}: p must be in [0, 1), got {p}")
        self.p, self.seed = float(p), seed
        self._counters: list[Tensor] = []

    def buffers(self) -> list[Tensor]:
        """The random counters of the masks of every graph this layer is in."""
        return list(self._counters)

    def __call__(self, x: Tensor) -> Tensor:
        if self.p == 0.0:
            return x
        u = rnd.uniform(x, seed=self.seed, label=f"{self.label}.uniform")
        self._counters.append(rnd.counter(u))
        fwd, bwd = _dropout_templates(self.p)
        return make_op("dropout", [x, u, self.mode_tensor()], logic=None, forward=fwd, backprop=bwd,
                       label=self.label)


# ------------------------------------------------------------------ normalization


class BatchNorm(Layer):
    """Normalizes each channel (output axis 0) over the batch and any further output axes."""

    kind = "BatchNorm"

    def __init__(self, num_features: int, *, eps: float = 1e-5, momentum: float = 0.1, label: str | None = None):
        super().__init__(label)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.running_mean = state([self.label, "running_mean"], np.zeros(num_features))
        self.running_var = state([self.label, "running_var"], np.ones(num_features))

    def buffers(self) -> list[Tensor]:
        return [self.running_mean, self.running_var]

    def params(self) -> list[Tensor]:
        """`gamma` and `beta`, created on first request (their shape is the constructor's)."""
        n = self.num_features
        return [self._own_param("gamma", n, "ones"), self._own_param("beta", n, "zeros")]

    def _specs(self, x: Tensor) -> tuple[str, str]:
        dims, _ = _output_dims(x)
        if not dims:
            raise self._error("the output row", "empty", f"a channel axis of {self.num_features}", x)
        if dims[0] is not None and dims[0] != self.num_features:
            raise self._error("the channel axis (output axis 0)", dims[0], f"num_features={self.num_features}", x)
        rest = ", ".join(f"s{k}" for k in range(1, len(dims)))
        full = f"... | -> c{', ' + rest if rest else ''}"
        return f"{full} => c", f"{full}; c => {full}"

    def __call__(self, x: Tensor) -> Tensor:
        reduce_spec, bspec = self._specs(x)
        gamma, beta = self.params()
        m = self.mode_tensor()
        batch_mean = reductions.mean(x, reduce_spec)
        batch_centered = reductions.broadcast_op("-", x, batch_mean, bspec)
        batch_var_eps = reductions.mean(batch_centered * batch_centered + self.eps, reduce_spec)
        mean = m * batch_mean + (1 - m) * self.running_mean
        var_eps = m * batch_var_eps + (1 - m) * (self.running_var + self.eps)
        centered = reductions.broadcast_op("-", x, mean, bspec)
        inv_std = activations.rsqrt(var_eps)
        normed = reductions.broadcast_op("*", centered, inv_std * gamma, bspec)
        y = reductions.broadcast_op("+", normed, beta, bspec, label=self.label)
        y.own_forward = _with_running_update(y.own_forward, self, batch_mean, batch_var_eps, x, mean)
        return y

    def values_per_channel(self, x: Tensor, stat: Tensor) -> int:
        """Cells of `x` per channel, known once shapes are inferred. One value per channel in
        training (a batch of one, no spatial axes) has no variance: refused when the routine
        is compiled, as PyTorch refuses it in the forward pass."""
        n = int(np.prod(x.dims)) // int(np.prod(stat.dims))
        if n <= 1 and self.training:
            raise ShapeError(f"einjit: BatchNorm {self.label}: Expected more than 1 value per channel when training, "
                             f"got input {x.label_str} of dims {x.dims}; call .eval() on the model for a batch of one")
        return n


def _with_running_update(forward: asg.Asgns, layer: BatchNorm, mean: Tensor, var_eps: Tensor, x: Tensor,
                         stat: Tensor) -> asg.Asgns:
    """In training (mode 1) the running statistics move towards the batch's, the variance
    unbiased (`n / (n - 1)`); in evaluation (mode 0) they stay as they are, and so they do in a
    graph of one value per channel (compiled in evaluation, switched to training later)."""
    m = layer.momentum

    def unbiased() -> float:
        n = layer.values_per_channel(x, stat)
        return n / (n - 1) if n > 1 else 0.0

    def moves() -> float:
        return 1.0 if layer.values_per_channel(x, stat) > 1 else 0.0

    update = cd(f"rm =: where(0.5 < t * ok, {1 - m!r} * rm + {m!r} * bm, rm); "
                f"rv =: where(0.5 < t * ok, {1 - m!r} * rv + {m!r} * ((bv - {layer.eps!r}) * u), rv)",
                rm=layer.running_mean.value, rv=layer.running_var.value, bm=mean.value, bv=var_eps.value,
                u=_lazy_number(asg.Lazy(unbiased)), ok=_lazy_number(asg.Lazy(moves)), t=layer.mode_tensor().value)
    return asg.sequence(forward, asg.BlockComment(f"{layer.label} running statistics", update.asgns))


class LayerNorm(Layer):
    """Normalizes over the last output axis (of size `normalized_shape`), then scales and shifts."""

    kind = "LayerNorm"

    def __init__(self, normalized_shape: int, *, eps: float = 1e-5, label: str | None = None):
        super().__init__(label)
        self.n, self.eps = normalized_shape, eps

    def __call__(self, x: Tensor) -> Tensor:
        dims, _ = _output_dims(x)
        if not dims or (dims[-1] is not None and dims[-1] != self.n):
            raise self._error("the last output axis", dims[-1] if dims else "missing", f"normalized_shape={self.n}", x)
        full, reduced, spec = reductions.axis_specs(x, -1, False)
        bspec = f"{full}; {reduced} => {full}"
        mean = reductions.mean(x, spec)
        centered = reductions.broadcast_op("-", x, mean, bspec)
        var_eps = reductions.mean(centered * centered + self.eps, spec)
        normed = reductions.broadcast_op("*", centered, activations.rsqrt(var_eps), bspec)
        gamma, beta = self.params()
        return normed * gamma + beta

    def params(self) -> list[Tensor]:
        """`gamma` and `beta`, created on first request (so weights can be loaded before use)."""
        return [self._own_param("gamma", self.n, "ones"), self._own_param("beta", self.n, "zeros")]


class Embedding(Layer):
    """Rows of a `num_embeddings x embedding_dim` table picked by integer ids — a tensor of an
    integer precision (`ej.input("ids", batch_dims=[B, T], prec="int32")`), or a NumPy array,
    checked against the table size — read by a gather (`ej.take`: one row per id, gradient
    scatter-added), or by one-hot rows (a float tensor, a matmul). Ids in a tensor outside the
    table are clamped into it (`ej.take`); NumPy ids out of range are an error."""

    kind = "Embedding"
    params_on_call = True

    def __init__(self, num_embeddings: int, embedding_dim: int, *, label: str | None = None):
        super().__init__(label)
        self.num, self.dim = num_embeddings, embedding_dim
        self._definition = op(_embedding)

    def __call__(self, indices) -> Tensor:
        if not isinstance(indices, Tensor):
            arr = check_ids(indices, self.num, f"{self.kind} {self.label}")
            indices = ndarray(arr, batch_axes=arr.ndim, prec=ops.int32, label=f"{self.label}.indices")
        dims, _ = _output_dims(indices)
        is_ids = not indices.value_tn.prec.is_float
        if dims and dims[-1] is not None and dims[-1] != (1 if is_ids else self.num):
            raise self._error("the id axis" if is_ids else "the one-hot axis", dims[-1],
                              "1 (one id per batch cell)" if is_ids else f"num_embeddings={self.num}", indices)
        y = self._definition(indices, self.num, self.dim, label=self.label)
        self._keep(*self._definition.params(self.label))
        return y


def _embedding(indices: Tensor, num: int, dim: int) -> Tensor:
    table = param("table", output_dims=[dim], input_dims=[num])
    nn_init.set_init(table, "xavier_normal", lambda p: (1, 1))
    return table @ indices if indices.value_tn.prec.is_float else take(table, indices)


class Sequential(Layer):
    """Layers applied in order; `params()` lists theirs in order."""

    kind = "Sequential"

    def __init__(self, *layers, label: str | None = None):
        super().__init__(label)
        self.layers = list(layers)

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def train(self, mode: bool = True) -> Sequential:
        self.training = mode
        for layer in self.layers:
            if isinstance(layer, Layer):
                layer.train(mode)
        return self

    def params(self) -> list[Tensor]:
        return [p for layer in self.layers if isinstance(layer, Layer) for p in layer.params()]

    def buffers(self) -> list[Tensor]:
        return [b for layer in self.layers if isinstance(layer, Layer) for b in layer.buffers()]



class Activation(Layer):
    """A pointwise function as a layer of a `Sequential` (`Activation(ej.relu)`)."""

    kind = "Activation"

    def __init__(self, fn, *, label: str | None = None):
        super().__init__(label)
        self.fn = fn

    def __call__(self, x: Tensor) -> Tensor:
        return self.fn(x)


def ReLU() -> Activation:
    return Activation(relu, label=_auto_label("relu"))


def GELU(approximate: str = "none") -> Activation:
    """`einjit.gelu` as a layer (`approximate="tanh"` for GPT-2's form)."""
    if approximate not in activations.GELU_APPROXIMATIONS:
        raise TensorError(f"einjit: GELU: approximate must be one of {activations.GELU_APPROXIMATIONS}, "
                          f"got {approximate!r}")
    return Activation(functools.partial(activations.gelu, approximate=approximate), label=_auto_label("gelu"))

