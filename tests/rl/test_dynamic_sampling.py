"""DAPO refill (training/dynamic_sampling.py): with a policy that solves ~10% of problems, every step still
trains on the configured number of informative groups, within a bounded number of sampling rounds."""
from __future__ import annotations

import random

from training.dynamic_sampling import fill_informative_groups, is_informative


def weak_policy_sampler(solve_rate: float, group_size: int, seed: int):
    """Groups of 0/1 rewards, each episode correct with probability `solve_rate` (seeded)."""
    rng = random.Random(seed)
    calls = []

    def sample(count: int, round_: int):
        calls.append((count, round_))
        return [([None] * group_size, [float(rng.random() < solve_rate) for _ in range(group_size)])
                for _ in range(count)]

    return sample, calls


def test_weak_policy_steps_are_refilled_to_the_configured_size():
    ratios = []
    for step in range(50):
        sample, calls = weak_policy_sampler(0.10, group_size=4, seed=step)
        filled = fill_informative_groups(sample, needed=8, max_rounds=4)
        assert len(filled.groups) == 8, f"step {step}: {len(filled.groups)} informative groups after {calls}"
        assert all(is_informative(rewards) for _, rewards in filled.groups)
        assert filled.sampled_groups == sum(count for count, _ in calls) == len(filled.all_groups)
        ratios.append(filled.sampled_groups / 8)
    # P(informative) = 1 - 0.9^4 - 0.1^4 ~ 0.34: about 3x oversampling, never more than the bound allows.
    assert 2.0 < sum(ratios) / len(ratios) < 5.0
    assert max(ratios) <= 1 + 3 * 4


def test_no_refill_when_the_first_round_is_full_and_a_hopeless_step_stops():
    sample, calls = weak_policy_sampler(0.5, group_size=8, seed=6)
    filled = fill_informative_groups(sample, needed=4, max_rounds=4)
    assert len(filled.groups) == 4 and calls == [(4, 0)]  # seeded: all 4 groups of round 0 are informative
    never, calls = weak_policy_sampler(0.0, group_size=4, seed=2)
    empty = fill_informative_groups(never, needed=4, max_rounds=3)
    assert empty.groups == [] and empty.rounds == 3 and len(calls) == 3
    assert all(count <= 16 for count, _ in calls)  # max_round_factor x needed
