"""Run `learner_update` on N spawned CPU processes (gloo) without Ray; rank 0 saves the updated weights.

    weights, stats = run_learners(cfg, policy_dir, batch, world_size=2, out_dir=tmp)
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from tests.gloo_workers import spawn_on_gloo
from training.parallel import single_process_group
from training.rl_learner import LearnerBatch, gathered_weights, learner_update, setup_learner


def one_update(cfg, policy_dir: Path, batch: LearnerBatch, rank: int, world_size: int):
    parts = setup_learner(cfg, policy_dir, rank, world_size, torch.device("cpu"))
    stats = learner_update(parts, batch, cfg)
    return gathered_weights(parts), stats


def _update(rank: int, world_size: int, cfg_json: str, policy_dir: str, batch_path: str, out: str) -> None:
    from training.rl_trainer import RLConfig

    batch = torch.load(batch_path, weights_only=False)
    weights, stats = one_update(RLConfig.model_validate_json(cfg_json), Path(policy_dir), batch, rank, world_size)
    if rank == 0:
        torch.save({"weights": weights, "stats": stats}, out)


def run_learners(cfg, policy_dir: Path, batch: LearnerBatch, world_size: int, out_dir: Path):
    """(rank 0's gathered weights, its stats) after one update on `world_size` processes (1: in this process)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if world_size == 1:
        group = single_process_group("gloo") if cfg.parallelism == "fsdp" else contextlib.nullcontext()
        with group:
            return one_update(cfg, policy_dir, batch, 0, 1)
    batch_path, out = out_dir / "batch.pt", out_dir / f"update-{world_size}.pt"
    torch.save(batch, batch_path)
    spawn_on_gloo(_update, world_size, cfg.model_dump_json(), str(policy_dir), str(batch_path), str(out))
    saved = torch.load(out, weights_only=False)
    return saved["weights"], saved["stats"]
