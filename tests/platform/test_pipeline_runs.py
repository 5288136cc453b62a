"""Pipeline runs you can compare (#25): a `pipeline` parent run per pipeline, the stages' runs nested under it
in its experiment (also when opened by another thread, as Prefect tasks may), with their store datasets as
inputs; the parent carries the headline metrics under stable names, so two pipeline runs compare on the
parent alone; experiments are tagged for MLflow's model-training view. On the real local SQLite store.
The whole pipeline through the CLI is covered by tests/flows/test_pipeline.py."""
from __future__ import annotations

import threading

import pytest
from mlflow.tracking import MlflowClient

from afm import tracking
from flows.pipeline import PIPELINE_EXPERIMENT
from flows.pipeline_metrics import StageClock, headline_metrics


@pytest.fixture
def afm_home(tmp_path, monkeypatch):
    monkeypatch.setenv("AFM_HOME", str(tmp_path / "afm"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "afm"


def stage_outputs(accuracy: float, reward_last: float) -> tuple[dict, dict, dict]:
    """SFT and RL manifests' extra and the evaluate flow's result, as the pipeline's stages return them."""
    sft = {"extra": {"final_loss": 1.25, "model_version": "1"}}
    rl = {"extra": {"reward_first": 0.1, "reward_last": reward_last, "history": [{"reward_mean": reward_last}]}}
    report = {"summary": [{"model": "rl", "set": "heldout", "accuracy": accuracy, "em": 0.5, "pass@1": accuracy,
                           "pass@3": None, "tokens/problem": 80.0},
                          {"model": "sft", "set": "computation", "accuracy": 0.25, "pass@1": 0.25}],
              "efficiency": [{"model": "rl", "tokens_per_solved": 61.5}, {"model": "sft", "tokens_per_solved": None}]}
    return sft, rl, report


def fake_pipeline(name: str, accuracy: float, reward_last: float, dataset: dict) -> str:
    """The pipeline's tracking calls in order, with stage runs opened on worker threads like Prefect tasks."""
    clock = StageClock()
    with tracking.parent_run(PIPELINE_EXPERIMENT, name, params={"sft": {"lr": 1e-3}},
                             tags={"afm.stage": "pipeline"}) as run_id:
        for stage in ("sft", "rl"):
            def stage_job(stage=stage):
                with tracking.stage_scope(run_id, [dataset]), \
                        tracking.start_run(stage, f"{stage}-run", params={"stage": stage}, tags={"afm.stage": stage}):
                    tracking.log_metrics({"loss": 1.0}, step=1)
            worker = threading.Thread(target=stage_job)
            worker.start()
            worker.join()
            clock.lap(stage)
        tracking.log_run_metrics(run_id, headline_metrics(*stage_outputs(accuracy, reward_last), clock.seconds))
    return run_id


def test_two_pipeline_runs_compare_on_the_parent_with_nested_stages(afm_home, tmp_path):
    data = tmp_path / "rl_problems.jsonl"
    data.write_text('{"id": "p1"}\n')
    dataset = {"uri": data.as_uri(), "digest": "ab" * 32, "name": "distill-k/rl_problems.jsonl", "context": "training"}
    last_night = fake_pipeline("pipeline", 0.5, 0.4, dataset)
    tonight = fake_pipeline("pipeline", 0.75, 0.6, dataset)

    client = MlflowClient()
    experiment = client.get_experiment_by_name(PIPELINE_EXPERIMENT)
    parents = client.search_runs([experiment.experiment_id], "tags.`afm.stage` = 'pipeline'",
                                 order_by=["attributes.start_time ASC"])
    assert [r.info.run_id for r in parents] == [last_night, tonight]
    assert all(r.info.status == "FINISHED" for r in parents)
    # Side by side on the same names: the comparison MLflow's "Compare" view makes.
    for name in ("eval.rl.heldout.accuracy", "eval.rl.heldout.pass_at_1", "rl.reward_first", "rl.reward_last",
                 "sft.final_loss", "eval.rl.tokens_per_solved", "eval.sft.computation.accuracy", "seconds.sft"):
        assert all(name in r.data.metrics for r in parents), name
    assert [r.data.metrics["eval.rl.heldout.accuracy"] for r in parents] == [0.5, 0.75]
    assert [r.data.metrics["rl.reward_last"] for r in parents] == [0.4, 0.6]
    assert "eval.rl.heldout.pass_at_3" not in parents[0].data.metrics, "no NaN for a value not produced"
    assert "eval.sft.tokens_per_solved" not in parents[0].data.metrics

    # Each parent lists its stages as nested runs of the same experiment, each with its store dataset.
    for parent in (last_night, tonight):
        children = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
        assert sorted(c.data.tags["afm.stage"] for c in children) == ["rl", "sft"]
        for child in children:
            (logged,) = child.inputs.dataset_inputs
            assert logged.dataset.source_type == "local" and data.as_uri() in logged.dataset.source
    # Experiments open in MLflow's model-training view.
    assert experiment.tags[tracking.EXPERIMENT_KIND_TAG] == tracking.EXPERIMENT_KIND


def test_a_failed_pipeline_leaves_a_failed_parent(afm_home):
    with pytest.raises(RuntimeError, match="stage broke"):
        with tracking.parent_run(PIPELINE_EXPERIMENT, "pipeline", params={}) as run_id:
            raise RuntimeError("stage broke")
    assert MlflowClient().get_run(run_id).info.status == "FAILED"


def test_a_parent_whose_params_fail_to_log_ends_failed(afm_home):
    class Unprintable:  # sanitize_params str()s every value; a real run raised here (os.environ changed meanwhile)
        def __str__(self) -> str:
            raise RuntimeError("cannot log")

    with pytest.raises(RuntimeError, match="cannot log"):
        with tracking.parent_run(PIPELINE_EXPERIMENT, "pipeline", params={"x": Unprintable()}):
            pass
    experiment = MlflowClient().get_experiment_by_name(PIPELINE_EXPERIMENT).experiment_id
    assert [run.info.status for run in MlflowClient().search_runs([experiment])] == ["FAILED"]
