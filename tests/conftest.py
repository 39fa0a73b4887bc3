"""Fixtures for the whole suite: a private compilation cache, so tests never read or write the
user's `~/.cache/einjit` and never see another run's objects; tests marked `slow` (long fuzzing
runs, full demo runs) run only when asked for: `pytest -m slow`."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


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


@pytest.fixture
def avx512_machine(monkeypatch):
    """Golden files hold the C scheduled for the AVX-512 description (`ir/sched/machine.py`),
    whatever CPU runs the test."""
    monkeypatch.setenv("EINJIT_MACHINE", "avx512")
