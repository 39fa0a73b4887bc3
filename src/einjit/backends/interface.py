"""The backend interfaces of seed 001: work items, routines, code, no-device and device backends.

A backend turns assignments (or low-level code) into `code`, links code into a `context` to
get a `Routine`, and runs routines through `Work` items:

- `routine.schedule()` reads the current values of the routine's static-symbol `IntRef`s
  into a new `Work` and returns it; it never blocks and never runs anything. Capturing the
  values at scheduling time is what lets a training loop bump a batch counter and schedule
  again before the previous step ran. Values outside a symbol's range are refused here,
  before any compiled code runs (`StaticRangeError`).
- Calling the routine itself schedules, runs and awaits it.
- Running a work (`work()`) executes the routine to completion on a no-device backend, and
  only launches it (enqueues it on the device) on a device backend; `await_(device)` waits.

`SimpleNoDeviceBackend` is the seed's functor: a `SimpleBackend` only knows how to compile
low-level code into its own `procedure` and call it, and the adapter adds the `Postponed`
versus `Compiled` code: `shared=True` compiles relocatable code at `compile` time, so one
compilation serves every context it is linked into; otherwise compiling waits for `link`,
where the backend knows the context and may specialize the code to it.

Memory classes, beside the memory modes of `ir.tnode`, say how a backend stores a node's
array: `CpuMemClass` (`LOCAL_ONLY`, `FROM_CONTEXT`, `CONSTANT_FROM_HOST`) for CPU backends
and `CudaMemClass` (`LOCAL_ONLY`, `GLOBAL`) for the CUDA backend. A routine records the class
of every node it touches in `Routine.mem_classes` (the classes live in `params.py`).

`compile_batch` decides routine-local storage for the routines it compiles together
(`ir.local_storage.localize`): nodes a routine writes and consumes within one call are
declared in the generated code instead of kept in a context. `Routine.memory` (also
`kept_bytes`, `local_bytes`) reports the bytes a linked routine keeps between calls and the
bytes that live only during a call (`einjit.memory.report`).

Every context registers itself with its backend (`register_context`), so `contexts_holding(tn)`
finds the contexts to refresh after a host write. Host transfers move hosted nodes only:
anything else is a `NotHostedError` naming the node, its memory mode and the mode's provenance.
`lower_assignments` is the one lowering (shape inference, dumps, optimization), under the
program-local names of `ir.naming`, so generated code does not depend on global ids.
"""

from __future__ import annotations

import enum
import itertools
import threading
import weakref
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    Generic,
    Iterable,
    Mapping,
    Protocol,
    Sequence,
    TypeVar,
    runtime_checkable,
)

from einjit import config, memory
from einjit.backends.params import CudaMemClass, repeated_names
from einjit.backends.params import MemClass as CpuMemClass
from einjit.errors import EinjitError
from einjit.ir import assignments as asg
from einjit.ir import low_level as ll
from einjit.ir.c_names import routine_name
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.naming import node_base, stable_names
from einjit.ir.passes.local_storage import localize
from einjit.ir.tnode import Tnode
from einjit.memory import MemoryReport

__all__ = [
    "Backend", "BackendError", "BackendUsageError", "Code", "Compiled", "Context", "CpuMemClass", "CudaMemClass",
    "DeviceError", "HostTransfers", "NoDeviceBackend", "NodeNotInContextError", "NotHostedError", "Postponed",
    "StaticRangeError", "Routine", "RoutineFailed", "SimpleBackend", "SimpleNoDeviceBackend", "WrongBackendError",
    "Work", "capture_values", "check_code", "check_hosted", "check_static_values", "contexts_holding",
    "default_context", "forget_context", "load_inputs", "register_context",
    "checked_name", "context_lock", "default_name", "lower_assignments", "low_level_of", "make_refs",
    "missing_input_error", "not_held_error",
    "prepare", "read_first", "routine_inputs",
]

Ctx = TypeVar("Ctx")
Proc = TypeVar("Proc")


# ---------------------------------------------------------------- errors


class BackendError(EinjitError):
    """Misuse of backends, contexts and devices; the message names what was involved."""


