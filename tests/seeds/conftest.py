import pytest

from einjit import shape as sh


@pytest.fixture(autouse=True)
def fresh_inference_state():
    """Each test starts from an empty global inference state."""
    sh.reset_state()
    yield
    sh.reset_state()
