"""Exact resume: N steps, SIGKILL right after checkpoint N, resume, N more == 2N steps straight."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from models.policy import load_policy
from training.checkpointing import checkpoint_dirs
from training.sft_trainer import run_sft_local

# The child trains with the real trainer; after the checkpoint of step N is on disk it signals the parent
# (a marker file) and blocks, so the SIGKILL lands at a known point between two optimizer steps.
CHILD = """
import json, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
import training.sft_trainer as trainer
from training.sft_trainer import SFTConfig, run_sft_local
cfg = SFTConfig.model_validate_json(sys.argv[1])
save = trainer.save_sharded_checkpoint
def save_then_wait(root, step, *args, **kwargs):
    path = save(root, step, *args, **kwargs)
    Path(sys.argv[2]).write_text(str(step))
    time.sleep(600)
trainer.save_sharded_checkpoint = save_then_wait
run_sft_local(cfg)
"""


@pytest.mark.slow
def test_resume_after_sigkill_matches_straight_run(sft_cfg, tmp_path):
    n = 4
    straight = run_sft_local(sft_cfg.model_copy(update={"max_steps": 2 * n, "output_dir": str(tmp_path / "straight")}))

    cfg = sft_cfg.model_copy(update={"max_steps": 2 * n, "checkpoint_every": n, "output_dir": str(tmp_path / "killed")})
    marker = tmp_path / "checkpointed"
    child = subprocess.Popen([sys.executable, "-c", CHILD, cfg.model_dump_json(), str(marker)], env=os.environ.copy())
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, "child exited before checkpointing"
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.1)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    assert [p.name for p in checkpoint_dirs(Path(cfg.output_dir) / "checkpoints")] == [f"step-{n:08d}"]
    assert not (Path(cfg.output_dir) / "policy").exists()

    resumed = run_sft_local(cfg)
    assert resumed.steps == straight.steps == 2 * n
    assert abs(resumed.final_loss - straight.final_loss) < 1e-5
    model_a, _ = load_policy(straight.policy_dir)
    model_b, _ = load_policy(resumed.policy_dir)
    for p, q in zip(model_a.parameters(), model_b.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5)
