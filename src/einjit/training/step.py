"""The one compile path of training code: training steps, forward steps and the gradient and
update routines of data-parallel steps are all compiled here.

`compile_code` lowers assignments under the program's stable names and compiles them
relocatably (`shared=True`), so one compilation links into any context of the backend;
`to_routine` links that into one context (the `train.to_routine` users call);
`einjit.training.fit` wraps routines into steps that take NumPy batches, and
`einjit.training.parallel` links the same compiled code into every replica. `forward_code` is
the forward pass that does not consume the tensors' code (see `einjit.training.fit`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Mapping, Sequence, cast

from einjit import backends, config, memory
from einjit import shape as sh
from einjit.backends import profile
from einjit.backends.cc import program_cache
from einjit.backends.interface import (
    Compiled,
    Routine,
    default_context,
    load_inputs,
    low_level_of,
    lower_assignments,
)
from einjit.ir import assignments as asg
from einjit.ir import low_level as ll
from einjit.ir import optimize
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.naming import stable_names
from einjit.ir.optimize import VirtualizeSettings
from einjit.ir.tnode import MemoryModeError, Tnode, id_watermark
from einjit.tensor.notation import Code, as_asgns
from einjit.tensor.tensor import Tensor, TensorError

__all__ = ["Program", "compile_code", "forward_code", "to_routine"]


@dataclasses.dataclass(frozen=True)
class Program:
    """Compiled training code: the relocatable object, the hosted nodes it writes (copied back
    after a call on a context with its own arrays), and the optimizer's result, which a
    program-cache hit recomputes only when asked (the profiler needs it; a call does not)."""

    compiled: Compiled
    written_hosted: tuple[Tnode, ...]
    lowered: Callable[[], Any]


def compile_code(code: "Code | asg.Asgns | Sequence[Code | asg.Asgns]", *, bindings: Sequence[StaticSymbol] = (),
                 name: str = "routine", backend: Any = None, settings: VirtualizeSettings | None = None,
                 options: Any = None, use_program_cache: bool = True) -> Program:
    """Lower and compile `code` (a list or tuple is one sequence) relocatably with `backend` (an
    object or a registered name; `options`: the C compiler's `CcOptions`). A program compiled
    before, in this process or an earlier one, comes from the program cache without running
    einjit's passes."""
    if isinstance(code, (list, tuple)):
        code = asg.sequence(*[as_asgns(c) for c in code])
    asgns = as_asgns(cast("Code | asg.Asgns", code))  # a list or tuple was sequenced just above
    base = backends.resolve(backend)
    compiler = base if options is None else backends.with_options(base, options)
    symbols = tuple(bindings)
    # the settings the passes will use, also when the caller leaves them to the module's
    # default: the program cache's key must tell programs compiled under other settings apart
    settings = settings or optimize.virtualize_settings

    def lower() -> Any:
        return lower_assignments(symbols, asgns, name, settings=settings)[1]

    with stable_names(), ll.remembered_nodes(), memory.collector_paused():
        sh.finish_inference()
        key = program_cache.key(asgns, symbols, name, settings, compiler) if use_program_cache else None
        hit = program_cache.load(key, asgns, symbols, name, compiler) if key else None
        if hit is not None:
            return Program(hit.compiled, hit.written_hosted, lower)
        watermark = id_watermark()
        lowered = lower()
        compiled = compiler.compile(symbols, lowered, shared=True, name=name)
        assert isinstance(compiled, Compiled)  # compiled now, being shared
        if key:
            program_cache.store(key, asgns, symbols, lowered, compiled, watermark)
    return Program(compiled, _written_hosted(lowered), lambda: lowered)


def to_routine(code: "Code | asg.Asgns | Sequence[Code | asg.Asgns]", *,
               bindings: Mapping[StaticSymbol, IntRef] | Sequence[StaticSymbol] = (), name: str = "routine",
               backend: Any = None, context: Any = None, settings: VirtualizeSettings | None = None,
               options: Any = None) -> Routine:
    """Compile assignments into one routine linked into `context`.

    The backend is `backend` (an object or a registered name), else the context's, else
    `$EINJIT_BACKEND` or the C backend; the context defaults to the backend's default context
    (for the C backend, one computing in the host arrays). `options` are the C compiler's
    `CcOptions`. Calling the routine runs it to completion, and the host then sees the hosted
    nodes it wrote (on a context with its own arrays they are copied back); `schedule()` is
    the asynchronous form of the seed, which copies nothing. With `EINJIT_PROFILE=1` the
    routine is the profiler's instrumented variant (and the program cache is not used).
    """
    refs = dict(bindings) if isinstance(bindings, Mapping) else {s: IntRef(0) for s in bindings}
    if backend is None and context is not None:
        backend = context.backend
    base = backends.resolve(backend)
    compiler = base if options is None else backends.with_options(base, options)
    start = time.perf_counter()
    instrumented = os.environ.get("EINJIT_PROFILE", "") not in ("", "0")
    program = compile_code(code, bindings=tuple(refs), name=name, backend=compiler, settings=settings,
                           use_program_cache=not instrumented)
    context = context if context is not None else default_context(base)
    load_inputs(context, program.compiled.inputs)
    routine = profile.profiled(compiler.link(context, program.compiled, refs), compiler, refs, program.lowered,
                               name, instrumented_now=instrumented)
    if not getattr(context, "share_host_arrays", False):
        routine = _syncing_host(routine, program.written_hosted)
    config.debug(1, f"to_routine {name}: {1000 * (time.perf_counter() - start):.1f} ms")
    return routine


def _written_hosted(lowered: Any) -> tuple[Tnode, ...]:
    """The hosted nodes the code writes, in order of first write."""
    written = {s.tn: None for s in ll.iter_stmts(low_level_of(lowered))
               if isinstance(s, (ll.Set, ll.SetFromVec, ll.ZeroOut)) and s.tn.is_hosted()}
    return tuple(written)


def _syncing_host(routine: Routine, written: Sequence[Tnode]) -> Routine:
    """On a context with its own arrays, calling the routine also copies the hosted nodes it
    writes (`written`) back to the host, so `routine()` means the same on every backend:
    afterwards the host sees the results. `routine.schedule()` stays asynchronous and copies
    nothing."""
    if not written:
        return routine
    context, wait = routine.context, routine.await_

    def await_and_sync() -> None:
        if wait is not None:
            wait()
        for tn in written:
            context.to_host(tn)

    return dataclasses.replace(routine, await_=await_and_sync, run_now=None)


def forward_code(*outputs: Tensor) -> asg.Asgns:
    """The forward code of `outputs`' subtrees, every tensor recomputed once, without
    consuming it; the outputs become hosted (readable)."""
    for t in outputs:
        try:
            t.hosted()
        except MemoryModeError:
            raise TensorError(
                f"einjit: tensor {t.describe()} cannot be read after its routine: the routine compiled first kept "
                f"it only inside itself ({t.value_tn.memory_mode}). Build the prediction on a new input "
                f"(`model(ej.input(...))`), or call `.hosted()` on it before compiling that routine") from None
    seen: dict[int, Tensor] = {}
    for t in outputs:
        seen.update((x.id, x) for x in t.subtree())
    body = asg.sequence(*[seen[k].own_forward for k in sorted(seen)])
    return asg.BlockComment(f"forward {', '.join(t.label_str for t in outputs)}", body)
