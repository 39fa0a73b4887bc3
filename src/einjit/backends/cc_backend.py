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

Contexts hold private copies of hosted nodes (`CpuContext(share_host_arrays=False)`), so
several contexts — several devices of the multicore backend — compute concurrently without
racing on host arrays; `from_host` / `to_host` move the data. Constant hosted nodes that a
routine only reads are the exception (`CONSTANT_FROM_HOST`): they are read from the host.
"""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from einjit.backends import cc
from einjit.backends.c_names import c_name
from einjit.backends.c_syntax import CSyntax, MemClass, Param, ParamKind, render_routine
from einjit.backends.interface import (CpuMemClass, NodeNotInContextError, Routine, SimpleNoDeviceBackend, Work,
                                       capture_values, check_static_values, low_level_of, make_refs,
                                       missing_input_error, not_held_error, routine_inputs)
from einjit.ir import low_level as ll
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.tnode import Tnode

_BODY_SUFFIX = "_body"


@dataclass(eq=False)
class CcContext:
    """One CPU context: the arrays of `cpu`, private to it (hosted nodes included)."""

    label: str
    backend_name: str
    cpu: cc.CpuContext = field(repr=False)

    def holds(self, tn: Tnode) -> bool:
        return tn in self.cpu.arrays


@dataclass(frozen=True, eq=False)
class CcProcedure:
    """A compiled routine. `context` is None for relocatable code; otherwise the code only
    works in that context and `entry` takes just the static symbols."""

    name: str
    procedure: cc.Procedure = field(repr=False)
    mem_classes: Mapping[Tnode, CpuMemClass] = field(repr=False)
    context: CcContext | None = None
    entry: Callable | None = field(default=None, repr=False)


def _mem_classes(proc: cc.Procedure, llc: ll.LLStmt) -> dict[Tnode, CpuMemClass]:
    classes: dict[Tnode, CpuMemClass] = {tn: MemClass.LOCAL_ONLY for tn in ll.nodes_of(llc) if tn.is_local()}
    classes.update({p.tn: p.mem for p in proc.params if p.kind is ParamKind.ARRAY})
    return classes


class CcSimpleBackend:
    """The `SimpleBackend` over `cc.py`."""

    def __init__(self, options: cc.CcOptions | None = None, name: str = "cc"):
        self.options = options or cc.CcOptions()
        self.name = name

    def init(self, label: str) -> CcContext:
        return CcContext(label, self.name, cc.CpuContext(label, share_host_arrays=False))

    def owns(self, context: Any) -> bool:
        return isinstance(context, CcContext) and context.backend_name == self.name

    # -- compiling

    def compile_batch(self, routines: Sequence[tuple[str, Any]], bindings: Sequence[StaticSymbol], *,
                      context: CcContext | None = None) -> list[CcProcedure]:
        if context is not None:
            return self._compile_specialized(routines, tuple(bindings), context)
        procs = cc.compile_batch([(n, low_level_of(c)) for n, c in routines], bindings=tuple(bindings),
                                 options=self.options)
        return [CcProcedure(p.name, p, _mem_classes(p, low_level_of(c))) for p, (_, c) in zip(procs, routines)]

    def _compile_specialized(self, routines: Sequence[tuple[str, Any]], bindings: tuple[StaticSymbol, ...],
                             context: CcContext) -> list[CcProcedure]:
        """Each routine `NAME` becomes a body `NAME_body` taking the arrays, and an entry
        `NAME(statics)` calling it with this context's array addresses."""
        syntax = self.options.syntax
        glue: list[str] = []
        bodies: list[tuple[str, ll.LLStmt]] = []
        for name, code in routines:
            llc = low_level_of(code)
            body = c_name(name) + _BODY_SUFFIX
            rendered = render_routine(body, llc, bindings, syntax)
            arrays = self._arrays(context, rendered.params, routine_inputs(code), name)
            glue.append(_entry_source(c_name(name), rendered.code.split("\n", 1)[0], rendered.params, arrays, syntax))
            bodies.append((body, llc))
        prelude = syntax.prelude + "\n".join(["/* Entry points specialized to one context's arrays. */", *glue])
        options = dataclasses.replace(self.options, syntax=dataclasses.replace(syntax, prelude=prelude))
        procs = cc.compile_batch(bodies, bindings=bindings, options=options)
        lib = ctypes.CDLL(str(procs[0].so_path)) if procs else None
        out = []
        for (name, _), proc, (_, llc) in zip(routines, procs, bodies):
            entry = lib[c_name(name)]
            entry.restype = None
            out.append(CcProcedure(name, proc, _mem_classes(proc, llc), context, entry))
        return out

    # -- linking

    def _arrays(self, context: CcContext, params: Sequence[Param], inputs: frozenset[Tnode],
                routine: str) -> list[np.ndarray]:
        """The arrays for the array and merge-buffer parameters; inputs must be held already."""
        arrays = []
        for p in params:
            match p.kind:
                case ParamKind.ARRAY:
                    if p.tn in inputs and p.mem is not MemClass.CONSTANT_FROM_HOST and not context.holds(p.tn):
                        raise missing_input_error(routine, p.tn, context, hosted_hint=True)
                    arrays.append(context.cpu.array(p.tn))
                case ParamKind.MERGE_BUFFER:
                    arrays.append(context.cpu.merge_buffer(p.tn))
        return arrays

    def link_compiled(self, context: CcContext, procedure: CcProcedure, inputs: frozenset[Tnode],
                      static_values: Mapping[StaticSymbol, IntRef] | None = None) -> Routine[CcContext]:
        name = procedure.name
        if procedure.context is not None and procedure.context is not context:
            raise NodeNotInContextError(
                f"einjit: routine {name!r} was compiled for context {procedure.context.label!r} (not shared) and "
                f"uses its arrays; it cannot run in context {context.label!r} — compile with shared=True")
        arrays = self._arrays(context, procedure.procedure.params, inputs, name)
        statics = procedure.procedure.bindings
        refs = make_refs(statics, static_values)
        if procedure.entry is not None:
            fn, pointers = procedure.entry, ()
        else:
            fn, pointers = procedure.procedure.function, tuple(ctypes.c_void_p(a.ctypes.data) for a in arrays)

        def schedule() -> Work:
            values = capture_values(refs)

            def run() -> None:
                check_static_values(name, statics, values)
                fn(*pointers, *values)

            return Work(name, run)

        return Routine(context, schedule, refs, name, procedure.mem_classes)

    # -- moving data

    def from_host(self, context: CcContext, tn: Tnode) -> None:
        _check_has_array(tn, "from_host")
        context.cpu.from_host(tn)

    def to_host(self, context: CcContext, tn: Tnode) -> None:
        if not context.holds(tn):
            raise not_held_error("to_host", tn, context)
        context.cpu.to_host(tn)

    def device_to_device(self, tn: Tnode, dst_context: CcContext, src_context: CcContext,
                         into_merge_buffer: bool = True) -> None:
        if not src_context.holds(tn):
            raise not_held_error(f"device_to_device into {dst_context.label!r}", tn, src_context)
        dst = dst_context.cpu.merge_buffer(tn) if into_merge_buffer else dst_context.cpu.array(tn)
        dst[...] = src_context.cpu.array(tn)


