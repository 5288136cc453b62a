"""An SFT stage leaves the policy in the store and nothing else of its weights: its Ray Train checkpoints (the
last one is the final weights again, fp32 + AdamW) and tokenized rows go once the policy is registered (#21).

The real `tasks.train.sft_task` on Ray Train (2 CPU workers, FSDP2, local store); then `discard_run_state` on
S3 (moto) deletes one run's checkpoints and leaves the other runs under the same checkpoint_uri.

    .venv/bin/pytest -q tests/platform/test_sft_run_state.py      # ~1 min (Ray start + a 4-step SFT)
"""
from __future__ import annotations

import uuid

import pytest
from mlflow.tracking import MlflowClient

from models.format import render_segments, write_jsonl
from models.policy import save_policy
from models.tiny import TinyModelConfig, build_tiny_model
from models.tokenizer import train_tokenizer
from training.sft_ray import discard_run_state, ray_run_name
from training.sft_trainer import SFTConfig
from training.synthetic_coa import synthetic_trajectories

WEIGHT_SUFFIXES = (".safetensors", ".distcp", ".arrow")


@pytest.fixture
def ray_cluster(monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    from afm.ray_local import init_local_ray

    init_local_ray(num_cpus=2)
    yield
    ray.shutdown()


def sft_config(tmp_path) -> SFTConfig:
    trajectories = synthetic_trajectories(32, seed=0)
    tok = train_tokenizer([t.question + render_segments(t.segments) for t in trajectories], vocab_size=400)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                                             intermediate_size=64, max_position_embeddings=256, seed=0), tok)
    write_jsonl(tmp_path / "train.jsonl", trajectories)
    return SFTConfig(model_path=str(save_policy(model, tok, tmp_path / "base")), dataset=str(tmp_path / "train.jsonl"),
                     max_len=256, micro_batch=1, max_steps=4, checkpoint_every=2, report_every=100, num_workers=2,
                     parallelism="fsdp", log_system_metrics=False, registered_model_name="afm-sft-run-state")


@pytest.mark.integration
@pytest.mark.slow
def test_sft_stage_keeps_only_the_stored_policy(afm_home, ray_cluster, tmp_path):
    from tasks.train import sft_task

    store = tmp_path / "artifacts"
    manifest = sft_task.fn(sft_config(tmp_path), store_uri=str(store))
    assert manifest["extra"]["steps"] == 4 and not manifest["cached"]
    # The policy's one copy is the stage's artifact, and the registered version points at it.
    version = MlflowClient().get_model_version("afm-sft-run-state", manifest["extra"]["model_version"])
    assert version.source == manifest["uri"] and "model.safetensors" in manifest["files"]
    stored = [p for p in store.rglob("*") if p.name.endswith(WEIGHT_SUFFIXES)]
    # ... beside the tokenized rows: the tokenize step's one artifact (rows/<key>/rows.arrow), reused by later jobs
    assert sorted(p.name for p in stored) == ["model.safetensors", "rows.arrow"]
    assert [p.relative_to(store).parts[0] for p in stored if p.name == "rows.arrow"] == ["rows"]
    # The job's work dir kept no checkpoint shards (Ray Train's storage under it), rows or policy export.
    work = afm_home / "work"
    assert work.is_dir() and not [p for p in work.rglob("*") if p.name.endswith(WEIGHT_SUFFIXES)]
    assert not [p for p in afm_home.rglob("*") if p.name.endswith(WEIGHT_SUFFIXES)]


def test_discard_run_state_on_s3_deletes_that_run_only(s3_env, tmp_path):
    bucket = f"afm-{uuid.uuid4().hex[:8]}"
    s3_env.create_bucket(Bucket=bucket)
    cfg = SFTConfig(checkpoint_uri=f"s3://{bucket}/ray-checkpoints", output_dir=str(tmp_path / "run"))
    run, other = ray_run_name(cfg, "a" * 32), ray_run_name(cfg, "b" * 32)
    keys = [f"ray-checkpoints/{name}/checkpoint_{step}/__{rank}_0.distcp"
            for name in (run, other) for step in (2, 4) for rank in (0, 1)]
    for key in keys:
        s3_env.put_object(Bucket=bucket, Key=key, Body=b"shard")
    rows = tmp_path / "run" / "rows" / "rows-0123.arrow"
    rows.parent.mkdir(parents=True)
    rows.write_bytes(b"rows")

    discard_run_state(cfg, "a" * 32)
    left = sorted(o["Key"] for o in s3_env.list_objects_v2(Bucket=bucket).get("Contents", []))
    # pyarrow leaves an empty `ray-checkpoints/` marker so the parent "directory" still exists.
    assert [k for k in left if not k.endswith("/")] == sorted(k for k in keys if f"/{other}/" in k)
    assert not rows.parent.exists()
