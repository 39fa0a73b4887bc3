"""Tensors: a value node, an optional gradient node, and the code that computes them.

Each tensor holds only its *own* forward assignment and its own backprop assignment. The code
of a whole expression is assembled when it is consumed (`consume_forward_code`,
`consume_backprop_code`): forward in increasing creation order, backprop in decreasing
creation order. Creation order is a topological order of the expression graph (children are
always created before parents), so this is correct even when a sub-tensor is shared between
branches — strictly more robust than splicing a child's code into its first consumer.

Rootness follows the seed: a tensor is a forward (and, if differentiable, backprop) root until
it is used as an argument of another tensor; only roots can be consumed, and consuming code
twice is an error.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
from typing import Callable, Sequence, TypeAlias, Union
from typing import Iterator as PyIterator

import numpy as np

from einjit import shape as sh
from einjit.errors import EinjitError
from einjit.ir import assignments as asg
from einjit.ir import bf16, ops, provenance
from einjit.ir.tnode import Tnode


class GradSpec(enum.Enum):
    REQUIRE_GRAD = "require"
    IF_NEEDED = "if_needed"
    PROHIBIT_GRAD = "prohibit"


class TensorError(EinjitError, ValueError):
    pass


_default_prec: list[ops.Prec] = [ops.single]


def default_prec() -> ops.Prec:
    return _default_prec[-1]


@contextlib.contextmanager
def default_precision(prec: "ops.Prec | str | np.dtype | type") -> PyIterator[None]:
    """Tensors created inside the block get this value/gradient precision (a `Prec`, a name such
    as "float32" or "double", or a NumPy dtype)."""
    _default_prec.append(ops.as_prec(prec))
    try:
        yield
    finally:
        _default_prec.pop()


def set_default_precision(prec: "ops.Prec | str | np.dtype | type") -> None:
    _default_prec[0] = ops.as_prec(prec)


_ids = itertools.count(1)
_forward_roots: dict[int, "Tensor"] = {}
_backprop_roots: dict[int, "Tensor"] = {}


#: While `unchanged_roots` is active: the tensors whose code was consumed inside, per kind.
_consumed_inside: list[tuple[list["Tensor"], list["Tensor"]]] = []


@contextlib.contextmanager
def unchanged_roots() -> PyIterator[None]:
    """The wildcard form: tensors built inside only add shape constraints; rootness of
    everything that existed before is restored afterwards, and new tensors are not roots.
    Code consumed inside (a `cd` naming a root takes its forward code) is given back too, so a
    later routine for such a tensor still computes it."""
    fwd, bprop = dict(_forward_roots), dict(_backprop_roots)
    consumed: tuple[list[Tensor], list[Tensor]] = ([], [])
    _consumed_inside.append(consumed)
    try:
        yield
    finally:
        _consumed_inside.pop()
        for x in consumed[0]:
            x._fwd_done = False
        for x in consumed[1]:
            x._bprop_done = False
        _forward_roots.clear()
        _forward_roots.update(fwd)
        _backprop_roots.clear()
        _backprop_roots.update(bprop)


def _note_consumed(x: "Tensor", kind: int) -> None:
    for consumed in _consumed_inside:
        consumed[kind].append(x)

def computes_in_host_array(context: object, tn: Tnode) -> bool:
    """Whether `context` computes in the host array of `tn` itself (the C backend's default
    context does, for hosted nodes), so host transfers of `tn` there are no-ops to skip."""
    if getattr(context, "share_host_arrays", False) and tn.is_hosted():
        return True
    arrays = getattr(context, "arrays", None)
    return isinstance(arrays, dict) and tn.array is not None and arrays.get(tn) is tn.array


def _transferring_holders(tn: Tnode) -> list:
    """The live contexts holding `tn` in an array of their own."""
    from einjit.backends.interface import contexts_holding
    return [c for c in contexts_holding(tn) if not computes_in_host_array(c, tn)]


def written(tn: Tnode) -> None:
    """After the host array of `tn` was written in place: copy it to every context holding the
    node (the seed's `from_host`), so the routines there read the new values. Devices already
    shut down are skipped: they run nothing more."""
    from einjit.backends.interface import DeviceError
    for context in _transferring_holders(tn):
        with contextlib.suppress(DeviceError):
            context.from_host(tn)


@contextlib.contextmanager
def holders_locked(tn: Tnode) -> PyIterator[None]:
    """Hold the locks of every context holding `tn` (in registration order, the one order
    every thread takes them in), so a host read or write sees no routine half-way."""
    from einjit.backends.interface import context_lock, contexts_holding
    with contextlib.ExitStack() as stack:
        for context in contexts_holding(tn):
            stack.enter_context(context_lock(context))
        yield


def to_host(tn: Tnode) -> None:
    """Before reading the host array of `tn`: bring back what the routines computed (the
    seed's `to_host`) when one context holds the node. Replicas (several contexts, e.g. data
    parallel devices) may differ, so then the host keeps what their synchronization last
    wrote there; a device shut down has nothing newer than that either."""
    from einjit.backends.interface import DeviceError
    holders = _transferring_holders(tn)
    if len(holders) == 1:
        with contextlib.suppress(DeviceError):
            holders[0].to_host(tn)


def check_numeric(values: object, what: str) -> np.ndarray:
    """`values` as an array of real numbers, or a `TensorError` naming `what` they were meant for
    (`tensor.validate` holds the rules; imported here late, as it builds on this module). Unlike a
    literal, data written into a tensor may not be an object array: element-wise conversion of a
    whole data set would be slow, and is almost always a bug in the caller's loading code."""
    from einjit.tensor import validate
    arr = np.asarray(values)
    if arr.dtype.kind == "O":
        raise TensorError(f"einjit: {what}: object arrays are not supported; convert the data first "
                          f"(e.g. `arr.astype(np.float32)`)")
    return validate.real_array(arr, what)


def _describe(tensor: "Tensor", tn: Tnode) -> str:
    what = "gradient of tensor" if tn is tensor.grad_tn else "tensor"
    return f"{what} {tensor.describe()}"


def _node_dims(tensor: "Tensor", tn: Tnode) -> tuple[int, ...]:
    try:
        return tn.dims
    except sh.ShapeError as e:
        raise TensorError(f"einjit: the dims of {_describe(tensor, tn)} are not known yet: its shape is still "
                          f"being inferred ({e}); compile a routine using it, or give its dims at "
                          f"creation") from None


def _squeezed(dims: Sequence[int]) -> tuple[int, ...]:
    return tuple(d for d in dims if d != 1)


def converted_values(tensor: "Tensor", tn: Tnode, values: object) -> np.ndarray:
    """`values` as an array of `tn`'s dims and precision, or a `TensorError` saying why not.

    Accepted: exactly the node's dims (batch, output, input axes in memory order), the same
    dims up to axes of size 1 (labels of shape `(64,)` for a `(64, 1)` tensor), or one number
    filling every cell. Numbers convert within their kind or up (int → float, float64 →
    float32 as NumPy's `same_kind` casting allows); complex, object, string and datetime data
    are refused.
    """
    if isinstance(values, Tensor):
        values = values.numpy()
    arr = check_numeric(values, f"cannot set the values of {_describe(tensor, tn)}")
    dtype = tn.prec.host_dtype
    if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
        raise TensorError(f"einjit: cannot set the values of {_describe(tensor, tn)} (precision {tn.prec.name}, "
                          f"{dtype}) from a {arr.dtype} array without losing its kind; convert it explicitly "
                          f"with `.astype(np.{dtype})`")
    dims = _node_dims(tensor, tn)
    if arr.shape != dims:
        if arr.ndim == 0 or _squeezed(arr.shape) == _squeezed(dims):
            arr = np.broadcast_to(arr, dims) if arr.ndim == 0 else arr.reshape(dims)
        else:
            raise TensorError(f"einjit: cannot set the values of {_describe(tensor, tn)}: it has dims {dims} "
                              f"(shape {tensor.shape}, axes in batch, output, input order) but the array has "
                              f"shape {arr.shape}; reshape the array to {dims}")
    return arr


def _read_only(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


class NodeView:
    """`t.value` / `t.grad`: a tensor node seen with its tensor's shape, readable and writable
    from NumPy.

    Reads (`numpy()`, `v[...]`, `np.asarray(v)`) return *read-only snapshots*: copies taken
    now, which a later routine call does not change, and which refuse writes (NumPy raises
    "assignment destination is read-only") — a writable copy would take a write and drop it
    silently. Writes go through the view: `assign` / `set_values`, `v[key] = array` check the
    array against the node and store it in place in the host array, which every routine of the
    node reads. `.copy()` of a snapshot is an ordinary writable array.
    """

    __slots__ = ("tensor", "tn", "is_grad")

    def __init__(self, tensor: "Tensor", tn: Tnode, is_grad: bool):
        self.tensor, self.tn, self.is_grad = tensor, tn, is_grad

    @property
    def shape(self) -> sh.Shape:
        return self.tensor.shape

    @property
    def dims(self) -> tuple[int, ...]:
        return _node_dims(self.tensor, self.tn)

    @property
    def dtype(self) -> np.dtype:
        return self.tn.prec.host_dtype

    def _host(self) -> np.ndarray:
        mode = self.tn.memory_mode
        if self.tn.array is None and mode is not None and not mode.can_be_hosted:
            raise TensorError(
                f"einjit: {_describe(self.tensor, self.tn)} has no values on the host: its memory mode is {mode} "
                f"({provenance.describe(self.tn.provenance)}), so only the routines see it; call .hosted() "
                f"instead to read it from NumPy")
        if self.tn.array is None:
            raise TensorError(
                f"einjit: {_describe(self.tensor, self.tn)} has no values on the host yet: it is a parameter "
                f"not initialized (call train.init_params), an input not set (call set_values), a value "
                f"not computed by a routine yet, or a node not kept in memory (call .hosted() before "
                f"compiling the routine that computes it)")
        return self.tn.array

    def read(self) -> np.ndarray:
        """The live host array, current as of now: for einjit's own loops, which copy what they
        hand out. Users get copies from `numpy()`. A bf16 node's array holds bit patterns: it
        is read as a float32 copy of its values."""
        host = self._host()
        to_host(self.tn)
        return bf16.from_bits(host) if self.tn.prec is ops.bf16 else host

    def written(self) -> None:
        written(self.tn)

    def numpy(self) -> np.ndarray:
        """A read-only copy of the node's current host values, taken while no routine of a
        context holding the node runs (`context_lock`)."""
        with holders_locked(self.tn):
            return _read_only(self.read().copy())

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        if copy is False:
            raise ValueError(f"einjit: the values of {_describe(self.tensor, self.tn)} are read as a copy; "
                             f"np.from_dlpack(tensor) gives the live host array")
        out = self.numpy()
        return out if dtype is None else _read_only(out.astype(dtype, copy=False))

    def __getitem__(self, key) -> np.ndarray:
        with holders_locked(self.tn):
            return _read_only(np.array(self.read()[key], copy=True))

    def _writable(self) -> np.ndarray:
        """The host array to write into; a node not yet committed to a memory mode becomes
        hosted, so the writes reach the routines compiled afterwards."""
        from einjit.ir.tnode import MemoryModeError, MemoryType, hosted
        if not self.tn.is_hosted():
            try:
                self.tn.update_memory_mode(hosted(MemoryType.NONCONSTANT), provenance.HOSTED_BY_WRITE)
            except MemoryModeError:
                raise TensorError(
                    f"einjit: cannot write {_describe(self.tensor, self.tn)}: it is {self.tn.memory_mode}, kept "
                    f"only inside the routines that compute it; write its inputs or parameters instead, or "
                    f"call .hosted() on it before compiling") from None
        if self.tn.is_constant() and self.tn.array is not None:
            raise TensorError(
                f"einjit: cannot write {_describe(self.tensor, self.tn)}: it is a constant (ej.ndarray), whose "
                f"values compiled routines may have folded in; use ej.input(...) for data set per step")
        return self.tn.host_array()

    def assign(self, values: object) -> None:
        """Set every cell (see `converted_values` for what is accepted)."""
        self.staged(values)()

    def staged(self, values: object) -> Callable[[], None]:
        """Check that `values` can be written into every cell, without writing them: the
        returned function writes them (holding the locks of the contexts that hold the node).
        Checking a batch of writes before making any (a checkpoint's) makes the batch all or
        nothing."""
        host = self._writable()
        arr = converted_values(self.tensor, self.tn, values)

        def write() -> None:
            with holders_locked(self.tn):
                host[...] = bf16.to_bits(arr) if self.tn.prec is ops.bf16 else arr
                self.written()

        return write

    def __setitem__(self, key, values) -> None:
        if key is Ellipsis or (isinstance(key, slice) and key == slice(None)):
            self.assign(values)
            return
        host = self._writable()
        arr = check_numeric(values, f"cannot set the values of {_describe(self.tensor, self.tn)}")
        if not np.can_cast(arr.dtype, self.dtype, casting="same_kind"):
            raise TensorError(f"einjit: cannot write {arr.dtype} values into {_describe(self.tensor, self.tn)} "
                              f"of precision {self.tn.prec.name}; convert them with `.astype`")
        with holders_locked(self.tn):
            try:
                host[key] = bf16.to_bits(arr) if self.tn.prec is ops.bf16 else arr
            except (IndexError, ValueError) as e:
                raise TensorError(f"einjit: cannot write into {_describe(self.tensor, self.tn)} of dims "
                                  f"{host.shape} at {key!r}: {e}") from None
            self.written()

    def __repr__(self) -> str:
        return f"<{'grad' if self.is_grad else 'value'} of {self.tensor.label_str}: {self.tn!r}>"


class Tensor:
    """A tensor: its shape, value (and gradient) nodes, and the code computing them.

    Labels follow seed 004: `label` is the label list, whose first element is the string
    that introduced the tensor, followed by the configuration labels it was declared under
    (`scope`): a parameter `"w"` declared in an `@op` definition called with `label="A"`
    inside one called with `label="inner"`... is `['w', 'A', 'inner']`. Its display,
    `label_str`, is the dotted path with the scope first, `A.inner.w`, as PyTorch users know
    parameter names: that is the parameter's name in messages, its checkpoint key and its
    nodes' label (which names it in the generated C)."""

    __slots__ = ("id", "label", "scope", "op_label", "shape", "update_step", "children", "value_tn", "grad_tn",
                 "own_forward", "own_backprop", "projections", "is_param", "init", "_fwd_done", "_bprop_done",
                 "__weakref__")

    def __init__(self, *, label: list[str], op_label: str, shape: sh.Shape, update_step: sh.UpdateStep | None,
                 children: tuple["Tensor", ...], value_tn: Tnode, grad_tn: Tnode | None,
                 projections: asg.Lazy | None, is_param: bool = False):
        self.id = next(_ids)
        self.label, self.op_label = label, op_label
        #: The configuration labels at the end of `label` (seed 004's `~config` labels).
        self.scope: tuple[str, ...] = ()
        self.shape, self.update_step = shape, update_step
        self.children = children
        self.value_tn, self.grad_tn = value_tn, grad_tn
        self.projections = projections
        self.own_forward: asg.Asgns = asg.Noop()
        self.own_backprop: asg.Asgns = asg.Noop()
        self.is_param = is_param
        self.init: Callable[[np.random.Generator], np.ndarray] | None = None
        self._fwd_done = False
        self._bprop_done = False

    # -------------------------------------------------------------- views

    @property
    def value(self) -> NodeView:
        return NodeView(self, self.value_tn, False)

    @property
    def grad(self) -> NodeView | None:
        return None if self.grad_tn is None else NodeView(self, self.grad_tn, True)

    @property
    def is_differentiable(self) -> bool:
        return self.grad_tn is not None

    @property
    def label_str(self) -> str:
        """The label's display: the dotted path, configuration labels first (`A.inner.w`)."""
        return ".".join(self.path)

    @property
    def path(self) -> list[str]:
        """The label with its configuration labels moved to the front (`['A', 'inner', 'w']`)."""
        own = len(self.label) - len(self.scope)
        return [*self.scope, *self.label[:own]]

    def relabel(self, label: list[str], scope: Sequence[str] = ()) -> None:
        """Give the tensor a new label list ending with the configuration labels `scope`; its
        nodes and shape take the display path."""
        self.label, self.scope = list(label), tuple(scope)
        path = self.path
        self.value_tn.label = list(path)
        if self.grad_tn is not None:
            self.grad_tn.label = path + ["grad"]
        self.shape.debug_name = ".".join(path)

    @property
    def dims(self) -> tuple[int, ...]:
        return self.value_tn.dims

    def describe(self, depth: int = 4) -> str:
        """The label for messages; an unlabelled operation also names its arguments, down to
        `depth` levels (a chain of thousands of unlabelled operations stays one line)."""
        if self.label != [self.op_label] or not self.children or depth <= 0:
            return repr(self.label_str)
        args = ", ".join(c.describe(depth - 1) for c in self.children)
        return f"{self.label_str!r} (the {self.op_label} of {args})"

    @property
    def dtype(self) -> np.dtype:
        return self.value_tn.prec.host_dtype

    def numpy(self) -> np.ndarray:
        """A read-only copy of the current values (`NodeView.numpy`); write with `set_values`."""
        return self.value.numpy()

    def set_values(self, values: object) -> None:
        """Write new values in place (checked against the tensor's dims and precision, see
        `converted_values`); every routine reading this tensor sees them on its next call."""
        self.value.assign(values)

    # -------------------------------------------------------------- NumPy interop

    #: NumPy defers every ufunc to the tensor's operators: `np_array * t` builds a Tensor.
    __array_ufunc__ = None

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.value.__array__(dtype, copy)

    def __dlpack__(self, **kwargs):
        """Exports the live host array (no copy): writes through it are the tensor's values. A
        bf16 tensor has none to export: its values are bit patterns, read as float32 copies."""
        if self.value_tn.prec is ops.bf16:
            raise TensorError(f"einjit: {self.describe()} is bf16, whose host array holds bit patterns, not "
                              f"values; read it with .numpy() (float32) instead of DLPack")
        return self.value.read().__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.value.read().__dlpack_device__()

    def hosted(self) -> "Tensor":
        """Keep the value (and gradient) readable from the host after routines run."""
        from einjit.ir.tnode import MemoryType, hosted
        self.value_tn.update_memory_mode(hosted(MemoryType.CHANGED_ON_DEVICES), provenance.HOSTED_VALUE)
        if self.grad_tn is not None:
            self.grad_tn.update_memory_mode(hosted(MemoryType.CHANGED_ON_DEVICES), provenance.HOSTED_GRAD)
        return self

    def materialize(self, *, grad: bool = False) -> "Tensor":
        """Store the value (or, with `grad`, the gradient) in an array on the device, so that
        every routine can read it; the optimizer will not inline it away (seed 001: the modes
        the user sets explicitly). Returns the tensor, for chaining."""
        from einjit.ir.tnode import MATERIALIZED
        self._memory_node(grad).update_memory_mode(MATERIALIZED, provenance.MATERIALIZE_CALL)
        return self

    def virtual(self, *, grad: bool = False) -> "Tensor":
        """Never store the value (or gradient): its computation is inlined where it is read. A
        routine that cannot inline it fails naming this call."""
        from einjit.ir.tnode import VIRTUAL
        self._memory_node(grad).update_memory_mode(VIRTUAL, provenance.VIRTUAL_CALL)
        return self

    def on_device(self, *, grad: bool = False) -> "Tensor":
        """Store the value (or gradient) on the device only: routines share it, the host does
        not see it."""
        from einjit.ir.tnode import ON_DEVICE
        self._memory_node(grad).update_memory_mode(ON_DEVICE, provenance.ON_DEVICE_CALL)
        return self

    def _memory_node(self, grad: bool) -> Tnode:
        if not grad:
            return self.value_tn
        if self.grad_tn is None:
            raise TensorError(f"einjit: tensor {self.label_str} is not differentiable: it has no gradient "
                              f"whose memory mode could be set")
        return self.grad_tn

    # -------------------------------------------------------------- subtree

    def subtree(self) -> list["Tensor"]:
        """This tensor and everything under it, in creation (topological) order."""
        seen: dict[int, Tensor] = {}
        stack = [self]
        while stack:
            t = stack.pop()
            if t.id in seen:
                continue
            seen[t.id] = t
            stack.extend(t.children)
        return [seen[k] for k in sorted(seen)]

    def params(self) -> list["Tensor"]:
        return [t for t in self.subtree() if t.is_param]

    # -------------------------------------------------------------- printing

    def __repr__(self) -> str:
        return f"Tensor({self.label_str} : {self.shape} {'grad' if self.grad_tn is not None else 'non-diff'})"

    def __str__(self) -> str:
        from einjit.tensor.printing import render_tensor
        return render_tensor(self)

    # -------------------------------------------------------------- operators
    # Implemented by einjit.tensor.operation (imported on use: it imports this module).

    def __add__(self, other: Like) -> Tensor:
        from einjit.tensor import operation
        return operation.binop("+", self, other)

    def __radd__(self, other: Like) -> Tensor:
        from einjit.tensor import operation
        return operation.binop("+", other, self)

    def __sub__(self, other: Like) -> Tensor:
        from einjit.tensor import operation
        return operation.binop("-", self, other)

    def __rsub__(self, other: Like) -> Tensor:
        from einjit.tensor import operation
        return operation.binop("-", other, self)

    def __mul__(self, other: Like) -> Tensor:
        from einjit.tensor import operation
        return operation.binop("*", self, other)

    def __rmul__(self, other: Like) -> Tensor:
        from einjit.tensor import operation
        return operation.binop("*", other, self)

    def __truediv__(self, other: Like) -> Tensor:
        from einjit.tensor import operation
        return operation.binop("/", self, other)

    def __rtruediv__(self, other: Like) -> Tensor:
        from einjit.tensor import operation
        return operation.binop("/", other, self)

    def __pow__(self, other: Like) -> Tensor:
        from einjit.tensor import operation
        return operation.binop("**", self, other)

    def __rpow__(self, other: Like) -> Tensor:
        from einjit.tensor import operation
        return operation.binop("**", other, self)

    def __matmul__(self, other: Like) -> Tensor:
        from einjit.tensor import operation
        return operation.matmul(self, other)

    def __rmatmul__(self, other: Like) -> Tensor:
        from einjit.tensor import operation
        return operation.matmul(other, self)

    def __neg__(self) -> Tensor:
        from einjit.tensor import operation
        return operation.neg(self)

    @property
    def T(self) -> Tensor:  # NumPy's name for the transpose
        from einjit.tensor import operation
        return operation.transpose(self)


#: What the operations accept as an argument: a tensor, or a constant that `as_tensor` converts.
Like: TypeAlias = Union[Tensor, float, int, np.ndarray]


def new_label(label: str | Sequence[str] | None, op_label: str) -> list[str]:
    if label is None:
        return [op_label]
    parts = [label] if isinstance(label, str) else list(label) if isinstance(label, (list, tuple)) else None
    if not parts or not all(isinstance(p, str) for p in parts):
        raise TensorError(f"einjit: the label of a {op_label} must be a str or a list of str, got {label!r:.60}")
    return parts


def make_node(label: list[str], shape: sh.Shape, prec: ops.Prec) -> Tnode:
    return Tnode(label, lambda: sh.to_dims(shape), prec)


def register(t: "Tensor") -> None:
    """Make `t` a root and its arguments non-roots."""
    for c in t.children:
        _forward_roots.pop(c.id, None)
        _backprop_roots.pop(c.id, None)
    _forward_roots[t.id] = t
    if t.grad_tn is not None:
        _backprop_roots[t.id] = t


def is_forward_root(t: Tensor) -> bool:
    return t.id in _forward_roots


def is_backprop_root(t: Tensor) -> bool:
    return t.id in _backprop_roots


def consume_forward_code(t: Tensor) -> asg.Asgns:
    """The forward code of `t`'s subtree not yet consumed; `t` stops being a root."""
    if not is_forward_root(t):
        if t._fwd_done:
            raise TensorError(f"einjit: the forward code of tensor {t.describe()} was already consumed "
                              f"(compiled into a routine); a subtree's code can be used once. To run its "
                              f"forward pass again, e.g. after a training step, compile "
                              f"`einjit.fit.forward_step(t, inputs=[...])`, which recomputes it")
        raise TensorError(f"einjit: tensor {t.describe()} is not a forward root: it is an argument of "
                          f"another tensor, whose code computes it; to compute it on its own, compile "
                          f"`einjit.fit.forward_step(t, inputs=[...])`")
    del _forward_roots[t.id]
    parts = []
    for x in t.subtree():
        if not x._fwd_done:
            x._fwd_done = True
            _note_consumed(x, 0)
            parts.append(x.own_forward)
    return asg.sequence(*parts)


def consume_backprop_code(t: Tensor) -> asg.Asgns:
    """The backprop code of `t`'s subtree, latest tensor first; `t` stops being a root."""
    if t.grad_tn is None:
        raise TensorError(f"einjit: tensor {t.label_str} is not differentiable: it has no backprop code")
    if not is_backprop_root(t):
        raise TensorError(f"einjit: tensor {t.label_str} is not a backprop root: its backprop code was "
                          f"already consumed or it is an argument of another tensor")
    del _backprop_roots[t.id]
    parts = []
    for x in reversed(t.subtree()):
        if x.grad_tn is not None and not x._bprop_done:
            x._bprop_done = True
            _note_consumed(x, 1)
            parts.append(x.own_backprop)
    return asg.sequence(*parts)


def needs_grad(grad_spec: GradSpec, children: Sequence[Tensor]) -> bool:
    match grad_spec:
        case GradSpec.REQUIRE_GRAD:
            return True
        case GradSpec.PROHIBIT_GRAD:
            return False
        case GradSpec.IF_NEEDED:
            return any(c.grad_tn is not None for c in children)
    raise ValueError(grad_spec)