class BackendUsageError(BackendError, ValueError):
    """A value a backend cannot use: a host array of the wrong shape or layout, a count or a
    name that does not fit; the message says which and what is expected."""


class WrongBackendError(BackendError, TypeError):
    """Code, a context or a device of one backend handed to another backend."""


class NodeNotInContextError(BackendError, LookupError):
    """A tensor node used in a context that does not hold it (never transferred or computed there)."""


class DeviceError(BackendError, RuntimeError):
    """A device that does not exist or was never initialized."""


class StaticRangeError(BackendError, IndexError):
    """A static symbol's value outside its range: the routine would index arrays out of bounds."""


class RoutineFailed(BackendError, RuntimeError):
    """A routine raised while a device ran it; raised by `await_`, chained to the cause."""

    def __init__(self, message: str, routine_name: str, device: object):
        super().__init__(message)
        self.routine_name = routine_name
        self.device = device


# ---------------------------------------------------------------- work items and routines


@dataclass(frozen=True, slots=True)
class Work:
    """One execution of a routine with the static-symbol values captured when it was made."""

    name: str
    run: Callable[[], None] = field(repr=False)

    def __call__(self) -> None:
        self.run()


@dataclass(frozen=True, eq=False)
class Routine(Generic[Ctx]):
    """Code linked into a context. `schedule()` captures the bindings' current values into a
    `Work` without blocking. Calling the routine schedules, runs and awaits it: `run_now`, when
    the backend gives one, does that in one step without building a `Work` (it checks the
    static ranges just the same), which keeps a synchronous call as cheap as the C call."""

    context: Ctx
    schedule: Callable[[], Work] = field(repr=False)
    bindings: Mapping[StaticSymbol, IntRef] = field(repr=False)
    name: str
    mem_classes: Mapping[Tnode, enum.Enum] = field(default_factory=dict, repr=False)
    await_: Callable[[], None] | None = field(default=None, repr=False)
    run_now: Callable[[], None] | None = field(default=None, repr=False)
    profiler: Callable[[int], Any] | None = field(default=None, repr=False)
    scratch_plan: Any = field(default=None, repr=False)
    """Where its scratch arrays share an arena (`backends.scratch_plan.ScratchPlan`), None when
    they are one array each; the memory report counts the arena."""

    def profile(self, runs: int = 10) -> Any:
        """Run the routine's instrumented variant `runs` times in this context (with the
        effects of as many calls) and return the time of each loop nest
        (`backends.profile.ProfileReport`, printable as a table). A routine built under
        `EINJIT_PROFILE=1` is that variant already: `profile(0)` reports its calls so far."""
        if self.profiler is None:
            raise BackendError(f"einjit: routine {self.name!r} has no profiler: routines from train.to_routine "
                               f"on the C backend have one")
        return self.profiler(runs)

    @property
    def memory(self) -> MemoryReport:
        """What the routine holds: bytes kept between calls, routine-local bytes (`memory.report`)."""
        return memory.report(self)

    @property
    def kept_bytes(self) -> int:
        """Bytes of the context arrays the routine uses, kept between its calls."""
        return self.memory.kept_bytes

    @property
    def local_bytes(self) -> int:
        """Bytes of the routine's local arrays (stack and per-call heap), which live only during a call."""
        report = self.memory
        return report.local_bytes + report.scratch_bytes

    def __call__(self) -> None:
        with context_lock(self.context):
            if self.run_now is not None:
                self.run_now()
                return
            self.schedule()()
            if self.await_ is not None:
                self.await_()


_context_locks: "weakref.WeakKeyDictionary[Any, threading.RLock]" = weakref.WeakKeyDictionary()
_context_locks_guard = threading.Lock()
_unweakable_lock = threading.RLock()


def context_lock(context: Any) -> threading.RLock:
    """The lock serializing what runs in `context`: a call of a routine linked there, a step's
    write-run-read, a host read or write of a node the context holds. A routine computes in
    its context's arrays, so two calls at once from two threads would mix their cells; they
    take turns instead. Reentrant: a step holds it around the routine call, which takes it too.
    Routines of different contexts still run side by side."""
    try:
        return _context_locks[context]
    except KeyError:
        with _context_locks_guard:
            return _context_locks.setdefault(context, threading.RLock())
    except TypeError:
        return _unweakable_lock


