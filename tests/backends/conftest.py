"""Shared fixtures: a one-call runner."""

from __future__ import annotations

import pytest

from einjit.backends.cc.backend import run_once


@pytest.fixture
def run_c():
    """`run_c(llc, {node: array}, bindings=..., values=..., options=...)` -> the context after one call."""
    return run_once
