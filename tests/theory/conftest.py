"""Theory tests run in float64; the x64 switch is scoped to each test, so it never leaks elsewhere."""

import jax
import pytest


@pytest.fixture(autouse=True)
def float64():
    with jax.enable_x64(True):
        yield
