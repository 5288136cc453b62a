"""Fixtures for distill tests: the teacher tests' small world and tools, and ONE Ray session per test session
(ray.init costs ~15 s here)."""
from __future__ import annotations

import pytest

from tests.teacher.conftest import miniweb, toolbox, toolbox_cfg, world_setup  # noqa: F401 (fixtures)


@pytest.fixture(scope="session")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False)
    yield ray
    ray.shutdown()
