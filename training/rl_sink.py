"""RL learner checkpoints through Ray Train: every rank writes its DCP shard, the final one carries the policy.

    sink = RLCheckpointSink(rank)
    state = sink.load(parts)     # newest checkpoint of this run (a restart or a resumed invocation), or a fresh state
    sink.save(parts, state, metrics, final=False)

Shards of model and optimizer come from training.checkpointing (the SFT trainer's format, so a checkpoint
written by 2 learners resumes on 1 or 4); rank 0 adds scheduler, RNG and the trainer state (step, problem
cursor, metrics history). The final checkpoint also holds `policy/` (gathered once, training dtype), which the
driver moves out (training.sft_ray.move_policy).
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import ray.train
from ray.train import Checkpoint

from training.checkpointing import load_sharded_checkpoint, write_sharded_checkpoint
from training.rl_learner import LearnerParts
from training.sft_trainer import export_policy

FRESH = {"step": 0, "cursor": 0, "history": [], "elapsed_s": 0.0}


class RLCheckpointSink:
    def __init__(self, rank: int):
        self.rank = rank

    def load(self, parts: LearnerParts) -> dict[str, Any]:
        """Collective: restore model, optimizer, scheduler and RNG from the newest checkpoint; its trainer state."""
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return {**FRESH, "history": []}
        with checkpoint.as_directory() as directory:
            state = load_sharded_checkpoint(Path(directory), parts.model, parts.optimizer, parts.scheduler)
        return {**FRESH, **state}

    def save(self, parts: LearnerParts, state: dict[str, Any], metrics: dict[str, float], final: bool) -> None:
        """Collective: this rank's shard (+ rank 0's state, + the policy when `final`), reported to Ray Train."""
        with tempfile.TemporaryDirectory(prefix="afm-rl-ckpt-") as tmp:
            write_sharded_checkpoint(Path(tmp), parts.model, parts.optimizer, parts.scheduler, state, self.rank)
            if final:
                export_policy(parts, self.rank, Path(tmp) / "policy")
            # Ray copies the directory into run storage before report returns, so tmp may go afterwards.
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp))
