"""Fixtures shared by the platform tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def afm_home(tmp_path_factory):
    """One AFM_HOME (and SQLite MLflow store) per module: its first use runs MLflow's migrations (~2 s), so a
    module's tests share it. Modules that need one per test define their own `afm_home`."""
    home = tmp_path_factory.mktemp("afm_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AFM_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield home
