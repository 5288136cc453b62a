"""Learning-rate schedules (training/lr.py): warmup, then cosine, constant or warmup-stable-decay (wsd)."""
from __future__ import annotations

import pytest
import torch

from training.lr import WSD_DECAY_FRACTION, lr_multiplier, warmup_schedule


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
