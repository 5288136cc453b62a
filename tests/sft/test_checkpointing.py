"""Checkpoint helpers: atomic save, keep-last pruning, round trip of model/optimizer/scheduler/RNG/state."""
from __future__ import annotations

import random

import torch

from training.checkpointing import checkpoint_dirs, latest_checkpoint, load_checkpoint, save_checkpoint
from training.lr import warmup_schedule


def _parts(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = warmup_schedule(optimizer, "cosine", warmup_steps=2, total_steps=10)
    return model, optimizer, scheduler


def test_round_trip_restores_everything_and_keeps_last_k(tmp_path):
    model, optimizer, scheduler = _parts(0)
    for step in range(1, 5):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step(); scheduler.step(); optimizer.zero_grad()
        save_checkpoint(tmp_path, step, model, optimizer, scheduler, {"epoch": 0, "pos": step}, keep_last=2)
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["step-00000003", "step-00000004"]
    expected_random = (random.random(), torch.rand(3))

    fresh_model, fresh_opt, fresh_sched = _parts(1)
    state = load_checkpoint(latest_checkpoint(tmp_path), fresh_model, fresh_opt, fresh_sched)
    assert state["step"] == 4 and state["pos"] == 4
    actual_random = (random.random(), torch.rand(3))
    assert actual_random[0] == expected_random[0] and torch.equal(actual_random[1], expected_random[1])
    for p, q in zip(model.parameters(), fresh_model.parameters()):
        assert torch.equal(p, q)
    assert fresh_sched.get_last_lr() == scheduler.get_last_lr()
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])


def test_interrupted_save_is_invisible_and_cleaned_up(tmp_path):
    model, optimizer, scheduler = _parts(0)
    save_checkpoint(tmp_path, 1, model, optimizer, scheduler, {}, keep_last=3)
    (tmp_path / ".tmp-step-00000002-dead").mkdir()  # what a kill -9 during a save leaves behind
    assert latest_checkpoint(tmp_path).name == "step-00000001"
    save_checkpoint(tmp_path, 2, model, optimizer, scheduler, {}, keep_last=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001", "step-00000002"]
