"""Run the SFT trainer on N CPU processes (gloo) without Ray: torch.multiprocessing spawns `run_sft_worker`.

    losses = run_workers(cfg, world_size=2)     # {step: loss} from rank 0; checkpoints/policy in cfg.output_dir

Each process uses one torch thread (tests/gloo_workers.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.gloo_workers import spawn_on_gloo
from training.sft_trainer import MetricsHistory, SFTConfig, run_sft_worker


def _train(rank: int, world_size: int, cfg_json: str, out: str) -> None:
    history = MetricsHistory() if rank == 0 else None
    run_sft_worker(SFTConfig.model_validate_json(cfg_json), rank, world_size, torch.device("cpu"), history)
    if history is not None:
        Path(out).write_text(json.dumps(history.series("loss")))


def run_workers(cfg: SFTConfig, world_size: int) -> dict[int, float]:
    """Train `cfg` on `world_size` spawned processes; returns rank 0's {step: loss}."""
    out = Path(cfg.output_dir) / f"losses-{world_size}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    spawn_on_gloo(_train, world_size, cfg.model_dump_json(), str(out))
    return {int(step): loss for step, loss in json.loads(out.read_text()).items()}
