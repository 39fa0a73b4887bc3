"""The optimizer of low-level code (seed 000, `optimize_proc`): a list of named stages.

`STAGES`, one module per stage:

1. "tracing" (`tracing.visit_llc`) executes the code symbolically and records, per tensor
   node, where it is written and read (`TracedArray`), and which node owns each loop symbol;
2. "virtualize": `virtualize.decide_from_trace` keeps materialized what the trace already
   rules out, then `virtualize.virtual_llc` checks each node's computation
   (`check_and_store_virtual`) and inlines reads of virtual nodes (`inline_computation`);
3. "cleanup" (`cleanup.cleanup_virtual_llc`) removes the virtual nodes' computations, checks
   symbol scoping and finalizes every touched node's memory mode;
4. "simplify" (`simplify.simplify_llc`) folds constants and algebra, eliminates local scopes,
   unrolls integer powers and forms fused multiply-adds;
5. "schedule" (`schedule.schedule_llc`, CPU) register-blocks, packs and reorders contraction
   nests, and reassociates float reductions when the settings allow it;
6. "extrema" (`extrema.split_extrema`, CPU) splits the remaining max and min reductions into
   partial extrema over vector lanes;
7. "interchange" (`interchange.interchange_loops`, CPU) moves the unit-stride loop of the
   remaining accumulation nests innermost;
8. "causal" (`causal.clip_causal_loops`, CPU) clips accumulation loops to the iterations
   whose products can be non-zero, where a factor is zero above a diagonal (causal attention);
9. "scope_sums" (`scope_sums.split_scope_sums`, CPU) splits the sums computed inside
   expressions (local scopes: softmax's backward row sum) into partial sums over vector lanes;
10. "first_writes" (`first_writes.first_writes`, CPU) drops a zero fill whose next nest adds
   one term into every cell, that nest storing its terms instead; `covered_fills` one whose
   clipped writers store every cell the later clipped readers reach;
11. "copies" (`copies.propagate_copies`, CPU) drops nests that only copy one array into
    another, the copy's readers reading the source, or the source's writers writing the copy;
12. "epilogues" (`epilogues.fold_epilogues`, CPU) computes a pointwise statement that reads a
    scheduled product's cells, and nothing large besides (a bias), where the product stores them;
13. "fuse" (`fusion.fuse_loops`, CPU) fuses the outer loops of consecutive nests over the same
    ranges where every dependence between them stays inside one iteration;
14. "rows" (`row_buffers.row_buffers`, CPU) shrinks a node that one fused nest writes and
    reads within each row's iteration to a local of one row;
15. "trim" (`trimmed_writes.trim_writes`, CPU) clips, by whole vectors, a loop storing cells
    that no reader reaches once the causal stage has clipped the readers;
16. "prefetch" (`prefetch.prefetch_kernels`, CPU) asks, in a register-blocked kernel's sweep,
    for the lines its next block will read of the strided operands, and in its tile loop for
    the lines the next tile will store.

Stages 1-4 are portable: their result is `Optimized.portable_llc`, what GPU backends render.
`EINJIT_DUMP_DIR=dir` writes each stage's result as
`<routine>.<stage>.ll`. `EINJIT_DEBUG=4` logs the unoptimized code and every virtualization
decision with its `NonVirtual` code or provenance; `EINJIT_DEBUG=2` logs the optimized code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from einjit import config
from einjit.ir import low_level as ll
from einjit.ir.indexing import StaticSymbol, Symbol
from einjit.ir.passes.cleanup import ScopeError, cleanup_virtual_llc
from einjit.ir.passes.recompute import recomputable
from einjit.ir.passes.simplify import simplify_llc
from einjit.ir.passes.tracing import RECURRENT, Trace, TracedArray, VirtualizeSettings, visit_llc
from einjit.ir.passes.virtualize import (
    NON_VIRTUAL_REASONS,
    NonVirtual,
    VirtualState,
    check_and_store_virtual,
    decide_from_trace,
    inline_computation,
    virtual_llc,
)
from einjit.ir.sched.bf16_fold import bf16_stage
from einjit.ir.sched.causal import clip_causal_loops
from einjit.ir.sched.copies import propagate_copies
from einjit.ir.sched.covered_fills import drop_covered_fills
from einjit.ir.sched.epilogues import fold_epilogues
from einjit.ir.sched.extrema import split_extrema
from einjit.ir.sched.first_writes import first_writes
from einjit.ir.sched.fusion import fuse_loops
from einjit.ir.sched.interchange import interchange_loops
from einjit.ir.sched.prefetch import prefetch_kernels
from einjit.ir.sched.row_buffers import row_buffers
from einjit.ir.sched.schedule import schedule_llc
from einjit.ir.sched.scope_sums import split_scope_sums
from einjit.ir.sched.trimmed_writes import trim_writes
from einjit.ir.tnode import Tnode

virtualize_settings = VirtualizeSettings()
"""The settings `optimize_proc` uses when it is given none; replace it to change the default."""


@dataclass(frozen=True, eq=False)
class Optimized:
    """Optimized code with what tracing learned about its nodes. `merge_node` is the node whose
    merge buffer the code reads, if any. `llc` went through every enabled stage;
    `portable_llc` stops before the CPU loop stages."""

    traced_store: dict[Tnode, TracedArray]
    llc: ll.LLStmt
    merge_node: Tnode | None
    name: str = ""
    portable_llc: ll.LLStmt | None = None
    settings: VirtualizeSettings | None = None


@dataclass(eq=False)
class _Run:
    """What the stages of one `optimize_proc` call share."""

    settings: VirtualizeSettings
    static: frozenset[Symbol]
    name: str
    trace: Trace | None = None
    state: VirtualState | None = field(default=None)


def _tracing(run: _Run, code: ll.LLStmt) -> ll.LLStmt:
    run.trace = visit_llc(code, settings=run.settings)
    cheap = recomputable(code) if run.settings.inline_broadcast_arithmetic else frozenset()
    decide_from_trace(run.trace, run.settings, run.name, cheap)
    run.state = VirtualState(run.trace, run.static, run.name)
    return code


def _virtualize(run: _Run, code: ll.LLStmt) -> ll.LLStmt:
    assert run.state is not None  # set by the tracing pass, which runs first
    return virtual_llc(code, run.state)


def _cleanup(run: _Run, code: ll.LLStmt) -> ll.LLStmt:
    assert run.state is not None  # set by the tracing pass, which runs first
    return cleanup_virtual_llc(code, run.state, run.settings)


def _first_writes(run: _Run, code: ll.LLStmt) -> ll.LLStmt:
    """Zero fills dropped: `first_writes`, then those of clipped writers (`covered_fills`)."""
    return drop_covered_fills(first_writes(code), local_storage=run.settings.local_storage)


@dataclass(frozen=True)
class Stage:
    """One named optimizer stage. `portable`: part of the code every backend renders."""

    name: str
    run: Callable[[_Run, ll.LLStmt], ll.LLStmt]
    enabled: Callable[[VirtualizeSettings], bool]
    portable: bool = True


STAGES: tuple[Stage, ...] = (
    Stage("tracing", _tracing, lambda s: True),
    Stage("virtualize", _virtualize, lambda s: s.virtualize),
    Stage("cleanup", _cleanup, lambda s: True),
    Stage("simplify", lambda run, code: simplify_llc(code), lambda s: s.simplify),
    Stage("schedule", lambda run, code: schedule_llc(code, run.settings), lambda s: s.schedule, portable=False),
    Stage("bf16", lambda run, code: bf16_stage(code), lambda s: s.schedule, portable=False),
    Stage("extrema", lambda run, code: split_extrema(code, run.settings), lambda s: s.schedule, portable=False),
    Stage("interchange", lambda run, code: interchange_loops(code), lambda s: s.interchange, portable=False),
    Stage("causal", lambda run, code: clip_causal_loops(code, local_storage=run.settings.local_storage),
          lambda s: s.schedule and s.causal, portable=False),
    Stage("scope_sums", lambda run, code: split_scope_sums(code, run.settings), lambda s: s.schedule, portable=False),
    Stage("first_writes", _first_writes, lambda s: s.schedule, portable=False),
    Stage("copies", lambda run, code: propagate_copies(code, local_storage=run.settings.local_storage),
          lambda s: s.schedule, portable=False),
    Stage("epilogues", lambda run, code: fold_epilogues(code, local_storage=run.settings.local_storage),
          lambda s: s.schedule, portable=False),
    Stage("fuse", lambda run, code: fuse_loops(code), lambda s: s.fuse, portable=False),
    Stage("rows", lambda run, code: row_buffers(code, local_storage=run.settings.local_storage),
          lambda s: s.fuse, portable=False),
    Stage("trim", lambda run, code: trim_writes(code, local_storage=run.settings.local_storage),
          lambda s: s.schedule, portable=False),
    Stage("prefetch", lambda run, code: prefetch_kernels(code), lambda s: s.schedule, portable=False),
)


def optimize_proc(llc: ll.LLStmt, *, name: str = "", static_indices: Iterable[Symbol | StaticSymbol] = frozenset(),
                  settings: VirtualizeSettings | None = None) -> Optimized:
    """Optimize one routine by running the enabled `STAGES` in order. `static_indices` are the
    symbols bound per call rather than by loops (static symbols may be given as such).
    Narrows the memory mode of every node the code touches to `Virtual` or a stored mode,
    never against a mode already set."""
    settings = settings or virtualize_settings
    static = frozenset(s.symbol if isinstance(s, StaticSymbol) else s for s in static_indices)
    label = name or "<routine>"
    if config.debug_level() >= 4:
        config.debug(4, f"unoptimized low-level code of {label}:\n{ll.to_doc(llc)}")
    dump_name = name or "routine"
    dumping = config.dumping()
    run = _Run(settings, static, name)
    code = portable = llc
    with ll.deep_recursion():
        for stage in STAGES:
            if not stage.enabled(settings):
                continue
            code = stage.run(run, code)
            if dumping and stage.name != "tracing":
                config.dump(dump_name, stage.name, "ll", ll.to_doc(code))
            if stage.portable:
                portable = code
    if config.debug_level() >= 2:
        config.debug(2, f"optimized low-level code of {label}:\n{ll.to_doc(code)}")
    assert run.trace is not None
    return Optimized(run.trace.traced_store, code, run.trace.merge_node, name, portable, settings)


__all__ = [
    "NON_VIRTUAL_REASONS", "NonVirtual", "Optimized", "RECURRENT", "STAGES", "Stage", "ScopeError", "Trace",
    "TracedArray", "VirtualizeSettings", "check_and_store_virtual", "cleanup_virtual_llc", "decide_from_trace",
    "inline_computation", "optimize_proc", "simplify_llc", "virtual_llc", "virtualize_settings", "visit_llc",
]
