"""`CcBackend`: the gcc backend of `cc.py` as a no-device backend (seed 001).

Shared code is `cc.compile_batch`'s relocatable procedure: array pointers are arguments,
prepared once per link and converted by ctypes at every call. Non-shared code is compiled at
link time for one context, and uses that knowledge: the routine's entry point takes only the
static symbols and calls the relocatable body with the context's array addresses as
constants, which halves the cost of a call for a routine with a dozen arrays (measured: about
0.7 us instead of 1.5 us per work item for a small training step). The body is deliberately
not inlined into the entry: gcc does not vectorize accesses at constant addresses ("base addr
of dr is a constant"). The price is the seed's trade-off: one compilation per context instead
of one for all.

Contexts hold private copies of hosted nodes (unless made with `share_host_arrays=True`), so
several contexts — several devices of the multicore backend — compute concurrently without
racing on host arrays; `from_host` / `to_host` move the data. Constant hosted nodes that a
routine only reads are the exception (`CONSTANT_FROM_HOST`): they are read from the host.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from einjit import memory
from einjit.backends import scratch_plan
from einjit.backends.c_syntax import CSyntax, MemClass, Param, ParamKind, render_routine
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.timer import CcTimer
from einjit.backends.interface import (
    BackendUsageError,
    Compiled,
    CpuMemClass,
    HostTransfers,
    NodeNotInContextError,
    Routine,
    SimpleNoDeviceBackend,
    Work,
    capture_values,
    check_hosted,
    check_static_values,
    load_inputs,
    low_level_of,
    make_refs,
    missing_input_error,
    not_held_error,
    routine_inputs,
)
from einjit.ir import low_level as ll
from einjit.ir import naming
from einjit.ir.c_names import c_name
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.passes.local_storage import is_routine_local, local_to
from einjit.ir.sched import search
from einjit.ir.tnode import Tnode, host_arrays_replaced

_BODY_SUFFIX = "_body"


@dataclass(eq=False)
class CcContext(HostTransfers):
    """The arrays one CPU context computes with, keyed by node, and its merge buffers.

    Arrays are private to the context, hosted nodes included, so several contexts compute
    concurrently; `from_host` / `to_host` move the data. A context that shares the host
    arrays (the default context of `train`) computes in a hosted node's host array itself:
    held from the start, host transfers are no-ops, host writes are seen by the next call.
    Other nodes get a zeroed array when a routine that writes them is linked.
    """

    label: str
    backend_name: str
    share_host_arrays: bool = False
    arrays: dict[Tnode, np.ndarray] = field(default_factory=dict, repr=False)
    merge_buffers: dict[Tnode, np.ndarray] = field(default_factory=dict, repr=False)
    scratch: dict[Tnode, np.ndarray] = field(default_factory=dict, repr=False)
    arenas: dict[str, list[np.ndarray]] = field(default_factory=dict, repr=False)
    backend: Any = field(default=None, repr=False)

    def holds(self, tn: Tnode) -> bool:
        return tn in self.arrays or (self.share_host_arrays and tn.is_hosted())

    def array(self, tn: Tnode) -> np.ndarray:
        """The context's array for `tn` (made on first use: the host array itself when shared,
        a copy of it for a hosted node, zeros otherwise)."""
        arr = self.arrays.get(tn)
        if arr is None:
            if is_routine_local(tn):
                raise NodeNotInContextError(
                    f"einjit: context {self.label!r} has no array for {tn.debug_name()}: routine {local_to(tn)!r} "
                    f"made it routine-local, its values live only during a call of that routine; call "
                    f".materialize() or .hosted() on the tensor before compiling the routine to keep them")
            if tn.is_hosted() and (self.share_host_arrays or tn.is_constant()):
                arr = _checked(tn, tn.host_array())
            else:
                arr = memory.aligned_zeros(tn.dims, tn.prec.dtype)
                if tn.is_hosted():
                    arr[...] = _checked(tn, tn.host_array())
            self.arrays[tn] = arr
        return arr

    def scratch_array(self, routine: str, tn: Tnode) -> np.ndarray:
        """The scratch array of a routine-local node too large for the stack, allocated once
        per context and node (linked routines hold its address). Every routine using it
        writes it before reading it within a call, and routines of a context run one after
        the other, so they can share it; a relinked routine reuses it instead of growing the
        context. Values of one call are still there at the next, as in a context array."""
        buf = self.scratch.get(tn)
        if buf is None:
            buf = memory.zeros(f"scratch array of {tn.debug_name()} (routine {routine!r})", tn.dims, tn.prec.dtype)
            self.scratch[tn] = buf
        return buf

    def planned_scratch(self, routine: str, plan: scratch_plan.ScratchPlan, nodes: Sequence[Tnode]
                        ) -> list[np.ndarray]:
        """The scratch arrays of `routine`'s nodes as views of an arena at the planned offsets
        (`scratch_plan`). Arenas are allocated once per context and routine name: a relinked
        routine, or its profiled variant, reuses one that is large enough (every routine writes
        its scratch before reading it within a call, and routines of a context run one at a
        time); a larger plan gets another, and the context keeps both, since the routines linked
        before still use the first (the C code holds its address)."""
        arenas = self.arenas.setdefault(routine, [])
        arena = next((a for a in arenas if a.nbytes >= plan.size), None)
        if arena is None:
            named = ", ".join(f"{tn.debug_name()} {tuple(tn.dims)}" for tn in nodes[:3])
            more = f" and {len(nodes) - 3} more" if len(nodes) > 3 else ""
            raw = memory.zeros(f"scratch arena of routine {routine!r} (for {named}{more})",
                               (plan.size + scratch_plan.ALIGN,), np.dtype(np.uint8))
            base = -raw.ctypes.data % scratch_plan.ALIGN
            arena = raw[base:base + plan.size]
            arenas.append(arena)
        return [arena[o:o + n].view(tn.prec.dtype).reshape(tn.dims)
                for tn, o, n in zip(nodes, plan.offsets, plan.nbytes, strict=True)]

    def merge_buffer(self, tn: Tnode) -> np.ndarray:
        """The buffer that receives another context's copy of `tn` (zeroed until filled)."""
        buf = self.merge_buffers.get(tn)
        if buf is None:
            buf = self.merge_buffers[tn] = np.zeros(tn.dims, dtype=tn.prec.dtype)
        return buf


