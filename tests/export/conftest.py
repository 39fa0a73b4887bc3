"""Fresh global state per test; the helpers module `digits_models` importable."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def fresh_state(fresh_inference_state):
    """Every test here starts from a fresh inference state (`tests/conftest.py`)."""