def _check_has_array(tn: Tnode, what: str) -> None:
    if tn.is_virtual() or tn.is_local():
        raise NodeNotInContextError(
            f"einjit: {what}: {tn.debug_name()} is {tn.memory_mode} (provenance {tn.provenance}) and has no array "
            f"outside a routine")


def _entry_source(name: str, body_head: str, params: Sequence[Param], arrays: Sequence[np.ndarray],
                  syntax: CSyntax) -> str:
    """`void NAME(int s) { NAME_body((float *)0x...ULL, ..., s); }` plus the body's prototype."""
    prototype = body_head.removesuffix(" {") + ";"
    args = [f"({syntax.type_name(p.tn.prec)} *){a.ctypes.data:#x}ULL"
            for p, a in zip((p for p in params if p.kind is not ParamKind.STATIC), arrays)]
    statics = [p.c_name for p in params if p.kind is ParamKind.STATIC]
    decl = ", ".join(f"int {s}" for s in statics) or "void"
    return f"{prototype}\nvoid {name}({decl}) {{\n  {name}{_BODY_SUFFIX}({', '.join(args + statics)});\n}}\n"


class CcBackend(SimpleNoDeviceBackend[CcContext, CcProcedure]):
    """gcc through `cc.py`, as a no-device backend with `Postponed` / `Compiled` code."""

    def __init__(self, options: cc.CcOptions | None = None, name: str = "cc"):
        super().__init__(CcSimpleBackend(options, name))
