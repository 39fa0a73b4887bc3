"""Shared fixtures: a one-call runner."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pytest

from einjit.backends import cc
from einjit.ir import low_level as ll
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.tnode import Tnode


def _run_c(llc: ll.LLStmt, inputs: Mapping[Tnode, np.ndarray], *, bindings: tuple[StaticSymbol, ...] = (),
          values: Mapping[StaticSymbol, int] | None = None, options: cc.CcOptions | None = None,
          name: str = "routine") -> cc.CpuContext:
    """Compile `llc`, copy `inputs` into a fresh context, run once, return the context."""
    proc = cc.compile_proc(llc, name=name, bindings=bindings, options=options)
    ctx = cc.CpuContext()
    for tn, arr in inputs.items():
        ctx.array(tn)[...] = arr
    refs = {s: IntRef(v) for s, v in (values or {}).items()}
    cc.link(ctx, proc, refs)()
    return ctx


@pytest.fixture
def run_c():
    """`run_c(llc, {node: array}, bindings=..., values=..., options=...)` -> the context after one call."""
    return _run_c
