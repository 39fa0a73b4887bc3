"""Shared helpers of the safety tests: compile-and-run a low-level program with gcc or the
reference interpreter."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from einjit.backends.cc.backend import CcContext, run_once
from einjit.ir import interpret
from einjit.ir import low_level as ll
from einjit.ir.indexing import StaticSymbol
from einjit.ir.tnode import Tnode


def run_c(llc: ll.LLStmt, inputs: Mapping[Tnode, np.ndarray], *, bindings: tuple[StaticSymbol, ...] = (),
          values: Mapping[StaticSymbol, int] | None = None, name: str = "safety") -> CcContext:
    """Compile `llc` with gcc, copy `inputs` into a fresh context, run once (the C backend's
    `run_once`); the returned context's `array(tn)` holds the results."""
    return run_once(llc, inputs, bindings=bindings, values=values, name=name)


def run_interpreter(llc: ll.LLStmt, inputs: Mapping[Tnode, np.ndarray]) -> dict[Tnode, np.ndarray]:
    arrays = {tn: np.array(v, dtype=tn.prec.dtype) for tn, v in inputs.items()}
    return interpret.run(llc, arrays)
