"""One tracking store (#25): the stack's MLflow server serves the SQLite store the CLI writes without the stack,
so a run made by `make run` (no MLFLOW_TRACKING_URI) is listed by the stack's server, with its nested stage run,
its metrics and its artifacts. Starts the stack's own MLflow command (afm.stack) on a free port, for real."""
from __future__ import annotations

import os
import time

import pytest
from mlflow.tracking import MlflowClient

from afm import tracking
from afm.processes import start_process, stop_processes
from afm.stack import StackConfig, _commands, is_healthy
from tests.conftest import free_port


@pytest.fixture
def afm_home(tmp_path, monkeypatch):
    monkeypatch.setenv("AFM_HOME", str(tmp_path / "afm"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "afm"


def test_stack_server_lists_a_run_the_cli_wrote(afm_home, tmp_path):
    # What `make run` does without the stack: a pipeline run with a nested stage run, on <AFM_HOME>/mlflow.db.
    with tracking.parent_run("pipeline", "pipeline", params={"seed": 0}, tags={"afm.stage": "pipeline"}) as parent:
        with tracking.stage_scope(parent, stage="sft"), tracking.start_run("sft", "sft-run", params={"lr": 0.1}):
            tracking.log_metrics({"loss": 1.5}, step=1)
            tracking.log_table_rows([{"ok": True}], "rows.json")
        tracking.log_run_metrics(parent, {"sft.final_loss": 1.5})

    cfg = StackConfig(state_dir=tmp_path / "stack", mlflow_port=free_port(), s3_port=free_port())
    assert cfg.mlflow_db == afm_home / "mlflow.db", "the stack serves the CLI's store by default"
    cmd, extra_env = _commands(cfg)["mlflow"]
    record = start_process(cmd, {**os.environ, **extra_env}, tmp_path / "mlflow.log")
    try:
        deadline = time.monotonic() + 120
        while not is_healthy(cfg, "mlflow"):
            assert time.monotonic() < deadline, (tmp_path / "mlflow.log").read_text()[-3000:]
            time.sleep(0.5)
        client = MlflowClient(tracking_uri=f"http://{cfg.host}:{cfg.mlflow_port}")
        experiment = client.get_experiment_by_name("pipeline")
        runs = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id])}
        assert runs[parent].data.metrics["sft.final_loss"] == 1.5
        (child,) = [r for r in runs.values() if r.data.tags.get("mlflow.parentRunId") == parent]
        assert child.data.tags["afm.stage"] == "sft" and child.data.metrics["loss"] == 1.5
        assert [a.path for a in client.list_artifacts(child.info.run_id)] == ["rows.json"]
    finally:
        stop_processes({"mlflow": record}, timeout_s=15)