def capture_values(bindings: Mapping[StaticSymbol, IntRef]) -> tuple[int, ...]:
    """The bindings' current values, in the routine's parameter order."""
    return tuple(int(r.value) for r in bindings.values())


def check_static_values(name: str, statics: Sequence[StaticSymbol], values: Sequence[int]) -> None:
    """Static symbols with a known range must stay in it: the code indexes arrays with them."""
    for s, v in zip(statics, values, strict=True):
        if s.static_range is not None and not 0 <= v < s.static_range:
            raise StaticRangeError(
                f"einjit: routine {name!r}: static symbol {s!r} = {v} is outside its range [0, {s.static_range}); "
                f"set its IntRef to a value in range before scheduling the routine")


def make_refs(bindings: Sequence[StaticSymbol],
              given: Mapping[StaticSymbol, IntRef] | None = None) -> dict[StaticSymbol, IntRef]:
    """One `IntRef` per static symbol, in order: the given one, or a fresh zero."""
    given = given or {}
    return {s: given.get(s) or IntRef(0) for s in bindings}


# ---------------------------------------------------------------- code


@dataclass(frozen=True, eq=False)
class Postponed:
    """Lowered code whose compilation waits for `link`, where the context is known."""

    backend: str
    lowered: Any = field(repr=False)
    bindings: tuple[StaticSymbol, ...]
    name: str


@dataclass(frozen=True, eq=False)
class Compiled(Generic[Proc]):
    """Relocatable compiled code: linkable into any context of its backend, on any device.

    `inputs` are the nodes the routine reads before writing them: a context it is linked
    into must already hold them."""

    backend: str
    procedure: Proc = field(repr=False)
    bindings: tuple[StaticSymbol, ...]
    name: str
    inputs: frozenset[Tnode] = field(repr=False)


Code = Postponed | Compiled


def low_level_of(lowered: Any) -> ll.LLStmt:
    """The low-level code of the optimizer's result (anything with `.llc`) or of bare code."""
    return getattr(lowered, "llc", lowered)


def lower_assignments(bindings: Sequence[StaticSymbol], asgns: asg.Asgns, name: str | None = None, *,
                      settings: Any = None) -> tuple[str, Any]:
    """The one lowering of assignments (the seed's `lower_assignments`): finish shape
    inference, log and dump the assignments and the unoptimized loops, optimize. Names in
    the texts and in the comments the lowering writes into the code are the program's
    (`naming.stable_names`), so they do not change with unrelated tensors built before.

    Returns the routine's name (derived from the assigned nodes when not given, reduced to a
    safe identifier by `c_names.routine_name` when given) and the optimizer's result. Static
    symbols are passed to the optimizer as fixed indices. With `EINJIT_DUMP_DIR` set,
    `<name>.cd`, `<name>.ll` and `<name>.optimized.ll` are written there.
    """
    from einjit.ir.optimize import optimize_proc
    from einjit.shape import finish_inference

    finish_inference()
    name = checked_name(name) or default_name(asgns)
    dumping = config.dumping()
    with stable_names(), ll.deep_recursion():
        if dumping or config.debug_level() >= 2:
            doc = asg.to_doc(asgns)
            config.debug(2, f"assignments of {name}:\n{doc}")
            config.dump(name, "", "cd", doc)
        llc = asg.to_low_level(asgns)
        if dumping:
            config.dump(name, "", "ll", ll.to_doc(llc))
        optimized = optimize_proc(llc, name=name, static_indices=frozenset(bindings), settings=settings)
        if dumping:
            config.dump(name, "optimized", "ll", ll.to_doc(optimized.llc))
    return name, optimized