def _checked(tn: Tnode, arr: np.ndarray) -> np.ndarray:
    if arr.dtype != tn.prec.dtype or tuple(arr.shape) != tuple(tn.dims) or not arr.flags.c_contiguous \
            or not arr.flags.writeable:
        raise BackendUsageError(
            f"einjit: host array of {tn.debug_name()} must be a writeable C-contiguous {tn.prec.dtype} array "
            f"of shape {tn.dims}, got {arr.dtype} {arr.shape} (contiguous={arr.flags.c_contiguous})")
    return arr


@dataclass(frozen=True, eq=False)
class CcProcedure:
    """A compiled routine. `context` is None for relocatable code; otherwise the code only
    works in that context and `entry` takes just the static symbols."""

    name: str
    procedure: cc.Procedure = field(repr=False)
    mem_classes: Mapping[Tnode, CpuMemClass] = field(repr=False)
    context: CcContext | None = None
    entry: Callable | None = field(default=None, repr=False)
    scratch: tuple[np.ndarray, ...] | None = field(default=None, repr=False)
    plan: scratch_plan.ScratchPlan | None = field(default=None, repr=False)
    """Where the scratch arrays go in an arena (`scratch_plan`); None: one array each. For
    context-specialized code, the plan its `scratch` arrays were made by."""


def _mem_classes(proc: cc.Procedure, llc: ll.LLStmt) -> dict[Tnode, CpuMemClass]:
    classes: dict[Tnode, CpuMemClass] = {tn: MemClass.LOCAL_ONLY for tn in ll.nodes_of(llc) if tn.is_local()}
    for p in proc.params:
        if p.kind is ParamKind.ARRAY:
            assert p.mem is not None  # the renderer classifies every array parameter
            classes[p.node] = p.mem
    return classes


