"""Fixtures for evaluation tests: one isolated local MLflow registry (sqlite in a tmp AFM_HOME) for the package.

One store for all registry tests because creating a fresh sqlite store runs MLflow's migrations (seconds each);
tests stay independent by using their own registered-model and experiment names."""
from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="package")
def _registry_home(tmp_path_factory):
    import mlflow

    home = tmp_path_factory.mktemp("afm_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AFM_HOME", str(home))
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield home
        while mlflow.active_run() is not None:
            mlflow.end_run()


@pytest.fixture
def local_registry(_registry_home, tmp_path):
    """A helper that registers a model directory (a real config.json) as a new version of `name` with `tags`
    in the package's sqlite registry and returns the version string."""
    from afm import tracking

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "qwen2"}))

    def register(name: str, tags: dict[str, str]) -> str:
        return tracking.register_model(model_dir, name, tags=tags)

    return register