def default_name(code: Any) -> str:
    """A C identifier naming a routine after (up to two of) the nodes it assigns."""
    if isinstance(code, asg.Asgns):
        written = [tn for a in asg.flatten_with_comments(code) for tn in asg.lhs_nodes(a)]
    else:
        written = [tn for s in ll.iter_stmts(low_level_of(code))
                   if isinstance(s, (ll.Set, ll.SetFromVec, ll.ZeroOut)) for tn in [s.tn]]
    names = list(dict.fromkeys(node_base(tn.label) for tn in written))[:2]
    return "_".join(["run", *names]) if names else "routine"


def checked_name(name: str | None) -> str | None:
    """A routine name given by the user, as einjit uses it (`c_names.routine_name`)."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise BackendUsageError(f"einjit: a routine name must be a string, got {type(name).__name__} {name!r}")
    return routine_name(name) if name else None


def prepare(bindings: Sequence[StaticSymbol], code: Any, name: str | None) -> tuple[str, Any]:
    """Assignments are lowered and optimized; low-level or already optimized code is kept."""
    if isinstance(code, asg.Asgns):
        return lower_assignments(bindings, code, name)
    if isinstance(code, ll.LLStmt) or hasattr(code, "llc"):
        return checked_name(name) or default_name(code), code
    raise TypeError(f"einjit: cannot compile {type(code).__name__}: expected assignments, low-level code "
                    f"or the optimizer's result")


def routine_inputs(lowered: Any) -> frozenset[Tnode]:
    """Nodes the code reads before it writes them: a context must hold them before linking.

    The optimizer's trace knows this cell by cell (`read_only` / `read_before_write`); for
    bare low-level code a node counts as an input when some read of it comes before any write
    in program order: an initialized accumulator or a temporary is not an input, an update
    that reads its own cells first (`w -= lr * g`) is. Merge buffers are not counted: they
    are refilled by `device_to_device` before each use.
    """
    return frozenset(tn for tn in read_first(lowered) if not tn.is_local() and not tn.is_virtual())


def read_first(lowered: Any) -> frozenset[Tnode]:
    """Every node the code reads before writing it (`routine_inputs` without the filter)."""
    store = getattr(lowered, "traced_store", None)
    if store is not None:
        return frozenset(tn for tn, ta in store.items() if ta.read_only and ta.accesses or ta.read_before_write)
    llc = low_level_of(lowered)
    written: set[Tnode] = set()
    inputs: dict[Tnode, None] = {}

    def reads(sc: ll.LLScalar) -> None:
        for x in ll.iter_scalars(sc):
            match x:
                case ll.Get(tn, _) if tn not in written:
                    inputs.setdefault(tn)
                case ll.LocalScope(body=body):
                    stmts(body)

    def stmts(stmt: ll.LLStmt) -> None:
        for s in ll.flatten(stmt):
            match s:
                case ll.ForLoop(body=body):
                    stmts(body)
                case ll.Set(tn=tn, llsc=sc) | ll.SetFromVec(tn=tn, arg=sc):
                    reads(sc)
                    written.add(tn)
                case ll.SetLocal(value=sc):
                    reads(sc)
                case ll.ZeroOut(tn):
                    written.add(tn)

    stmts(llc)
    return frozenset(inputs)


# ---------------------------------------------------------------- contexts of the process


class HostTransfers:
    """Contexts know their backend, so code that changes a host array (writing data into a
    tensor) can refresh every context holding the node without knowing the backends."""

    backend: Any

    def from_host(self, tn: Tnode) -> None:
        self.backend.from_host(self, tn)

    def to_host(self, tn: Tnode) -> None:
        self.backend.to_host(self, tn)


_contexts: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_context_order = itertools.count()


def register_context(context: Any, backend: Any) -> Any:
    """Attach `context` to `backend` and remember it (weakly) for `contexts_holding`."""
    context.backend = backend
    _contexts[next(_context_order)] = context
    return context


def forget_context(context: Any) -> None:
    """Drop a context from the registry: one wrapped by another backend's context is reached
    through the wrapper, whose transfers are ordered with its device's work."""
    for key, c in list(_contexts.items()):
        if c is context:
            del _contexts[key]


def contexts_holding(tn: Tnode) -> list[Any]:
    """The live contexts that have an array for `tn`, oldest first; each has `from_host(tn)`
    and `to_host(tn)`."""
    return [c for _, c in sorted(_contexts.items(), key=lambda kv: kv[0]) if c.holds(tn)]


