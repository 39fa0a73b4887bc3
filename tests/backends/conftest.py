"""Shared fixtures: a private compilation cache per test session, and a one-call runner."""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np
import pytest

from einjit.backends import cc
from einjit.ir import low_level as ll
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.tnode import Tnode


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Compiled objects go to a fresh directory so tests never see another run's cache."""
    old = os.environ.get("EINJIT_CACHE_DIR")
    path = tmp_path_factory.mktemp("einjit-cache")
    os.environ["EINJIT_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("EINJIT_CACHE_DIR", None)
    else:
        os.environ["EINJIT_CACHE_DIR"] = old


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
