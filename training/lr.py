"""Learning-rate schedules: linear warmup, then cosine decay to zero or a constant rate.

Usage:
    scheduler = warmup_schedule(optimizer, schedule="cosine", warmup_steps=10, total_steps=100)
    ... optimizer.step(); scheduler.step()   # once per optimizer step
"""
from __future__ import annotations

import math
from typing import Literal

import torch
from torch.optim.lr_scheduler import LambdaLR


def lr_multiplier(step: int, schedule: Literal["cosine", "constant"], warmup_steps: int, total_steps: int) -> float:
    """Factor on the base LR at optimizer step `step` (0-based): ramps (step+1)/warmup, then cosine or flat."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_schedule(
    optimizer: torch.optim.Optimizer, schedule: Literal["cosine", "constant"], warmup_steps: int, total_steps: int
) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: lr_multiplier(step, schedule, warmup_steps, total_steps))
