"""RolloutWorker without Ray: seeds per key, failures reported after retries, a local-model teacher."""
from __future__ import annotations

import torch

from agents.teacher.mas import TeacherConfig
from distill.rollout_work import RolloutWorker, rollout_seed
from models.policy import save_policy
from models.tiny import TinyModelConfig, build_tiny_model
from models.tokenizer import train_tokenizer


def test_same_key_same_log_any_worker(world_setup, toolbox_cfg):
    a = RolloutWorker(world_setup.problems, TeacherConfig(mistake_rate=0.5), toolbox_cfg, max_retries=0)
    b = RolloutWorker(world_setup.problems, TeacherConfig(mistake_rate=0.5), toolbox_cfg, max_retries=0)
    pid = world_setup.problems[2].id
    assert a.run_one(pid, 1) == b.run_one(pid, 1)
    assert rollout_seed(0, pid, 0) != rollout_seed(0, pid, 1)


def test_failures_are_reported_not_raised(world_setup, toolbox_cfg):
    worker = RolloutWorker(world_setup.problems, TeacherConfig(), toolbox_cfg, max_retries=1)
    good, bad = worker.run_batch([(world_setup.problems[0].id, 0), ("no-such-problem", 0)])
    assert good["log"]["verified"] and "KeyError" in bad["error"] and bad["key"] == ["no-such-problem", 0]


def test_local_model_teacher_from_a_saved_policy(world_setup, toolbox_cfg, tmp_path):
    torch.set_num_threads(1)
    tok = train_tokenizer(["Question: who? NEXT: search"] * 10, vocab_size=300)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                             intermediate_size=64), tok)
    save_policy(model, tok, tmp_path / "policy")
    cfg = TeacherConfig(backend="local", model_path=str(tmp_path / "policy"), max_tokens=8, max_steps=3)
    worker = RolloutWorker(world_setup.problems, cfg, toolbox_cfg, max_retries=0)
    [out] = worker.run_batch([(world_setup.problems[0].id, 0)])
    assert out["log"]["teacher"].startswith("local:") and not out["log"]["verified"]
    assert all(e["prompt_tokens"] > 0 for e in out["log"]["events"] if e["role"] == "thinking")
