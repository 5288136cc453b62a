"""DAPO dynamic sampling with refill: keep sampling groups until the step has `needed` informative ones.

A group (one problem's G episodes) whose rewards are all equal has zero GRPO advantage and teaches nothing.
DAPO does not just drop such groups (the batch would shrink as the policy gets very good or very bad): it samples
more problems until the batch holds the configured number of informative groups. Here each refill round asks for
the missing count divided by the informative rate seen so far (at most `max_round_factor` x the step's size),
for at most `max_rounds` rounds; a step that still falls short trains on what it has (and says so).

    picked = fill_informative_groups(sample, needed=8, group_size=4, max_rounds=4)
    picked.groups            # [(episodes, rewards)] x needed (fewer only if max_rounds ran out)
    picked.sampled_groups / needed      # the oversampling ratio logged per step

`sample(count, round)` returns `count` new groups as (episodes, rewards): the caller draws the next problems of
its stream, rolls them out and scores them. Plain Python: no Ray, no model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

Group = tuple[Sequence[Any], Sequence[float]]  # (G episodes, their G rewards)


def is_informative(rewards: Sequence[float]) -> bool:
    return max(rewards) > min(rewards)


@dataclass
class FilledBatch:
    groups: list[Group] = field(default_factory=list)  # informative groups, in sampling order, at most `needed`
    all_groups: list[Group] = field(default_factory=list)  # every sampled group (for reward metrics)
    sampled_groups: int = 0
    rounds: int = 0


def fill_informative_groups(sample: Callable[[int, int], list[Group]], needed: int, max_rounds: int,
                            max_round_factor: int = 4) -> FilledBatch:
    """Sample `needed` groups, then refill until `needed` are informative or `max_rounds` rounds were drawn."""
    out = FilledBatch()
    count = needed
    while out.rounds < max_rounds:
        drawn = sample(count, out.rounds)
        out.rounds += 1
        out.sampled_groups += len(drawn)
        out.all_groups += drawn
        out.groups += [g for g in drawn if is_informative(g[1])][: needed - len(out.groups)]
        missing = needed - len(out.groups)
        if missing == 0:
            break
        informative = sum(is_informative(g[1]) for g in out.all_groups)
        rate = informative / out.sampled_groups if informative else 1.0 / (2 * out.sampled_groups)
        count = min(math.ceil(missing / rate), max_round_factor * needed)
    return out