_defaults: dict[int, tuple[Any, Any]] = {}


def default_context(backend: Any) -> Any:
    """The process's context of `backend` for routines linked without one: on a device
    backend, a context on device 0; on the C backend, one that computes in the host arrays of
    hosted nodes, so host writes and reads need no transfer."""
    entry = _defaults.get(id(backend))
    if entry is None or entry[0] is not backend:
        if hasattr(backend, "get_device"):
            context = backend.init(backend.get_device(0))
        elif getattr(backend, "shares_host_arrays", False):
            context = backend.init("default", share_host_arrays=True)
        else:
            context = backend.init("default")
        entry = _defaults[id(backend)] = (backend, context)
    return entry[1]


def load_inputs(context: Any, inputs: frozenset[Tnode]) -> None:
    """Give the context the inputs it lacks: hosted ones with host values (parameters) are
    copied from the host (a context sharing the host arrays holds them already); state that
    was never given values, on the host or by a routine (optimizer momentum, hosted or not),
    starts at zero, the seed's initial value of device arrays and what a context sharing the
    host arrays reads from the zeroed host array it allocates."""
    for tn in sorted(inputs, key=lambda tn: tn.id):
        if context.holds(tn):
            continue
        if tn.is_hosted() and tn.array is not None:
            context.from_host(tn)
        else:
            config.debug(1, f"{tn.debug_name()}: state read before written, starts at zero in {context.label!r}")
            context.backend.allocate_zeroed(context, tn)


# ---------------------------------------------------------------- backend interfaces


@runtime_checkable
class Context(Protocol):
    """What every backend's context exposes: a label for messages and its backend's name."""

    label: str
    backend_name: str

    def holds(self, tn: Tnode) -> bool:
        """Whether the context has an array for `tn` (transferred in or computed there)."""


class _Common(Protocol):
    name: str

    def compile(self, bindings: Sequence[StaticSymbol], code: Any, *, shared: bool = False,
                name: str | None = None) -> Code: ...

    def compile_batch(self, bindings: Sequence[StaticSymbol], codes: Sequence[Any], *, shared: bool = False,
                      names: Sequence[str] | None = None) -> list[Code]: ...

    def link(self, context: Any, code: Code, static_values: Mapping[StaticSymbol, IntRef] | None = None) -> Routine: ...

    def link_batch(self, context: Any, codes: Sequence[Code],
                   static_values: Mapping[StaticSymbol, IntRef] | None = None) -> list[Routine]: ...

    def from_host(self, context: Any, tn: Tnode) -> None: ...

    def to_host(self, context: Any, tn: Tnode) -> None: ...


class NoDeviceBackend(_Common, Protocol):
    """Compiles and runs code in contexts of its own; running a work blocks until it is done."""

    def init(self, label: str) -> Any: ...

    def device_to_device(self, tn: Tnode, dst_context: Any, src_context: Any, into_merge_buffer: bool = True) -> None:
        """Copy `tn`'s array from one context into the other's merge buffer (or its own array)."""


class Backend(_Common, Protocol):
    """A backend with devices: running a work only launches it; `await_` waits for a device."""

    def init(self, device: Any) -> Any: ...

    def await_(self, device: Any) -> None: ...

    def get_device(self, ordinal: int) -> Any: ...

    def num_devices(self) -> int: ...

    def device_to_device(self, tn: Tnode, dst_context: Any, src_context: Any, into_merge_buffer: bool = True) -> None:
        """Schedule a copy of `tn` from `src_context` into `dst_context`'s merge buffer (or its
        own array), ordered after the work already scheduled on both devices."""


