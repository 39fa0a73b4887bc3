"""Fresh global state per test; the shared two-convolution model."""

import pytest

import two_conv


@pytest.fixture(autouse=True)
def fresh_state(fresh_inference_state):
    """Every test here starts from a fresh inference state (`tests/conftest.py`)."""


@pytest.fixture
def two_conv_model():
    """`two_conv.build(n, h)`: conv → maxpool → conv with its loss, parameters initialized."""
    return two_conv.build
