"""The C backend's timer for the measured tile search (`einjit.ir.sched.search`).

The search belongs to the optimizer, which sits below the backends; it builds each candidate
nest and asks the timer it was given how fast that nest runs here. This module is that timer
for gcc, installed by the C backend when it loads (`search.set_timer`), so the optimizer never
imports a backend.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from einjit.backends.cc import toolchain as cc
from einjit.ir import low_level as ll
from einjit.ir.tnode import Tnode


class CcTimer:
    """Compiles a stand-alone routine with the C backend and returns its best time of a few runs
    (at most 20, at most 0.2 s), on random inputs."""

    def __init__(self, options: cc.CcOptions | None = None):
        self.options = options or cc.CcOptions()

    def identity(self) -> str:
        """The compiler, its flags and the host CPU: what a measured winner depends on."""
        return cc.target_identity(self.options)

    def __call__(self, code: ll.LLStmt, inputs: Sequence[Tnode]) -> float:
        from einjit.backends.cc.backend import CcBackend  # which installs this timer when it loads

        backend = CcBackend(self.options)
        ctx = backend.init("search")
        rng = np.random.default_rng(0)
        for tn in inputs:
            ctx.array(tn)[...] = rng.standard_normal(tn.dims).astype(tn.prec.dtype)
        routine = backend.link(ctx, backend.compile((), code, shared=True, name="search"))
        routine()
        best = float("inf")
        deadline = time.perf_counter() + 0.2
        for _ in range(20):
            t = time.perf_counter()
            routine()
            best = min(best, time.perf_counter() - t)
            if time.perf_counter() > deadline:
                break
        return best
