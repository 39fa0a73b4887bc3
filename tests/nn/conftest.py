"""Fresh global state per test; tests marked `slow` (full demo runs) run only with `-m slow`."""

from pathlib import Path

import pytest

from einjit import shape as sh
from einjit.tensor import random as rnd

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords and HERE in Path(item.path).parents:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def fresh_inference_state():
    """Each test starts from an empty global inference state and fresh random streams (a
    stream's base depends on how many tensors were drawn from its seed before)."""
    sh.reset_state()
    rnd.reset_streams()
    yield
    sh.reset_state()
