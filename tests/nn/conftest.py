"""Fresh global state per test."""

import pytest


@pytest.fixture(autouse=True)
def fresh_state(fresh_inference_state):
    """Every test here starts from a fresh inference state (`tests/conftest.py`)."""