class CcSimpleBackend:
    """The `SimpleBackend` over `cc.py`."""

    def __init__(self, options: cc.CcOptions | None = None, name: str = "cc"):
        self.options = options or cc.CcOptions()
        self.name = name

    def init(self, label: str, *, share_host_arrays: bool = False) -> CcContext:
        return CcContext(label, self.name, share_host_arrays)

    def owns(self, context: Any) -> bool:
        return isinstance(context, CcContext) and context.backend_name == self.name

    # -- compiling

    def compile_batch(self, routines: Sequence[tuple[str, Any]], bindings: Sequence[StaticSymbol], *,
                      context: CcContext | None = None) -> list[CcProcedure]:
        if context is not None:
            return self._compile_specialized(routines, tuple(bindings), context)
        syntax = self.options.effective_syntax()
        placed = [scratch_plan.place(low_level_of(c), syntax) for _, c in routines]
        codes = [(n, llc) for (n, _), (llc, _) in zip(routines, placed, strict=True)]
        procs = cc.compile_batch(codes, bindings=tuple(bindings), options=self.options)
        return [CcProcedure(p.name, p, _mem_classes(p, llc), plan=_checked_plan(p.params, plan))
                for p, (llc, plan) in zip(procs, placed, strict=True)]

    def _compile_specialized(self, routines: Sequence[tuple[str, Any]], bindings: tuple[StaticSymbol, ...],
                             context: CcContext) -> list[CcProcedure]:
        """Each routine `NAME` becomes a body `NAME_body` taking the arrays, and an entry
        `NAME(statics)` calling it with this context's array addresses."""
        with naming.stable_names():
            return self._compile_specialized_named(routines, bindings, context)

    def _compile_specialized_named(self, routines: Sequence[tuple[str, Any]], bindings: tuple[StaticSymbol, ...],
                                   context: CcContext) -> list[CcProcedure]:
        syntax = self.options.syntax
        options_syntax = self.options.effective_syntax()
        glue: list[str] = []
        bodies: list[tuple[str, ll.LLStmt]] = []
        scratches: list[tuple[np.ndarray, ...]] = []
        plans: list[scratch_plan.ScratchPlan | None] = []
        for name, code in routines:
            llc, plan = scratch_plan.place(low_level_of(code), options_syntax)
            body = c_name(name) + _BODY_SUFFIX
            rendered = render_routine(body, llc, bindings, syntax)
            plan = _checked_plan(rendered.params, plan) if scratch_plan.enabled() else None
            arrays = self._arrays(context, rendered.params, routine_inputs(code), name, plan=plan)
            plans.append(plan)
            scratch = tuple(a for p, a in zip(_computed(rendered.params), arrays, strict=True)
                            if p.kind is ParamKind.SCRATCH)
            glue.append(_entry_source(c_name(name), rendered.code.split("\n", 1)[0], rendered.params, arrays, syntax))
            bodies.append((body, llc))
            scratches.append(scratch)
        prelude = syntax.prelude + "\n".join(["/* Entry points specialized to one context's arrays. */", *glue])
        options = dataclasses.replace(self.options, syntax=dataclasses.replace(syntax, prelude=prelude))
        procs = cc.compile_batch(bodies, bindings=bindings, options=options)
        lib = cc.library(procs[0].so_path) if procs else None
        out = []
        for (name, _), proc, (_, llc), scratch, plan in zip(routines, procs, bodies, scratches, plans, strict=True):
            assert lib is not None  # loaded since there are procedures
            entry = lib[c_name(name)]
            entry.restype = None
            out.append(CcProcedure(name, proc, _mem_classes(proc, llc), context, entry, scratch, plan))
        return out

    # -- linking

    def _arrays(self, context: CcContext, params: Sequence[Param], inputs: frozenset[Tnode],
                routine: str, scratch: tuple[np.ndarray, ...] | None = None,
                plan: scratch_plan.ScratchPlan | None = None) -> list[np.ndarray]:
        """The arrays for the array, merge-buffer and scratch parameters (the given scratch
        arrays in order, or new ones: views of the context's arena for the routine when there
        is a plan and `scratch_plan.enabled()`, else one array each); inputs must be held
        already."""
        arrays = []
        if scratch is None and plan is not None and scratch_plan.enabled():
            scratch = tuple(context.planned_scratch(routine, plan, [p.node for p in params
                                                                    if p.kind is ParamKind.SCRATCH]))
        given = iter(scratch or ())
        for p in params:
            match p.kind:
                case ParamKind.ARRAY:
                    if p.tn in inputs and p.mem is not MemClass.CONSTANT_FROM_HOST and not context.holds(p.tn):
                        raise missing_input_error(routine, p.tn, context, hosted_hint=True)
                    arrays.append(context.array(p.node))
                case ParamKind.MERGE_BUFFER:
                    arrays.append(context.merge_buffer(p.node))
                case ParamKind.SCRATCH:
                    arrays.append(next(given) if scratch is not None else context.scratch_array(routine, p.node))
        return arrays

    def link_compiled(self, context: CcContext, procedure: CcProcedure, inputs: frozenset[Tnode],
                      static_values: Mapping[StaticSymbol, IntRef] | None = None) -> Routine[CcContext]:
        name = procedure.name
        if procedure.context is not None and procedure.context is not context:
            raise NodeNotInContextError(
                f"einjit: routine {name!r} was compiled for context {procedure.context.label!r} (not shared) and "
                f"uses its arrays; it cannot run in context {context.label!r} — compile with shared=True")
        arrays = self._arrays(context, procedure.procedure.params, inputs, name, procedure.scratch, procedure.plan)
        planned = procedure.plan if procedure.scratch is not None or scratch_plan.enabled() else None
        statics = procedure.procedure.bindings
        refs = make_refs(statics, static_values)
        pointers: tuple[ctypes.c_void_p, ...]
        if procedure.entry is not None:
            fn, pointers = procedure.entry, ()
        else:
            fn, pointers = procedure.procedure.function, tuple(ctypes.c_void_p(a.ctypes.data) for a in arrays)

        in_host = tuple((p.node, a) for p, a in zip(_computed(procedure.procedure.params), arrays, strict=True)
                        if a is p.node.array)
        guard = _host_array_guard(name, in_host)

        def schedule() -> Work:
            guard()
            values = capture_values(refs)
            check_static_values(name, statics, values)
            return Work(name, functools.partial(fn, *pointers, *values))

        run_now = _run_now(name, fn, pointers, refs)
        if in_host:
            unguarded = run_now

            def run_now() -> None:
                guard()
                unguarded()

        return Routine(context, schedule, refs, name, procedure.mem_classes, run_now=run_now, scratch_plan=planned)

    # -- moving data

    def from_host(self, context: CcContext, tn: Tnode) -> None:
        check_hosted("from_host", tn, context)
        arr, host = context.array(tn), tn.host_array()
        if arr is not host:
            arr[...] = host

    def to_host(self, context: CcContext, tn: Tnode) -> None:
        check_hosted("to_host", tn, context)
        if not context.holds(tn):
            raise not_held_error("to_host", tn, context)
        arr, host = context.array(tn), tn.host_array()
        if arr is not host:
            host[...] = arr

    def allocate_zeroed(self, context: CcContext, tn: Tnode) -> None:
        if not context.holds(tn):
            context.arrays[tn] = memory.aligned_zeros(tn.dims, tn.prec.dtype)

    def device_to_device(self, tn: Tnode, dst_context: CcContext, src_context: CcContext,
                         into_merge_buffer: bool = True) -> None:
        if not src_context.holds(tn):
            raise not_held_error(f"device_to_device into {dst_context.label!r}", tn, src_context)
        dst = dst_context.merge_buffer(tn) if into_merge_buffer else dst_context.array(tn)
        dst[...] = src_context.array(tn)


