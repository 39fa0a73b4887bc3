"""The backend-independent optimizer of low-level code (seed 000, `optimize_proc`).

The pipeline, one module per pass:

1. `tracing.visit_llc` executes the code symbolically and records, per tensor node, where it
   is written and read (`TracedArray`), and which node owns each loop symbol;
2. `virtualize.decide_from_trace` keeps materialized what the trace already rules out, then
   `virtualize.virtual_llc` checks each node's computation (`check_and_store_virtual`) and
   inlines reads of virtual nodes (`inline_computation`);
3. `cleanup.cleanup_virtual_llc` removes the virtual nodes' computations, checks symbol
   scoping and finalizes every touched node's memory mode;
4. `simplify.simplify_llc` folds constants and algebra, eliminates local scopes, unrolls
   integer powers and forms fused multiply-adds.

`EINJIT_DEBUG=4` logs the unoptimized code and every virtualization decision with its
`NonVirtual` code or provenance; `EINJIT_DEBUG=2` logs the optimized code.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Iterable

from einjit import config
from einjit.ir import low_level as ll
from einjit.ir.cleanup import ScopeError, cleanup_virtual_llc
from einjit.ir.indexing import StaticSymbol, Symbol
from einjit.ir.simplify import simplify_llc
from einjit.ir.tnode import Tnode
from einjit.ir.tracing import RECURRENT, Trace, TracedArray, VirtualizeSettings, visit_llc
from einjit.ir.virtualize import (NON_VIRTUAL_REASONS, NonVirtual, VirtualState, check_and_store_virtual,
                                  decide_from_trace, inline_computation, virtual_llc)

virtualize_settings = VirtualizeSettings()
"""The settings `optimize_proc` uses when it is given none; replace it to change the default."""


@dataclass(frozen=True, eq=False)
class Optimized:
    """Optimized code with what tracing learned about its nodes. `merge_node` is the node whose
    merge buffer the code reads, if any."""

    traced_store: dict[Tnode, TracedArray]
    llc: ll.LLStmt
    merge_node: Tnode | None
    name: str = ""


def optimize_proc(llc: ll.LLStmt, *, name: str = "", static_indices: Iterable[Symbol | StaticSymbol] = frozenset(),
                  settings: VirtualizeSettings | None = None) -> Optimized:
    """Optimize one routine. `static_indices` are the symbols bound per call rather than by
    loops (static symbols may be given as such). Narrows the memory mode of every node the
    code touches to `Virtual` or a stored mode, never against a mode already set."""
    settings = settings or virtualize_settings
    static = frozenset(s.symbol if isinstance(s, StaticSymbol) else s for s in static_indices)
    label = name or "<routine>"
    if config.debug_level() >= 4:
        config.debug(4, f"unoptimized low-level code of {label}:\n{ll.to_doc(llc)}")
    with _recursion_limit(RECURSION_LIMIT):
        trace = visit_llc(llc, settings=settings)
        decide_from_trace(trace, settings, name)
        state = VirtualState(trace, static, name)
        code = virtual_llc(llc, state) if settings.virtualize else llc
        code = cleanup_virtual_llc(code, state, settings)
        if settings.simplify:
            code = simplify_llc(code)
    if config.debug_level() >= 2:
        config.debug(2, f"optimized low-level code of {label}:\n{ll.to_doc(code)}")
    return Optimized(trace.traced_store, code, trace.merge_node, name)


RECURSION_LIMIT = 20_000
"""The passes recurse over expressions, and a chain of inlined pointwise nodes is one deep
expression: a few hundred inlined nodes need more than Python's default of 1000 frames."""


@contextlib.contextmanager
def _recursion_limit(limit: int):
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


__all__ = [
    "NON_VIRTUAL_REASONS", "NonVirtual", "Optimized", "RECURRENT", "ScopeError", "Trace", "TracedArray",
    "VirtualizeSettings", "check_and_store_virtual", "cleanup_virtual_llc", "decide_from_trace",
    "inline_computation", "optimize_proc", "simplify_llc", "virtual_llc", "virtualize_settings", "visit_llc",
]
