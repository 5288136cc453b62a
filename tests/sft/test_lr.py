"""Learning-rate schedules (training/lr.py): warmup, then cosine, constant or warmup-stable-decay (wsd)."""
from __future__ import annotations

import math

import pytest
import torch

from training.lr import WSD_DECAY_FRACTION, TimeShare, lr_multiplier, warmup_schedule


def test_wsd_is_constant_until_its_decay_then_linear_to_zero():
    total, warmup = 100, 5
    decay_start = int((1 - WSD_DECAY_FRACTION) * total)
    factors = [lr_multiplier(step, "wsd", warmup, total) for step in range(total)]
    assert factors[:warmup] == [lr_multiplier(step, "constant", warmup, total) for step in range(warmup)]
    assert all(f == 1.0 for f in factors[warmup:decay_start])
    decay = factors[decay_start:]
    assert decay[0] == 1.0 and all(a > b for a, b in zip(decay, decay[1:]))
    assert decay[-1] == pytest.approx(1 / (total - decay_start))     # the last step trains at a small rate, not 0
    assert lr_multiplier(total, "wsd", warmup, total) == 0.0


def test_cosine_and_constant_after_warmup():
    assert lr_multiplier(4, "cosine", 5, 100) == pytest.approx(1.0)
    assert lr_multiplier(52, "cosine", 5, 100) == pytest.approx(0.5, abs=0.02)
    assert lr_multiplier(99, "constant", 5, 100) == 1.0


def test_scheduler_applies_the_wsd_factor_to_the_optimizer():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scheduler = warmup_schedule(optimizer, "wsd", warmup_steps=0, total_steps=10)
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[:8] == [pytest.approx(0.1)] * 8 and rates[8] == pytest.approx(0.1) and rates[9] == pytest.approx(0.05)


@pytest.mark.parametrize("schedule", ["wsd", "cosine"])
def test_a_time_budget_that_trails_the_steps_changes_nothing(schedule):
    total, warmup = 100, 5
    for step in range(total + 1):
        behind = 0.9 * step / total   # a fast machine: the budget's share spent stays below the steps' share
        assert lr_multiplier(step, schedule, warmup, total, behind) == lr_multiplier(step, schedule, warmup, total)


def test_a_time_budget_that_leads_decays_the_rate_by_the_seconds():
    # A slow machine has spent 90% of its budget at step 50 of 100: wsd is half way down its decay by time, where
    # by steps it would still be flat; cosine reads the time past warmup's share (5%): (0.9 - 0.05) / 0.95.
    assert lr_multiplier(50, "wsd", 5, 100, time_fraction=0.9) == pytest.approx(0.5)
    assert lr_multiplier(50, "wsd", 5, 100, time_fraction=1.0) == 0.0
    cosine_progress = (0.9 - 0.05) / 0.95
    assert lr_multiplier(50, "cosine", 5, 100, time_fraction=0.9) == pytest.approx(
        0.5 * (1 + math.cos(cosine_progress * math.pi)))
    assert lr_multiplier(50, "constant", 5, 100, time_fraction=0.9) == 1.0
    # warmup ramps by steps, and the time decay caps it (a machine so slow its budget ends during warmup)
    assert lr_multiplier(2, "wsd", 5, 100, time_fraction=0.5) == 3 / 5
    assert lr_multiplier(2, "wsd", 5, 100, time_fraction=0.95) == pytest.approx(0.25)
    # a share past the budget (an overrunning last step) reads as the budget's end, never as a negative rate
    assert lr_multiplier(50, "wsd", 5, 100, time_fraction=1.3) == 0.0
    assert lr_multiplier(50, "cosine", 5, 100, time_fraction=1.3) == pytest.approx(0.0)


def test_scheduler_reads_the_time_share_when_it_steps():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    share = TimeShare(budget_s=100.0)
    scheduler = warmup_schedule(optimizer, "wsd", warmup_steps=0, total_steps=1000, time_share=share)
    share.spent_s = 95.0
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.25)
    assert TimeShare(None, spent_s=5.0).fraction == 0.0 and TimeShare(10.0, spent_s=50.0).fraction == 1.0