def _checked_plan(params: Sequence[Param], plan: scratch_plan.ScratchPlan | None) -> scratch_plan.ScratchPlan | None:
    """`plan` when it places exactly the rendered routine's scratch parameters, in order."""
    scratch = [p.node for p in params if p.kind is ParamKind.SCRATCH]
    if plan is None or not scratch:
        return None
    # scratch_plan.scratch_nodes follows the renderer's placement
    assert tuple(int(tn.size) * int(tn.prec.itemsize) for tn in scratch) == plan.nbytes, (scratch, plan)
    return plan


def _computed(params: Sequence[Param]) -> list[Param]:
    """The parameters that are arrays (context, merge-buffer and scratch), in order."""
    return [p for p in params if p.kind is not ParamKind.STATIC]


def _host_array_guard(name: str, in_host: tuple[tuple[Tnode, np.ndarray], ...]) -> Callable[[], None]:
    """A check, run before each call, that no host array the routine computes in was replaced
    since linking: the C code holds the old array's address and would read stale values."""
    seen = [host_arrays_replaced()]

    def guard() -> None:
        now = host_arrays_replaced()
        if now == seen[0]:
            return
        for tn, arr in in_host:
            if tn.array is not arr:
                raise BackendUsageError(
                    f"einjit: the host array of {tn.debug_name()} was replaced after routine {name!r} was linked to "
                    f"it; the routine would still use the old array. Write new values in place instead "
                    f"(t.set_values(...) or t.value[...] = ...), or compile the routine again")
        seen[0] = now

    return guard


