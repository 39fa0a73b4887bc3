"""Shared helpers of the safety tests: compile-and-run a low-level program with gcc or the
reference interpreter."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from einjit.backends import cc
from einjit.ir import interpret
from einjit.ir import low_level as ll
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.tnode import Tnode


def run_c(llc: ll.LLStmt, inputs: Mapping[Tnode, np.ndarray], *, bindings: tuple[StaticSymbol, ...] = (),
          values: Mapping[StaticSymbol, int] | None = None, name: str = "safety") -> cc.CpuContext:
    """Compile `llc` with gcc, copy `inputs` into a fresh context, run once."""
    proc = cc.compile_proc(llc, name=name, bindings=bindings)
    ctx = cc.CpuContext()
    for tn, arr in inputs.items():
        ctx.array(tn)[...] = arr
    cc.link(ctx, proc, {s: IntRef(v) for s, v in (values or {}).items()})()
    return ctx


def run_interpreter(llc: ll.LLStmt, inputs: Mapping[Tnode, np.ndarray]) -> dict[Tnode, np.ndarray]:
    arrays = {tn: np.array(v, dtype=tn.prec.dtype) for tn, v in inputs.items()}
    return interpret.run(llc, arrays)
