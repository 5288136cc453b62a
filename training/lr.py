"""Learning-rate schedules: linear warmup, then cosine decay to zero, a constant rate, or warmup-stable-decay
(constant, then linear to zero over the last WSD_DECAY_FRACTION of the run).

A run has two ends, its step count and (optionally) a time budget; the decay follows whichever is nearer, so a
run that its time budget stops has annealed by then, as one that reaches its last step has. The trainer sets
the share before each step and the scheduler steps after it, so the rate of step s+1 follows the seconds spent
before step s: the last step of a budgeted run trains at ~10 x step time / budget (0.002 x in make run's SFT).

Usage:
    time_share = TimeShare(budget_s=540)     # or TimeShare(None): steps only
    scheduler = warmup_schedule(optimizer, "wsd", warmup_steps=10, total_steps=100, time_share=time_share)
    ... time_share.spent_s = seconds_trained; optimizer.step(); scheduler.step()   # once per optimizer step
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch.optim.lr_scheduler import LambdaLR

Schedule = Literal["cosine", "constant", "wsd"]
# Share of the steps over which "wsd" decays to zero. With a known step count (max_steps), the policy trains at
# the full rate through its learning phase and anneals at the end. Measured on the default (docs/figures.md):
# SFT solved 0.33-0.44 of train-entity and 0.21-0.33 of computation problems where constant gave 0.17-0.42 and
# 0-0.13, and RL's reward started at 0.32-0.35 instead of 0.06-0.14.
WSD_DECAY_FRACTION = 0.2


@dataclass
class TimeShare:
    """How much of a time budget a run has spent. The trainer sets `spent_s` (the same value on every rank) before
    each optimizer step; the scheduler reads `fraction` when it steps."""

    budget_s: float | None  # None: no time budget, the step count alone ends the run
    spent_s: float = 0.0

    @property
    def fraction(self) -> float:
        return min(1.0, self.spent_s / self.budget_s) if self.budget_s else 0.0


def decayed_by_time(schedule: Schedule, time_fraction: float, warmup_share: float) -> float:
    """The schedule's factor over the time budget alone: wsd flat, then linear to 0 over its last
    WSD_DECAY_FRACTION; cosine over the share past warmup's (`warmup_share` of the steps; warmup's seconds count
    as the steps do); constant 1."""
    if schedule == "wsd":
        return min(1.0, (1.0 - time_fraction) / WSD_DECAY_FRACTION)
    if schedule == "cosine":
        # a warmup as long as the run leaves nothing to decay
        progress = 0.0 if warmup_share >= 1.0 else max(0.0, (time_fraction - warmup_share) / (1.0 - warmup_share))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def lr_multiplier(step: int, schedule: Schedule, warmup_steps: int, total_steps: int, time_fraction: float = 0.0) -> float:
    """Factor on the base LR at optimizer step `step` (0-based): ramps (step+1)/warmup, then cosine, flat, or
    flat then a linear decay (wsd). `time_fraction` (the share of a time budget spent, clamped to [0, 1]) counts
    as progress too: the factor is the smaller of the step schedule's and the same schedule over time
    (`decayed_by_time`; it caps the warmup ramp as well), so while the steps lead the budget changes nothing."""
    time_fraction = min(1.0, max(0.0, time_fraction))
    by_time = decayed_by_time(schedule, time_fraction, warmup_steps / total_steps if total_steps else 0.0)
    if step < warmup_steps:
        return min((step + 1) / warmup_steps, by_time)
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        decay_start = int((1.0 - WSD_DECAY_FRACTION) * total_steps)
        by_steps = 1.0 if step < decay_start else max(0.0, (total_steps - step) / max(1, total_steps - decay_start))
        return min(by_steps, by_time)
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min(0.5 * (1.0 + math.cos(math.pi * progress)), by_time)


def warmup_schedule(optimizer: torch.optim.Optimizer, schedule: Schedule, warmup_steps: int, total_steps: int,
                    time_share: TimeShare | None = None) -> LambdaLR:
    share = time_share or TimeShare(None)
    return LambdaLR(optimizer, lambda step: lr_multiplier(step, schedule, warmup_steps, total_steps, share.fraction))