class SimpleBackend(Protocol[Ctx, Proc]):
    """What `SimpleNoDeviceBackend` needs: compile low-level code, link a procedure, move data.

    `compile_batch(..., context=ctx)` is the non-shared case: the result only has to work in
    `ctx`, so the backend may specialize the code to that context's arrays.
    """

    name: str

    def init(self, label: str) -> Ctx: ...

    def owns(self, context: Any) -> bool: ...

    def compile_batch(self, routines: Sequence[tuple[str, Any]], bindings: Sequence[StaticSymbol], *,
                      context: Ctx | None = None) -> list[Proc]: ...

    def link_compiled(self, context: Ctx, procedure: Proc, inputs: frozenset[Tnode],
                      static_values: Mapping[StaticSymbol, IntRef] | None = None) -> Routine[Ctx]: ...

    def from_host(self, context: Ctx, tn: Tnode) -> None: ...

    def to_host(self, context: Ctx, tn: Tnode) -> None: ...

    def allocate_zeroed(self, context: Ctx, tn: Tnode) -> None: ...

    def device_to_device(self, tn: Tnode, dst_context: Ctx, src_context: Ctx,
                         into_merge_buffer: bool = True) -> None: ...


class SimpleNoDeviceBackend(Generic[Ctx, Proc]):
    """The seed's `Simple_no_device_backend` functor: `Postponed` and `Compiled` code over a
    `SimpleBackend`."""

    def __init__(self, simple: SimpleBackend[Ctx, Proc]):
        self.simple = simple
        self.name = simple.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def init(self, label: str, **options: Any) -> Ctx:
        return register_context(self.simple.init(label, **options), self)

    def compile(self, bindings: Sequence[StaticSymbol], code: Any, *, shared: bool = False,
                name: str | None = None) -> Code:
        return self.compile_batch(bindings, [code], shared=shared, names=None if name is None else [name])[0]

    def compile_batch(self, bindings: Sequence[StaticSymbol], codes: Sequence[Any], *, shared: bool = False,
                      names: Sequence[str] | None = None) -> list[Code]:
        """Several routines sharing the static bindings; with `shared=True`, one compilation."""
        bindings = tuple(bindings)
        if names is not None and len(names) != len(codes):
            raise BackendUsageError(f"einjit: {len(codes)} routines to compile but {len(names)} names")
        with stable_names():
            prepared = [prepare(bindings, c, None if names is None else names[k]) for k, c in enumerate(codes)]
            _check_distinct(n for n, _ in prepared)
            localize([(n, lowered, read_first(lowered)) for n, lowered in prepared])
            if not shared:
                return [Postponed(self.name, lowered, bindings, n) for n, lowered in prepared]
            procs = self.simple.compile_batch(prepared, bindings)
        return [Compiled(self.name, p, bindings, n, routine_inputs(lowered))
                for p, (n, lowered) in zip(procs, prepared, strict=True)]

    def link(self, context: Ctx, code: Code,
             static_values: Mapping[StaticSymbol, IntRef] | None = None) -> Routine[Ctx]:
        return self.link_batch(context, [code], static_values)[0]

    def link_batch(self, context: Ctx, codes: Sequence[Code],
                   static_values: Mapping[StaticSymbol, IntRef] | None = None) -> list[Routine[Ctx]]:
        """Postponed code with equal bindings is compiled for `context` in one compilation."""
        self.check_context(context)
        for code in codes:
            check_code(self.name, code, context)
        compiled: dict[int, tuple[Proc, frozenset[Tnode]]] = {}
        groups: dict[tuple[StaticSymbol, ...], list[int]] = {}
        postponed: dict[int, Postponed] = {}
        for k, code in enumerate(codes):
            if isinstance(code, Postponed):
                groups.setdefault(code.bindings, []).append(k)
                postponed[k] = code
        for bindings, members in groups.items():
            batch = [(postponed[k].name, postponed[k].lowered) for k in members]
            _check_distinct(n for n, _ in batch)
            procs = self.simple.compile_batch(batch, bindings, context=context)
            for k, p in zip(members, procs, strict=True):
                compiled[k] = (p, routine_inputs(postponed[k].lowered))
        out = []
        for k, code in enumerate(codes):
            if k in compiled:
                proc, inputs = compiled[k]
            else:
                assert isinstance(code, Compiled)  # every Postponed code was compiled above
                proc, inputs = code.procedure, code.inputs
            out.append(self.simple.link_compiled(context, proc, inputs, static_values))
        return out

    def check_context(self, context: Any) -> None:
        if not self.simple.owns(context):
            raise WrongBackendError(f"einjit: {_describe_context(context)} is not a context of backend {self.name!r}")

    def from_host(self, context: Ctx, tn: Tnode) -> None:
        self.check_context(context)
        self.simple.from_host(context, tn)

    def to_host(self, context: Ctx, tn: Tnode) -> None:
        self.check_context(context)
        self.simple.to_host(context, tn)

    def allocate_zeroed(self, context: Ctx, tn: Tnode) -> None:
        """Give `context` a zeroed array for `tn` if it holds none: the seed's initial value of
        state a routine keeps across calls (optimizer momentum), asked for explicitly."""
        self.check_context(context)
        self.simple.allocate_zeroed(context, tn)

    def device_to_device(self, tn: Tnode, dst_context: Ctx, src_context: Ctx, into_merge_buffer: bool = True) -> None:
        self.check_context(dst_context)
        self.check_context(src_context)
        self.simple.device_to_device(tn, dst_context, src_context, into_merge_buffer)


