"""Fixtures for the whole suite: a private compilation cache and signing key, so tests never
read or write the user's `~/.cache/einjit` or `~/.config/einjit` and never see another run's
objects; tests marked `slow` (long fuzzing runs, full demo runs) run only when asked for:
`pytest -m slow`."""

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
    """Compiled objects go to a fresh directory so tests never see another run's cache, signed
    with a key of the run's own (never the user's `~/.config/einjit/cache.key`)."""
    names = ("EINJIT_CACHE_DIR", "EINJIT_CACHE_KEY")
    old = {name: os.environ.get(name) for name in names}
    path = tmp_path_factory.mktemp("einjit-cache")
    os.environ["EINJIT_CACHE_DIR"] = str(path)
    os.environ["EINJIT_CACHE_KEY"] = str(tmp_path_factory.mktemp("einjit-key") / "cache.key")
    yield path
    for name, value in old.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def fresh_inference_state():
    """An empty global inference state and fresh random streams (a stream's base depends on how
    many tensors were drawn from its seed before); the folders whose tests build many models
    use it for every test (their conftest), the others leave state to each test."""
    from einjit import shape as sh
    from einjit.tensor import random as rnd

    sh.reset_state()
    rnd.reset_streams()
    yield
    sh.reset_state()


@pytest.fixture
def avx512_machine(monkeypatch):
    """Golden files hold the C scheduled for the AVX-512 description (`ir/sched/machine.py`),
    whatever CPU runs the test."""
    monkeypatch.setenv("EINJIT_MACHINE", "avx512")
