"""One tracking store (#25): the stack's MLflow server serves the SQLite store the CLI writes without the stack,
so a run made by `make run` (no MLFLOW_TRACKING_URI) is listed by the stack's server, with its nested stage run,
its metrics and its artifacts. And through that server (env.sh sourced) a model stage on the S3 store still
stores its policy once (#21): the server accepts the s3:// version source and `models:/` resolves to it.
Starts the stack's own MLflow command (afm.stack) on a free port, for real, with moto as its S3."""
from __future__ import annotations

import os
import time
import uuid

import boto3

import pytest
from mlflow.tracking import MlflowClient

from afm import tracking
from afm.processes import start_process, stop_processes
from afm.stack import LOCAL_AWS_KEY_ID, LOCAL_AWS_SECRET, StackConfig, _commands, client_env, is_healthy
from tasks.train import _model_artifact
from tests.conftest import free_port


@pytest.fixture
def afm_home(tmp_path, monkeypatch):
    monkeypatch.setenv("AFM_HOME", str(tmp_path / "afm"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "afm"


@pytest.fixture
def stack_mlflow(afm_home, tmp_path, moto_endpoint):
    """The stack's MLflow server (its exact command) on a free port, moto as its S3; yields its config."""
    cfg = StackConfig(state_dir=tmp_path / "stack", mlflow_port=free_port(), s3_port=int(moto_endpoint.rsplit(":", 1)[1]),
                      bucket=f"afm-{uuid.uuid4().hex[:8]}")
    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id=LOCAL_AWS_KEY_ID,
                 aws_secret_access_key=LOCAL_AWS_SECRET, region_name="us-east-1").create_bucket(Bucket=cfg.bucket)
    cmd, extra_env = _commands(cfg)["mlflow"]
    record = start_process(cmd, {**os.environ, **extra_env}, tmp_path / "mlflow.log")
    try:
        deadline = time.monotonic() + 120
        while not is_healthy(cfg, "mlflow"):
            assert time.monotonic() < deadline, (tmp_path / "mlflow.log").read_text()[-3000:]
            time.sleep(0.5)
        yield cfg
    finally:
        stop_processes({"mlflow": record}, timeout_s=15)


def test_stack_server_lists_a_run_the_cli_wrote(stack_mlflow, afm_home):
    cfg = stack_mlflow
    assert cfg.mlflow_db == afm_home / "mlflow.db", "the stack serves the CLI's store by default"
    # What `make run` does without the stack's env: a pipeline run with a nested stage run, straight into
    # <AFM_HOME>/mlflow.db (no MLFLOW_TRACKING_URI).
    with tracking.parent_run("pipeline", "pipeline", params={"seed": 0}, tags={"afm.stage": "pipeline"}) as parent:
        with tracking.stage_scope(parent, stage="sft"), tracking.start_run("sft", "sft-run", params={"lr": 0.1}):
            tracking.log_metrics({"loss": 1.5}, step=1)
            tracking.log_table_rows([{"ok": True}], "rows.json")
        tracking.log_run_metrics(parent, {"sft.final_loss": 1.5})

    client = MlflowClient(tracking_uri=f"http://{cfg.host}:{cfg.mlflow_port}")
    experiment = client.get_experiment_by_name("pipeline")
    runs = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id])}
    assert runs[parent].data.metrics["sft.final_loss"] == 1.5
    (child,) = [r for r in runs.values() if r.data.tags.get("mlflow.parentRunId") == parent]
    assert child.data.tags["afm.stage"] == "sft" and child.data.metrics["loss"] == 1.5
    assert [a.path for a in client.list_artifacts(child.info.run_id)] == ["rows.json"]


def test_through_the_stack_server_an_s3_stage_stores_the_policy_once(stack_mlflow, tmp_path, monkeypatch):
    from tests.platform.test_store_once import make_tiny_model, train_like_a_trainer

    cfg = stack_mlflow
    for key, value in client_env(cfg).items():
        if key.startswith(("AWS_", "MLFLOW_")):
            monkeypatch.setenv(key, value)
    model_dir = make_tiny_model(tmp_path / "tiny")
    manifest = _model_artifact("sft", "k9", f"s3://{cfg.bucket}/artifacts", train_like_a_trainer(model_dir, "via-stack"))
    client = MlflowClient()
    assert client.get_model_version("via-stack", manifest["extra"]["model_version"]).source == manifest["uri"]
    s3 = boto3.client("s3")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=cfg.bucket)["Contents"]]
    assert [k for k in keys if k.endswith("model.safetensors")] == ["artifacts/stages/sft-k9/model.safetensors"]
    loaded = tracking.resolve_model_uri(f"models:/via-stack/{manifest['extra']['model_version']}", tmp_path / "dl")
    assert (loaded / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
