"""Fresh global state per test; the helpers module `digits_models` importable."""

import sys
from pathlib import Path

import pytest

from einjit import shape as sh
from einjit.tensor import random as rnd

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def fresh_inference_state():
    """Each test starts from an empty global inference state and fresh random streams (a
    stream's base depends on how many tensors were drawn from its seed before)."""
    sh.reset_state()
    rnd.reset_streams()
    yield
    sh.reset_state()
