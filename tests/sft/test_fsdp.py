"""FSDP2 SFT on CPU (gloo, spawned processes, no Ray): worker-count invariance, activation checkpointing and
gradient accumulation under sharding, pinned loss, parameters change, DCP resume across world sizes.

Tolerance: 2 workers reduce gradients and the loss in another summation order than 1 worker (fp32), so loss
curves agree to 1e-4 absolute (measured differences are ~1e-6), not bit for bit.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from models.policy import load_policy
from tests.sft.distributed import run_workers
from tests.sft.test_sft_trainer import PINNED_LOSS_AFTER_5_STEPS
from training.checkpointing import checkpoint_dirs

TOL = 1e-4


def _cfg(sft_cfg, out: Path, **update):
    return sft_cfg.model_copy(update={"parallelism": "fsdp", "output_dir": str(out), **update})


@pytest.mark.slow
def test_two_workers_with_activation_checkpointing_match_one_worker_and_the_pinned_loss(sft_cfg, policy_dir, tmp_path):
    # Same global batch: 2 workers x micro_batch 1 == 1 worker x micro_batch 2 (sft_cfg's pinned run: 5 steps).
    one = run_workers(_cfg(sft_cfg, tmp_path / "one", micro_batch=2), world_size=1)
    two = run_workers(_cfg(sft_cfg, tmp_path / "two", micro_batch=1, activation_checkpointing=True), world_size=2)
    assert sorted(one) == sorted(two) == [1, 2, 3, 4, 5]
    for step in one:
        assert abs(one[step] - two[step]) < TOL, (step, one[step], two[step])
    # The FSDP path gives the loss pinned for the single-process trainer (tests/sft/test_sft_trainer.py).
    assert abs(one[5] - PINNED_LOSS_AFTER_5_STEPS) < TOL and abs(two[5] - PINNED_LOSS_AFTER_5_STEPS) < TOL

    before, _ = load_policy(policy_dir)
    after, _ = load_policy(tmp_path / "two" / "policy")
    assert all(not torch.equal(p, q) for p, q in zip(before.parameters(), after.parameters()))
    # Exported once, gathered from the shards, in the training dtype (fp32 on CPU).
    weights = load_file(tmp_path / "two" / "policy" / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.float32}


@pytest.mark.slow
def test_dcp_resume_across_world_sizes_and_accumulation_give_the_uninterrupted_losses(sft_cfg, tmp_path):
    # 4 rows a step throughout: 1 worker x 2 x accumulation 2, then 2 workers x 1 x accumulation 2 (gradient
    # sync on the last micro-batch only), then 1 worker x 4 without accumulation.
    straight = run_workers(_cfg(sft_cfg, tmp_path / "straight", micro_batch=2, grad_accum=2, max_steps=4,
                                checkpoint_every=2), 1)

    def resume_from(checkpoint: Path, out: Path, world_size: int, **update) -> dict[int, float]:
        (out / "checkpoints").mkdir(parents=True)
        shutil.copytree(checkpoint, out / "checkpoints" / checkpoint.name)
        return run_workers(_cfg(sft_cfg, out, max_steps=4, **update), world_size)

    # 1 -> 2 workers from the step-2 checkpoint (written by one process).
    step2 = checkpoint_dirs(tmp_path / "straight" / "checkpoints")[0]
    assert step2.name == "step-00000002"
    widened = resume_from(step2, tmp_path / "widened", 2, micro_batch=1, grad_accum=2, checkpoint_every=1)
    assert sorted(widened) == [3, 4]
    # 2 -> 1 worker from the step-3 checkpoint the two workers wrote (one shard file each).
    step3 = tmp_path / "widened" / "checkpoints" / "step-00000003"
    assert len(list(step3.glob("*.distcp"))) == 2
    narrowed = resume_from(step3, tmp_path / "narrowed", 1, micro_batch=4)
    assert sorted(narrowed) == [4]
    for step, loss in {**widened, **narrowed}.items():
        assert abs(loss - straight[step]) < TOL, (step, loss, straight[step])
