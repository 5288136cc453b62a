"""The final policy is stored once (#21): a model stage stores it as its own artifact, in a local store or on
S3 (moto), and registers an MLflow 3 logged model linked to the run whose version points at that copy; nothing
of the weights lands under MLflow's artifact root, and loading the registered version gives the same bytes.
Without a stage (a bare `register_model`), MLflow's artifact store holds the one copy instead.

The stage is the real `tasks.train._model_artifact` with a training function that opens a real run and
registers a real (random) Qwen2 checkpoint, as train_sft/train_rl do at their end."""
from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from afm import tracking
from afm.lineage import TAG_PARENT_RUN_ID, lineage_tags, model_run_id
from tasks.train import _model_artifact

WEIGHTS = "model.safetensors"


def make_tiny_model(out: Path) -> Path:
    """A real 2-layer Qwen2 checkpoint directory (random weights), as save_pretrained writes it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "policy")


def weight_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name in (WEIGHTS, "config.json")]


def train_like_a_trainer(model_dir: Path, name: str, parent_model: str = ""):
    """What train_sft / train_rl do around their job: one run, the policy registered at its end."""
    def train(work_dir: Path) -> dict:
        policy = work_dir / "policy"
        shutil.copytree(model_dir, policy, dirs_exist_ok=True)
        with tracking.start_run("sft", f"{name}-run", params={"lr": 1e-3}) as run:
            tags = lineage_tags("sft", run.info.run_id, parent_model, model_run_id(parent_model) if parent_model
                                else "", "file:///data", "0" * 64)
            version = tracking.register_model(policy, name, tags=tags)
        return {"policy_dir": str(policy), "run_id": run.info.run_id, "model_version": version}
    return train


def check_stored_once(afm_home, store_uri: str, manifest: dict, name: str, tiny_model_dir: Path, tmp_path: Path):
    client = MlflowClient()
    version = manifest["extra"]["model_version"]
    mv = client.get_model_version(name, version)
    assert mv.source == manifest["uri"], "the version points at the stage's artifact"
    assert WEIGHTS in manifest["files"] and "config.json" in manifest["files"]
    # One copy: MLflow's artifact root holds no weights (only the external model's MLmodel stub), and the
    # trainer's export in the stage's work dir is gone once stored.
    assert weight_files(afm_home / "mlartifacts") == [] and weight_files(afm_home / "work") == []
    # A logged model linked to its run (the runs table's Models column) records where the files are.
    run = client.get_run(manifest["extra"]["run_id"])
    (output,) = run.outputs.model_outputs
    logged = client.get_logged_model(output.model_id)
    assert logged.source_run_id == run.info.run_id and logged.tags[tracking.TAG_STORAGE_URI] == manifest["uri"]
    assert json.loads(logged.tags["mlflow.modelVersions"]) == [{"name": name, "version": version}]
    loaded = tracking.resolve_model_uri(f"models:/{name}/{version}", tmp_path / "loaded")
    assert (loaded / WEIGHTS).read_bytes() == (tiny_model_dir / WEIGHTS).read_bytes()
    return loaded


def test_local_stage_stores_the_policy_once(afm_home, tiny_model_dir, tmp_path):
    store = str(tmp_path / "artifacts")
    manifest = _model_artifact("sft", "k1", store, train_like_a_trainer(tiny_model_dir, "once-local"))
    loaded = check_stored_once(afm_home, store, manifest, "once-local", tiny_model_dir, tmp_path)
    assert loaded == tmp_path / "artifacts" / "stages" / "sft-k1", "a local store's copy is used in place"
    assert len(weight_files(tmp_path)) == 2, "config + weights, once, in the store"


def test_s3_stage_stores_the_policy_once_and_lineage_links_runs(afm_home, s3_env, tiny_model_dir, tmp_path):
    bucket = f"afm-{uuid.uuid4().hex[:8]}"
    s3_env.create_bucket(Bucket=bucket)
    store = f"s3://{bucket}/artifacts"
    sft = _model_artifact("sft", "k2", store, train_like_a_trainer(tiny_model_dir, "once-s3"))
    check_stored_once(afm_home, store, sft, "once-s3", tiny_model_dir, tmp_path / "sft")
    keys = [o["Key"] for o in s3_env.list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(k for k in keys if k.endswith(WEIGHTS)) == [f"artifacts/stages/sft-k2/{WEIGHTS}"]
    # A model trained from the registered version names the run that produced its parent.
    parent = f"models:/once-s3/{sft['extra']['model_version']}"
    rl = _model_artifact("rl", "k3", store, train_like_a_trainer(tiny_model_dir, "once-s3-rl", parent))
    mv = MlflowClient().get_model_version("once-s3-rl", rl["extra"]["model_version"])
    assert mv.tags[TAG_PARENT_RUN_ID] == sft["extra"]["run_id"]


def test_without_a_stage_mlflow_holds_the_one_copy(afm_home, tiny_model_dir, tmp_path):
    with tracking.start_run("bare", "bare-run", params={}) as run:
        version = tracking.register_model(tiny_model_dir, "once-bare", tags={})
    client = MlflowClient()
    assert client.list_artifacts(run.info.run_id) == [], "nothing logged as run artifacts"
    (output,) = client.get_run(run.info.run_id).outputs.model_outputs
    assert client.get_model_version("once-bare", version).source == f"models:/{output.model_id}"
    loaded = tracking.resolve_model_uri(f"models:/once-bare/{version}", tmp_path / "loaded")
    assert (loaded / WEIGHTS).read_bytes() == (tiny_model_dir / WEIGHTS).read_bytes()
    assert len([p for p in weight_files(afm_home / "mlartifacts") if p.name == WEIGHTS]) == 1
