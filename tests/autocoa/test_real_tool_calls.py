"""Real tool calls counted apart from simulated ones (training/rl_rollout.py's rollout_stats) and the RL run's total
real calls and wall time (training/rl_trainer.py: MLflow metrics and RLResult), which #23 compares between
simulated-then-real and all-real RL.

    .venv/bin/python -m pytest tests/autocoa/test_real_tool_calls.py -q            # the rollout part: seconds
    .venv/bin/python -m pytest tests/autocoa/test_real_tool_calls.py -q -m slow    # + two 1-step RL runs on Ray
"""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.autocoa.test_simulated_rollout import PROBLEMS, RefusingToolbox, ScriptedEngine
from tests.rl.conftest import addition_problems_path, addition_tokenizer, sft_policy_dir, tiny_cfg  # noqa: F401
from training.rl_rollout import RolloutConfig, rollout_stats, run_rollouts


def test_simulated_calls_are_not_real_ones(tokenizer, toolbox):
    cfg = RolloutConfig(group_size=2, token_budget=200)
    real = rollout_stats(run_rollouts(ScriptedEngine(tokenizer), tokenizer, toolbox, PROBLEMS, cfg, seed=0))
    simulated = rollout_stats(run_rollouts(ScriptedEngine(tokenizer), tokenizer, RefusingToolbox(), PROBLEMS,
                                           cfg.model_copy(update={"simulated_env": True}), seed=0))
    # the same policy behaviour: one search per episode, 4 episodes; only the real environment ran the tool
    assert real.tool_calls_per_episode == simulated.tool_calls_per_episode == 1.0
    assert real.real_tool_calls == 4 and real.real_tool_calls_per_episode == 1.0
    assert simulated.real_tool_calls == 0 and simulated.real_tool_calls_per_episode == 0.0


@pytest.mark.slow
def test_rl_run_reports_its_real_tool_calls_and_wall_time(tmp_path, monkeypatch, sft_policy_dir,  # noqa: F811
                                                          addition_problems_path):  # noqa: F811
    from agents.tools.toolbox import ToolboxConfig
    from training.rl_trainer import RLConfig, train_rl

    monkeypatch.setenv("AFM_HOME", str(tmp_path / "afm_home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = {}
    for simulated in (False, True):
        cfg = RLConfig(policy=str(sft_policy_dir), problems_path=str(addition_problems_path),
                       output_dir=str(tmp_path / f"rl-{simulated}"), steps=1, prompts_per_step=2, seed=2,
                       rollout=RolloutConfig(group_size=2, max_turns=3, max_new_tokens=40, token_budget=200,
                                             simulated_env=simulated),
                       toolbox=ToolboxConfig(tools=["code"], code_timeout_s=5), checkpoint_every=1,
                       mlflow_experiment="rl-test", registered_model_name="afm-rl-calls-test")
        results[simulated] = train_rl(cfg)
    real, sim = results[False], results[True]
    assert real.real_tool_calls == sum(h["real_tool_calls"] for h in real.history) > 0
    assert sim.real_tool_calls == 0 and sim.history[0]["tool_calls_per_episode"] > 0  # it acted, nothing ran
    for result in (real, sim):
        assert result.wall_s > 0
        metrics = MlflowClient().get_run(result.run_id).data.metrics
        assert metrics["total_real_tool_calls"] == result.real_tool_calls
        assert metrics["wall_s"] == pytest.approx(result.wall_s)
