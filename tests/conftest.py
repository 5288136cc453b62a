"""Suite-wide isolation: a test module that leaves a Ray session running (e.g. a flow whose stages call
ray.init) must not leak it into the next module, whose own `ray.init` would then fail."""
from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True, scope="module")
def no_ray_session_leaks_between_modules():
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
