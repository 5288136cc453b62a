"""End to end: a tiny 2-layer policy and the oracle teacher on generated computation problems, records, table,
plots, MLflow run, and the promotion gate against a real sqlite registry (same weights twice -> tie)."""
from __future__ import annotations

import json

import mlflow
import pytest
import torch

from afm import tracking
from agents.tools.toolbox import ToolboxConfig
from evaluation.promotion import CHALLENGER, CHAMPION
from evaluation.records import read_records
from evaluation.report import format_summary_table
from evaluation.runner import EvalConfig, GateConfig, ProblemSetConfig, evaluate
from evaluation.unseen_tools import evaluate_unseen_tool
from models.tiny import TinyModelConfig, create_default_policy
from problems.computation import computation_problems
from problems.records import write_problems
from problems.world import WorldConfig, generate_world, multihop_problems, world_corpus


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    torch.set_num_threads(1)
    texts = [p.question for p in computation_problems(20)] + ["<code>```python\nprint(1)\n```</code><answer>3</answer>"]
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    return create_default_policy(tmp_path_factory.mktemp("policy"), texts, cfg, vocab_size=400)


def eval_config(tmp_path, models, gate=None, include_teacher=True, extra_sets=None, toolbox=None,
                experiment="eval-gate"):
    return EvalConfig(
        models=models, include_teacher=include_teacher, gate=gate, mlflow_experiment=experiment,
        problem_sets={"computation": ProblemSetConfig(source="computation", size=2), **(extra_sets or {})},
        n_samples=2, ks=[1, 2], max_turns=2, max_new_tokens=8, token_budget=48,
        toolbox=toolbox or ToolboxConfig(tools=["code"], code_timeout_s=10), output_dir=str(tmp_path / "eval"),
    )


def heldout_multihop_files(tmp_path):
    """A held-out-entity world: its problems as a Problem JSONL and its search corpus."""
    world = generate_world(WorldConfig(), seed=5, split="heldout")
    problems_path, corpus_path = tmp_path / "multihop.jsonl", tmp_path / "corpus.jsonl"
    write_problems(problems_path, multihop_problems(world, n=2, hops=(1, 2), split="heldout"))
    corpus_path.write_text("".join(json.dumps(doc) + "\n" for doc in world_corpus([world])))
    return problems_path, corpus_path


def test_evaluate_teacher_and_model(tmp_path, tiny_policy, local_registry):
    problems_path, corpus_path = heldout_multihop_files(tmp_path)
    sets = {"multihop": ProblemSetConfig(source=str(problems_path), size=2),
            "humaneval": ProblemSetConfig(source="humaneval", size=1)}
    toolbox = ToolboxConfig(tools=["web_search", "code"], corpus_path=corpus_path, code_timeout_s=10)
    result = evaluate(eval_config(tmp_path, {"untrained": str(tiny_policy)}, extra_sets=sets, toolbox=toolbox,
                                  experiment="eval-e2e"))
    records = read_records(result.per_problem_path)
    # teacher: 2 computation + 2 multihop problems (the oracle cannot do HumanEval); model: all 5; 2 samples each
    assert len(records) == (4 + 5) * 2
    teacher = [r for r in records if r.model == "teacher"]
    assert {r.problem_set for r in teacher} == {"computation", "multihop"}
    assert all(r.tokens > 0 for r in teacher) and {r.sample for r in teacher} == {0, 1}
    assert any(r.correct for r in teacher if r.problem_set == "multihop")
    assert [(r["model"], r["set"]) for r in result.summary_rows] == [     # models side by side per set
        ("teacher", "computation"), ("untrained", "computation"), ("teacher", "multihop"),
        ("untrained", "multihop"), ("untrained", "humaneval")]
    assert result.efficiency_rows[0]["model"] == "untrained"
    assert all(p.exists() for p in result.plots) and len(result.plots) == 3
    assert "untrained" in format_summary_table(result.summary_rows, result.efficiency_rows)
    (run,) = mlflow.search_runs(experiment_names=["eval-e2e"], output_format="list")
    assert "teacher.computation.pass_at_2" in run.data.metrics
    assert run.data.metrics["teacher.computation.accuracy"] == result.summary_rows[0]["accuracy"]


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


def test_unseen_tool_evaluation_end_to_end(tmp_path, tiny_policy, local_registry):
    cfg = eval_config(tmp_path, {"untrained": str(tiny_policy)}, include_teacher=False, experiment="eval-unseen")
    rows = evaluate_unseen_tool(cfg)
    assert [(r["model"], r["set"], r["episodes"]) for r in rows] == [("untrained", "computation", 4)]
    # An untrained model never calls the calculator: the rates are measured, and they are zero.
    assert rows[0]["first_try_format_ok"] == 0.0 and rows[0]["calculator_use_rate"] == 0.0
    assert len(read_records(tmp_path / "eval" / "unseen_tool.jsonl")) == 4
    (run,) = mlflow.search_runs(experiment_names=["eval-unseen"], output_format="list")
    assert run.data.params["tool"] == "calculator"
    assert "untrained.computation.unseen_tool.first_try_format_ok" in run.data.metrics


def test_models_of_one_architecture_share_one_pool_and_give_the_records_of_their_own(tmp_path, tiny_policy,
                                                                                     local_registry, monkeypatch):
    """The second model of the same architecture is swapped into the first one's pool (no new rollout actors)
    and its records are exactly what a fresh pool gives it; another architecture gets a new pool."""
    import evaluation.runner as runner
    from models.policy import load_policy, save_policy
    from training.rl_pool import same_architecture

    model, tokenizer = load_policy(tiny_policy)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    other = save_policy(model, tokenizer, tmp_path / "other")
    wider_cfg = TinyModelConfig(hidden_size=48, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    texts = [p.question for p in computation_problems(20)] + ["<code>```python\nprint(1)\n```</code><answer>3</answer>"]
    wider = create_default_policy(tmp_path / "wider", texts, wider_cfg, vocab_size=400)
    assert same_architecture(tiny_policy, other) and not same_architecture(tiny_policy, wider)

    created = []

    class CountingPool(runner.RolloutPool):
        def __init__(self, *args, **kwargs):
            created.append(args[1])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(runner, "RolloutPool", CountingPool)
    together = evaluate(eval_config(tmp_path / "together", {"a": str(tiny_policy), "b": str(other), "w": str(wider)},
                                    include_teacher=False))
    assert len(created) == 2, created  # one pool for a and b, a new one for the wider model
    alone = evaluate(eval_config(tmp_path / "alone", {"b": str(other)}, include_teacher=False))

    def episodes(result, label):
        return [(r.problem_id, r.sample, r.transcript, r.tokens) for r in result.records if r.model == label]
    assert episodes(together, "b") == episodes(alone, "b")
    assert episodes(together, "a") != episodes(together, "b")  # the swap changed what the engine generates
