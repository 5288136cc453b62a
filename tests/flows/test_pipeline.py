"""The pipeline end to end through the real CLI on the smallest recipe: every stage runs for real (pretraining
included); after a failure in the middle stage (SFT, here given a dataset file its artifact does not have) a
re-run resumes: distill, the base policy and the pretrained base come from their manifests and are not redone.

The pipeline runs in subprocesses (as `make run` does), so the Ray and Ray Train sessions it starts never
leak into the test process. The two runs are the session's `smoke_pipeline` fixture (tests/smoke_pipeline.py),
which tests/reliability/test_secrets.py scans too."""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_cli(afm_home, args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "AFM_STORE_URI", "RAY_ADDRESS",
                                                              "PREFECT_API_URL")}
    env["AFM_HOME"] = str(afm_home)
    return subprocess.run([sys.executable, "-m", "cli", *args], env=env, capture_output=True, text=True, timeout=1200)


def summary_field(output: str, name: str) -> str:
    """A field of the "Pipeline finished:" summary (printed through Prefect's logger, i.e. on stderr)."""
    line = next(line for line in output.splitlines() if line.strip().startswith(f"{name}:"))
    return line.split(":", 1)[1].strip()


def test_pipeline_resumes_after_failure_in_middle_stage(smoke_pipeline):
    runs = smoke_pipeline  # the session's smoke runs (tests/smoke_pipeline.py): SFT fails, then the re-run resumes
    home = runs.home
    assert runs.failed.returncode != 0
    assert "missing.jsonl" in runs.failed.output
    done = sorted(name.split("-")[0] for name, complete in runs.stages_after_failure.items() if complete)
    assert done == ["distill", "policy", "pretrain"], "only the stages before the failure are complete"
    assert not [name for name in runs.stages_after_failure if name.startswith("sft-")], \
        "a failed stage leaves no artifact"
    stages = home / "artifacts" / "stages"

    resumed = runs.resumed
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert ast.literal_eval(summary_field(resumed.output, "stages")) == {
        "distill": "cached", "sft": "ran", "rl": "ran", "eval": "ran"}
    assert next(stages.glob("distill-*/manifest.json")).read_bytes() == runs.distill_manifest_after_failure, \
        "distill was redone"
    assert ast.literal_eval(summary_field(resumed.output, "registered")) == {
        "sft": "models:/afm-sft/1", "rl": "models:/afm-rl/1"}
    assert ast.literal_eval(summary_field(resumed.output, "promotion"))["alias"] == "champion"
    assert "/artifacts/stages/pretrain-" in summary_field(resumed.output, "pretrained")
    for stage in ("distill", "policy", "pretrain", "sft", "rl", "eval"):
        assert len(list(stages.glob(f"{stage}-*/manifest.json"))) == 1, stage
    check_pipeline_runs(home, summary_field(resumed.output, "pipeline_run"))
    chain = run_cli(home, ["lineage", "models:/afm-rl/1"])
    assert chain.returncode == 0, chain.stderr[-2000:]
    assert "models:/afm-sft/1" in chain.stdout and "models:/afm-base/1" in chain.stdout, "RL -> SFT -> base"


def check_pipeline_runs(home, run_id: str) -> None:
    """The MLflow side (#25, #21): the failed and the resumed pipeline are two parent runs; the resumed one
    carries the headline metrics and lists the stages it ran as nested runs, each with its store datasets;
    the policies' weights are in the stage store only."""
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow.db'}")
    client = MlflowClient()
    experiment = client.get_experiment_by_name("pipeline")
    parents = client.search_runs([experiment.experiment_id], "tags.`afm.stage` = 'pipeline'",
                                 order_by=["attributes.start_time ASC"])
    assert [(r.info.status, r.info.run_id == run_id) for r in parents] == [("FAILED", False), ("FINISHED", True)]
    metrics = parents[1].data.metrics
    for name in ("eval.rl.heldout.accuracy", "eval.rl.heldout.pass_at_1", "eval.sft.train_entities.accuracy",
                 "eval.rl.computation.accuracy", "pretrain.final_loss", "sft.final_loss", "rl.reward_first", "rl.reward_last",
                 "seconds.sft", "seconds.total"):
        assert name in metrics, name
    children = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{run_id}'")
    assert sorted(c.data.tags["afm.stage"] for c in children) == ["eval", "rl", "sft"]
    for child in children:
        sources = [d.dataset.source for d in child.inputs.dataset_inputs]
        assert sources and all("/artifacts/stages/distill-" in s for s in sources), (child.info.run_name, sources)
    assert not list((home / "mlartifacts").rglob("model.safetensors")), "a policy copy in MLflow's artifacts"
    for stage in ("sft", "rl"):  # the trained policies' exports are removed once stored
        assert not list((home / "work").glob(f"{stage}-*/**/model.safetensors")), f"a {stage} copy in work/"