def check_code(backend_name: str, code: Any, context: Any, accepted: Iterable[str] = ()) -> None:
    """Code links only into contexts of the backend that produced it (or of `accepted` ones)."""
    if not isinstance(code, (Postponed, Compiled)):
        raise WrongBackendError(f"einjit: link expects code from a backend's compile, got {type(code).__name__}")
    if code.backend != backend_name and code.backend not in tuple(accepted):
        raise WrongBackendError(
            f"einjit: routine {code.name!r} was compiled by backend {code.backend!r} and cannot be linked into "
            f"{_describe_context(context)} of backend {backend_name!r}; compile it with that backend")


def missing_input_error(routine: str, tn: Tnode, context: Any, hosted_hint: bool) -> NodeNotInContextError:
    how = ("transfer it with from_host" if hosted_hint and tn.is_hosted()
           else "copy it in with device_to_device(..., into_merge_buffer=False), or link and run a routine "
                "that computes it in this context first")
    return NodeNotInContextError(
        f"einjit: routine {routine!r} reads {tn.debug_name()} before writing it, but {_describe_context(context)} "
        f"does not hold it; {how}")


class NotHostedError(BackendError, LookupError):
    """A host transfer of a node that has no host array by its memory mode."""


def check_hosted(what: str, tn: Tnode, context: Any) -> None:
    """Host transfers only move nodes that have a host array by their memory mode; and
    `from_host` only copies a host array that exists: anything else would invent values."""
    if not tn.can_be_hosted():
        raise NotHostedError(
            f"einjit: {what} of {tn.debug_name()} in {_describe_context(context)}: the node is not hosted (memory mode "
            f"{tn.memory_mode}, {describe_provenance(tn.provenance)}), so it has no host array; make it hosted before "
            f"compiling (tensor.hosted(), or train.forward(tensor) for a value you read)")
    if what == "from_host" and tn.array is None:
        raise NotHostedError(
            f"einjit: from_host of {tn.debug_name()} into {_describe_context(context)}: the node has no host array yet "
            f"(nothing was written to it on the host); give it values first (init_params, or write its host array), "
            f"or let a routine compute it in this context")


def describe_provenance(code: int) -> str:
    from einjit.ir.provenance import describe
    return describe(code)


def not_held_error(what: str, tn: Tnode, context: Any) -> NodeNotInContextError:
    return NodeNotInContextError(
        f"einjit: {what}: {_describe_context(context)} does not hold {tn.debug_name()} (it was never transferred "
        f"there with from_host or device_to_device, nor computed there by a linked routine)")


def _describe_context(context: Any) -> str:
    label = getattr(context, "label", None)
    backend = getattr(context, "backend_name", None)
    if label is None:
        return f"object {context!r}"
    return f"context {label!r}" + (f" (backend {backend!r})" if backend else "")


def _check_distinct(names: Iterable[str]) -> None:
    dup = repeated_names(names)
    if dup:
        raise BackendUsageError(f"einjit: routine name {dup[0]!r} repeated in one batch; "
                                "give each routine its own name")
