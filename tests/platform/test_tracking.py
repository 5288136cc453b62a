"""Tracking on the default local SQLite store: params (flattened, truncated, secrets redacted), metrics,
dataset inputs, artifacts, model registry round trip and model URI resolution (incl. s3:// on moto)."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from afm import tracking
from afm.storage import open_store

CANARY = "sk-canary" + "0123456789abcdefXYZ"


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A real 2-layer Qwen2 checkpoint directory (random weights), as save_pretrained writes it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    out = tmp_path_factory.mktemp("tiny") / "policy"
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out


def test_default_uri_is_local_sqlite(afm_home):
    assert tracking.configure_tracking() == f"sqlite:///{afm_home / 'mlflow.db'}"
    assert mlflow.get_tracking_uri() == f"sqlite:///{afm_home / 'mlflow.db'}"


def test_server_uri_from_env(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert tracking.configure_tracking() == "http://127.0.0.1:5999"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    tracking.configure_tracking()


def test_params_flattened_truncated_and_secrets_redacted(afm_home, monkeypatch):
    monkeypatch.setenv("AFM_LLM_API_KEY", "env-secret-value-42")
    params = {
        "model": {"hidden_size": 64, "layers": 2},
        "max_new_tokens": 128,
        "tokenizer": "bpe",
        "llm": {"api_key": "plain-looking", "base_url": "http://127.0.0.1:8000/v1"},
        "hf_token": "abc",
        "note": f"key is {CANARY}",
        "mirror": "https://user:hunter2@example.invalid/x",
        "copied_env": "prefix env-secret-value-42",
        "long": "x" * 7000,
    }
    with tracking.start_run("test-params", "run-a", params, tags={"password": "p", "stage": "sft"}) as run:
        run_id = run.info.run_id
    data = MlflowClient().get_run(run_id).data
    assert data.params["model.hidden_size"] == "64" and data.params["model.layers"] == "2"
    assert data.params["max_new_tokens"] == "128" and data.params["tokenizer"] == "bpe"
    assert data.params["llm.base_url"] == "http://127.0.0.1:8000/v1"
    for key in ("llm.api_key", "hf_token", "note", "mirror", "copied_env"):
        assert data.params[key] == tracking.REDACTED, key
    assert len(data.params["long"]) == 6000
    assert data.tags["password"] == tracking.REDACTED and data.tags["stage"] == "sft"
    # The canary appears nowhere in what the store holds for this run.
    assert CANARY not in json.dumps({"p": data.params, "t": data.tags})
    assert CANARY not in (afm_home / "mlflow.db").read_bytes().decode("latin-1")


def test_metrics_dataset_figure_table(afm_home, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    store = open_store(tmp_path / "store")
    (tmp_path / "train.jsonl").write_text('{"id": 1}\n')
    manifest = store.write_artifact("datasets/coa", {"train.jsonl": tmp_path / "train.jsonl"}, kind="dataset")
    with tracking.start_run("test-logging", "run-b", {"lr": 1e-3}) as run:
        tracking.log_metrics({"loss": 2.5, "reward": {"mean": 0.5}}, step=1)
        tracking.log_metrics({"loss": 1.5}, step=2)
        tracking.log_dataset(manifest, name="coa", context="training")
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        tracking.log_figure(fig, "plots/loss.png")
        plt.close(fig)
        tracking.log_table_rows([{"id": "p1", "correct": True}], "eval/rows.json")
        run_id = run.info.run_id
    client = MlflowClient()
    assert [m.value for m in client.get_metric_history(run_id, "loss")] == [2.5, 1.5]
    assert client.get_run(run_id).data.metrics["reward.mean"] == 0.5
    inputs = client.get_run(run_id).inputs.dataset_inputs
    assert inputs[0].dataset.name == "coa" and inputs[0].dataset.digest == manifest["digest"][:36]
    assert manifest["uri"] in inputs[0].dataset.source
    assert inputs[0].tags[0].value == "training"
    artifacts = {a.path for a in client.list_artifacts(run_id, "plots")} | {
        a.path for a in client.list_artifacts(run_id, "eval")}
    assert artifacts == {"plots/loss.png", "eval/rows.json"}
    rows = json.loads(Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="eval/rows.json",
                                                                dst_path=str(tmp_path / "dl"))).read_text())
    assert rows == [{"id": "p1", "correct": True}]
    assert str(afm_home / "mlartifacts") in client.get_run(run_id).info.artifact_uri


def test_register_alias_and_resolve(afm_home, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    v1 = tracking.register_model(tiny_model_dir, "afm-tiny", tags={"stage": "sft"})
    v2 = tracking.register_model(tiny_model_dir, "afm-tiny", tags={"stage": "rl"})
    assert (v1, v2) == ("1", "2")
    tracking.set_alias("afm-tiny", "candidate", v2)
    by_alias = tracking.resolve_model_uri("models:/afm-tiny@candidate", tmp_path / "alias")
    by_version = tracking.resolve_model_uri("models:/afm-tiny/1", tmp_path / "v1")
    for local in (by_alias, by_version):
        assert (local / "config.json").is_file()
        assert AutoModelForCausalLM.from_pretrained(local).config.num_hidden_layers == 2
    assert MlflowClient().get_model_version("afm-tiny", v2).tags["stage"] == "rl"
    assert tracking.resolve_model_uri(tiny_model_dir, tmp_path / "unused") == tiny_model_dir


def test_resolve_s3_model_verifies_manifest(s3_env, tiny_model_dir, tmp_path):
    bucket = f"afm-{uuid.uuid4().hex[:8]}"
    s3_env.create_bucket(Bucket=bucket)
    files = {p.name: p for p in tiny_model_dir.iterdir()}
    open_store(f"s3://{bucket}/checkpoints").write_artifact("sft-1", files, kind="checkpoint")
    local = tracking.resolve_model_uri(f"s3://{bucket}/checkpoints/sft-1", tmp_path / "m")
    assert (local / "config.json").read_bytes() == (tiny_model_dir / "config.json").read_bytes()
    assert (local / "manifest.json").is_file()


def test_resolve_rejects_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        tracking.resolve_model_uri(tmp_path / "nope", tmp_path / "dst")


def test_default_store_follows_afm_home(afm_home, tmp_path, monkeypatch):
    """Configuring the local default does not pin it: a later AFM_HOME gets its own store."""
    tracking.configure_tracking()
    monkeypatch.setenv("AFM_HOME", str(tmp_path / "other"))
    assert tracking.configure_tracking() == f"sqlite:///{tmp_path / 'other' / 'mlflow.db'}"
    monkeypatch.setenv("AFM_HOME", str(afm_home))
    tracking.configure_tracking()
