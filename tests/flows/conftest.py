"""Fixtures for flow tests: one temporary Prefect server for the session, a private AFM_HOME per test,
and the smallest pipeline recipe that still runs every stage for real."""
from __future__ import annotations

import pytest

from afm.config import load_config

SMOKE_OVERRIDES = [
    "distill.n_worlds=2", "distill.multihop_per_world=12", "distill.n_computation=8",
    "distill.rl_multihop_per_world=4", "distill.rl_computation=4", "distill.n_heldout_worlds=1",
    "distill.eval_per_world=4", "distill.rollout.num_actors=1",
    "policy.tiny.hidden_size=64", "policy.tiny.num_layers=2", "policy.tiny.num_heads=2",
    "policy.tiny.num_kv_heads=1", "policy.tiny.intermediate_size=128", "policy.vocab_size=600",
    "sft.max_steps=4", "sft.time_budget_s=30", "sft.checkpoint_every=2", "sft.report_every=2",
    "rl.steps=1", "rl.prompts_per_step=2", "rl.rollout.group_size=2", "rl.rollout.max_turns=2",
    "eval.problem_sets.heldout.size=2", "eval.problem_sets.train_entities.size=2",
    "eval.problem_sets.computation.size=1", "eval.n_samples=1", "eval.ks=[1]", "eval.max_turns=2",
]


@pytest.fixture(scope="session")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def afm_home(tmp_path, monkeypatch):
    monkeypatch.setenv("AFM_HOME", str(tmp_path / "afm"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("AFM_STORE_URI", raising=False)
    return tmp_path / "afm"


@pytest.fixture
def smoke_config():
    from flows.pipeline import PipelineConfig

    return load_config(PipelineConfig, "configs/default.yaml", SMOKE_OVERRIDES)
