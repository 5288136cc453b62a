"""Fixtures for evaluation tests: an isolated local MLflow registry (sqlite in a tmp AFM_HOME)."""
from __future__ import annotations

import json

import pytest


@pytest.fixture
def local_registry(tmp_path, monkeypatch):
    """Point afm.tracking at a fresh sqlite store under tmp AFM_HOME; returns a helper that registers a model
    directory (a real config.json) as a new version with the given tags and returns its version string."""
    import mlflow

    from afm import tracking

    monkeypatch.setenv("AFM_HOME", str(tmp_path / "afm_home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "qwen2"}))

    def register(name: str, tags: dict[str, str]) -> str:
        return tracking.register_model(model_dir, name, tags=tags)

    yield register
    while mlflow.active_run() is not None:
        mlflow.end_run()
