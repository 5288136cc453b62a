"""End to end: a tiny 2-layer policy and the oracle teacher on generated computation problems, records, table,
plots, MLflow run, and the promotion gate against a real sqlite registry (same weights twice -> tie)."""
from __future__ import annotations

import mlflow
import pytest
import torch

from afm import tracking
from agents.tools.toolbox import ToolboxConfig
from evaluation.promotion import CHALLENGER, CHAMPION
from evaluation.records import read_records
from evaluation.report import format_summary_table
from evaluation.runner import EvalConfig, GateConfig, ProblemSetConfig, evaluate
from models.tiny import TinyModelConfig, create_default_policy
from problems.computation import computation_problems


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    torch.set_num_threads(1)
    texts = [p.question for p in computation_problems(20)] + ["<code>```python\nprint(1)\n```</code><answer>3</answer>"]
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    return create_default_policy(tmp_path_factory.mktemp("policy"), texts, cfg, vocab_size=400)


def eval_config(tmp_path, models, gate=None, include_teacher=True):
    return EvalConfig(
        models=models, include_teacher=include_teacher, gate=gate,
        problem_sets={"computation": ProblemSetConfig(source="computation", size=2)},
        n_samples=2, ks=[1, 2], max_turns=2, max_new_tokens=8, token_budget=48,
        toolbox=ToolboxConfig(tools=["code"], code_timeout_s=10), output_dir=str(tmp_path / "eval"),
    )


@pytest.mark.slow
def test_evaluate_teacher_and_model(tmp_path, tiny_policy, local_registry):
    result = evaluate(eval_config(tmp_path, {"untrained": str(tiny_policy)}))
    records = read_records(result.per_problem_path)
    assert len(records) == 2 * 2 * 2                        # (teacher + model) x 2 problems x 2 samples
    teacher = [r for r in records if r.model == "teacher"]
    assert all(r.tokens > 0 for r in teacher) and {r.sample for r in teacher} == {0, 1}
    assert [r["model"] for r in result.summary_rows] == ["teacher", "untrained"]
    assert result.efficiency_rows[0]["model"] == "untrained"
    assert all(p.exists() for p in result.plots) and len(result.plots) == 3
    assert "untrained" in format_summary_table(result.summary_rows, result.efficiency_rows)
    run = mlflow.search_runs(experiment_names=["eval"], output_format="list")[0]
    assert "teacher.computation.pass_at_2" in run.data.metrics
    assert run.data.metrics["teacher.computation.accuracy"] == result.summary_rows[0]["accuracy"]


@pytest.mark.slow
def test_gate_promotes_first_then_tie_is_challenger(tmp_path, tiny_policy, local_registry):
    v1 = tracking.register_model(tiny_policy, "afm-gate", tags={})
    first = evaluate(eval_config(tmp_path / "a", {"cand": f"models:/afm-gate/{v1}"}, include_teacher=False,
                                 gate=GateConfig(candidate="cand", problem_set="computation", margin=0.0)))
    assert first.promotion.alias == CHAMPION and first.promotion.champion_score is None
    v2 = tracking.register_model(tiny_policy, "afm-gate", tags={})
    second = evaluate(eval_config(tmp_path / "b", {"cand": f"models:/afm-gate/{v2}"}, include_teacher=False,
                                  gate=GateConfig(candidate="cand", problem_set="computation", margin=0.0)))
    assert second.promotion.alias == CHALLENGER and second.promotion.reason == "ties the champion"
    assert {r.model for r in second.records} == {"cand", "champion"}   # the champion was re-evaluated
    client = mlflow.tracking.MlflowClient()
    assert str(client.get_model_version_by_alias("afm-gate", CHAMPION).version) == v1
    assert client.get_model_version("afm-gate", v2).tags["afm.promotion.champion_version"] == v1
    again = evaluate(eval_config(tmp_path / "c", {"cand": "afm-gate@champion"}, include_teacher=False,
                                 gate=GateConfig(candidate="cand", problem_set="computation", margin=0.0)))
    assert again.promotion.alias == CHAMPION and again.promotion.reason == "is the current champion"
