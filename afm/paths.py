"""Where the platform keeps local state: `AFM_HOME` (default `./.afm`, resolved absolute).

Layout under AFM_HOME: `mlflow.db` + `mlartifacts/` (embedded tracking), `artifacts/` (default artifact
store), `work/` (stage scratch space), `stack/` (local servers' PIDs, logs, env.sh).
"""
from __future__ import annotations

import os
from pathlib import Path


def afm_home() -> Path:
    home = Path(os.environ.get("AFM_HOME", ".afm")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home
