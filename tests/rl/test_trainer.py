"""End-to-end RL on the tiny SFT'd policy: a real step changes the weights and logs to MLflow; exact resume."""
from __future__ import annotations

import shutil

import pytest
import torch
from mlflow.tracking import MlflowClient

from agents.tools.toolbox import ToolboxConfig
from models.policy import load_policy
from training.rl_rollout import RolloutConfig
from training.rl_trainer import RLConfig, train_rl

pytestmark = pytest.mark.slow


@pytest.fixture()
def afm_home(tmp_path, monkeypatch):
    monkeypatch.setenv("AFM_HOME", str(tmp_path / "afm_home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "afm_home"


def rl_config(policy, problems, out, steps, tool_cache=None) -> RLConfig:
    return RLConfig(
        policy=str(policy), problems_path=str(problems), output_dir=str(out), steps=steps, prompts_per_step=3,
        rollout=RolloutConfig(group_size=4, max_turns=3, max_new_tokens=40, token_budget=200),
        toolbox=ToolboxConfig(tools=["code"], code_timeout_s=5, cache_dir=tool_cache), lr=1e-3, checkpoint_every=1, seed=2,
        mlflow_experiment="rl-test", registered_model_name="afm-rl-test",
    )


def _weights(path):
    model, _ = load_policy(path)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_one_rl_step_changes_weights_and_logs_to_mlflow(afm_home, tmp_path, sft_policy_dir, addition_problems_path):
    result = train_rl(rl_config(sft_policy_dir, addition_problems_path, tmp_path / "rl", steps=1))
    metrics = result.history[0]
    assert metrics["groups_kept"] >= 1, "the seeded step must contain a group with mixed rewards"
    before, after = _weights(sft_policy_dir), _weights(result.model_dir)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # Token-in/token-out: the learner's recomputed logprobs match what the sampler reported.
    assert metrics["rollout_logprob_abs_diff"] < 1e-4
    for key in ("reward_mean", "reward_std", "accuracy", "clip_fraction", "entropy", "tool_calls_per_episode",
                "time_generation_s", "time_tools_s", "time_training_s", "response_tokens_mean"):
        assert key in metrics
    client = MlflowClient()
    run = client.get_run(result.run_id)
    assert run.data.metrics["reward_mean"] == pytest.approx(metrics["reward_mean"])
    artifacts = {a.path for a in client.list_artifacts(result.run_id)}
    # The policy is the run's logged model (its one copy), not a second copy among the run's artifacts.
    assert "reward_curve.png" in artifacts and "model" not in artifacts
    (output,) = run.outputs.model_outputs
    assert client.get_logged_model(output.model_id).source_run_id == result.run_id
    assert result.model_version == "1"
    assert (afm_home / "mlflow.db").exists()


def test_resume_gives_the_same_weights_as_straight_training(afm_home, tmp_path, sft_policy_dir, addition_problems_path):
    # A shared tool cache: tracebacks from the sandbox name a random temp dir, so without it a tool
    # observation (and hence the rollout) could differ between the two runs for reasons outside the trainer.
    cache = tmp_path / "tool-cache"
    straight = train_rl(rl_config(sft_policy_dir, addition_problems_path, tmp_path / "straight", 2, cache))
    first = train_rl(rl_config(sft_policy_dir, addition_problems_path, tmp_path / "resumed", 1, cache))
    assert list((tmp_path / "resumed" / "ray" / "rl").glob("checkpoint_*/trainer_state.json"))
    resumed = train_rl(rl_config(sft_policy_dir, addition_problems_path, tmp_path / "resumed", 2, cache))
    assert [h["step"] for h in resumed.history] == [0, 1]
    assert resumed.history[1]["reward_mean"] == straight.history[1]["reward_mean"]
    assert sum(h["groups_kept"] for h in straight.history) >= 1
    a, b = _weights(straight.model_dir), _weights(resumed.model_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert first.model_version != resumed.model_version


def test_one_step_off_policy_trains_on_episodes_of_the_previous_weights(afm_home, tmp_path, sft_policy_dir,
                                                                        addition_problems_path):
    cfg = rl_config(sft_policy_dir, addition_problems_path, tmp_path / "async", 3).model_copy(
        update={"one_step_off_policy": True})
    result = train_rl(cfg)
    diffs = [h["rollout_logprob_abs_diff"] for h in result.history]
    # step 0 is sampled by the start weights it trains; steps 1 and 2 were sampled while the previous update ran,
    # so the learner's logprobs before its update differ from the sampler's by one update's drift
    assert diffs[0] < 1e-4 and min(diffs[1:]) > 1e-3, diffs
    before, after = _weights(sft_policy_dir), _weights(result.model_dir)
    assert any(not torch.equal(before[k], after[k]) for k in before)