def _run_now(name: str, fn: Callable, pointers: tuple, refs: Mapping[StaticSymbol, IntRef]) -> Callable[[], None]:
    """A synchronous call without a `Work`: a bare partial when there are no static symbols;
    otherwise the range checks inline, as cheap as the C call allows."""
    if not refs:
        return functools.partial(fn, *pointers)
    statics, cells = tuple(refs), tuple(refs.values())
    ranged = tuple((c, s.static_range) for s, c in refs.items() if s.static_range is not None)

    def run_now() -> None:
        for c, n in ranged:
            if not 0 <= c.value < n:
                check_static_values(name, statics, [c.value for c in cells])
        fn(*pointers, *[c.value for c in cells])

    return run_now


def _entry_source(name: str, body_head: str, params: Sequence[Param], arrays: Sequence[np.ndarray],
                  syntax: CSyntax) -> str:
    """`void NAME(int s) { NAME_body((float *)0x...ULL, ..., s); }` plus the body's prototype."""
    prototype = body_head.removesuffix(" {") + ";"
    args = [f"({syntax.type_name(p.node.prec)} *){a.ctypes.data:#x}ULL"
            for p, a in zip(_computed(params), arrays, strict=True)]
    statics = [p.c_name for p in params if p.kind is ParamKind.STATIC]
    decl = ", ".join(f"int {s}" for s in statics) or "void"
    return f"{prototype}\nvoid {name}({decl}) {{\n  {name}{_BODY_SUFFIX}({', '.join(args + statics)});\n}}\n"


class CcBackend(SimpleNoDeviceBackend[CcContext, CcProcedure]):
    """gcc through `cc.py`, as a no-device backend with `Postponed` / `Compiled` code."""

    def __init__(self, options: cc.CcOptions | None = None, name: str = "cc"):
        super().__init__(CcSimpleBackend(options, name))

    shares_host_arrays = True
    """`init(label, share_host_arrays=True)` makes a context computing in the host arrays."""


def run_once(code: Any, arrays: Mapping[Tnode, Any] | None = None, *, bindings: Sequence[StaticSymbol] = (),
             values: Mapping[StaticSymbol, int] | None = None, options: cc.CcOptions | None = None,
             name: str = "routine", context: CcContext | None = None) -> CcContext:
    """Compile `code` (assignments or low-level code) with the C backend, link it into
    `context` (by default a fresh one computing in the host arrays) after copying `arrays`
    into it, run it once with the static `values`, and return the context, whose `array(tn)`
    holds the results. Other nodes the code reads before writing start at zero (hosted ones
    at their host values, zero when they have none).

    For tests and experiments: differential tests compare these arrays with the interpreter's.
    """
    backend = CcBackend(options)
    context = context if context is not None else backend.init(name, share_host_arrays=True)
    for tn, value in (arrays or {}).items():
        context.array(tn)[...] = value
    refs = {s: IntRef((values or {}).get(s, 0)) for s in bindings}
    compiled = backend.compile(tuple(bindings), code, shared=True, name=name)
    assert isinstance(compiled, Compiled)  # compiled now, being shared
    load_inputs(context, compiled.inputs)
    for tn in compiled.inputs:
        context.array(tn)
    backend.link(context, compiled, refs)()
    return context


search.set_timer(CcTimer())  # the tile search (`EINJIT_SEARCH=1`) measures with gcc
