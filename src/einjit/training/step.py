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
import time
from typing import Any, Mapping, Sequence, cast

from einjit import backends, config
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
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.naming import stable_names
from einjit.ir.optimize import VirtualizeSettings
from einjit.ir.tnode import MemoryModeError
from einjit.tensor.notation import Code, as_asgns
from einjit.tensor.tensor import Tensor, TensorError

__all__ = ["compile_code", "forward_code", "to_routine"]


def compile_code(code: "Code | asg.Asgns | Sequence[Code | asg.Asgns]", *, bindings: Sequence[StaticSymbol] = (),
                 name: str = "routine", backend: Any = None, settings: VirtualizeSettings | None = None,
                 options: Any = None) -> tuple[Compiled, Any]:
    """Lower and compile `code` (a list or tuple is one sequence) relocatably with `backend` (an
    object or a registered name; `options`: the C compiler's `CcOptions`). Returns the compiled
    code and the optimizer's result."""
    if isinstance(code, (list, tuple)):
        code = asg.sequence(*[as_asgns(c) for c in code])
    one_code = cast("Code | asg.Asgns", code)  # a list or tuple was sequenced just above
    base = backends.resolve(backend)
    compiler = base if options is None else backends.with_options(base, options)
    with stable_names():
        _, lowered = lower_assignments(tuple(bindings), as_asgns(one_code), name, settings=settings)
        compiled = compiler.compile(tuple(bindings), lowered, shared=True, name=name)
    assert isinstance(compiled, Compiled)  # compiled now, being shared
    return compiled, lowered


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
    the asynchronous form of the seed, which copies nothing.
    """
    refs = dict(bindings) if isinstance(bindings, Mapping) else {s: IntRef(0) for s in bindings}
    if backend is None and context is not None:
        backend = context.backend
    base = backends.resolve(backend)
    compiler = base if options is None else backends.with_options(base, options)
    start = time.perf_counter()
    compiled, lowered = compile_code(code, bindings=tuple(refs), name=name, backend=compiler, settings=settings)
    context = context if context is not None else default_context(base)
    load_inputs(context, compiled.inputs)
    routine = compiler.link(context, compiled, refs)
    if not getattr(context, "share_host_arrays", False):
        routine = _syncing_host(routine, lowered)
    config.debug(1, f"to_routine {name}: {1000 * (time.perf_counter() - start):.1f} ms")
    return routine


def _syncing_host(routine: Routine, lowered: Any) -> Routine:
    """On a context with its own arrays, calling the routine also copies the hosted nodes it
    writes back to the host, so `routine()` means the same on every backend: afterwards the
    host sees the results. `routine.schedule()` stays asynchronous and copies nothing."""
    written = {s.tn: None for s in ll.iter_stmts(low_level_of(lowered))
               if isinstance(s, (ll.Set, ll.SetFromVec, ll.ZeroOut)) and s.tn.is_hosted()}
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
