"""Learner batch packing and the per-step problem schedule."""
from __future__ import annotations

import torch

from problems.records import Problem
from training.rl_rollout import Episode
from training.rl_learner import build_learner_batch
from training.rl_trainer import next_problems


def test_learner_batch_masks_prompt_and_observation_targets():
    p = Problem(id="p", question="q", answers=["a"], family="computation")
    ep = Episode(p, 0, 0, prompt_ids=[5, 6, 7], response_ids=[10, 11, 90, 91, 12], loss_mask=[1, 1, 0, 0, 1],
                 rollout_logprobs=[-0.1, -0.2, 0.0, 0.0, -0.3])
    short = Episode(p, 0, 1, prompt_ids=[5], response_ids=[10], loss_mask=[1], rollout_logprobs=[-0.4])
    batch = build_learner_batch([ep, short], [1.5, -1.5], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 10, 11, 90, 91, 12], [5, 10, 0, 0, 0, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 8, [1, 1, 0, 0, 0, 0, 0, 0]]
    # target position t predicts input_ids[t + 1]: the first response token is predicted at t = len(prompt) - 1
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 0, 0, 1], [1, 0, 0, 0, 0, 0, 0]]
    targets = batch.input_ids[:, 1:]
    assert targets[0][batch.loss_mask[0] > 0].tolist() == [10, 11, 12]
    assert torch.allclose(batch.rollout_logprobs[0][batch.loss_mask[0] > 0], torch.tensor([-0.1, -0.2, -0.3]))
    assert batch.advantages.tolist() == [1.5, -1.5]


def test_problem_stream_covers_each_epoch_and_is_deterministic():
    problems = [Problem(id=str(i), question=str(i), answers=["x"], family="multihop") for i in range(10)]
    first_epoch = [p.id for s in range(5) for p in next_problems(problems, 2 * s, 2, seed=7)]
    assert sorted(first_epoch) == sorted(p.id for p in problems)
    assert first_epoch == [p.id for s in range(5) for p in next_problems(problems, 2 * s, 2, seed=7)]
    assert first_epoch != [p.id for s in range(5) for p in next_problems(problems, 2 * s, 2, seed=8)]


def test_jobs_sharing_a_checkpoint_uri_get_their_own_ray_run(tmp_path):
    """A shared `checkpoint_uri` (one S3 prefix for every RL job) must not let one job resume from another's
    checkpoints; a rerun of the same job (same output_dir) finds its own run again."""
    from training.rl_trainer import RLConfig, ray_run_name

    shared = RLConfig(policy="p", problems_path="x.jsonl", checkpoint_uri="s3://bucket/rl")
    a, b = ray_run_name(shared, tmp_path / "rl-a"), ray_run_name(shared, tmp_path / "rl-b")
    assert a != b and a == ray_run_name(shared, tmp_path / "rl-a")
    default = RLConfig(policy="p", problems_path="x.jsonl")  # storage <output_dir>/ray: a directory per job already
    assert ray_run_name(default, tmp_path / "rl-a") == "rl"
