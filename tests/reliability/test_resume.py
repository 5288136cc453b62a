"""Faults: the distill stage killed with SIGKILL mid-rollout resumes on re-run — completed shards are skipped
and kept byte for byte, only the missing keys are produced, and no (problem_id, sample_idx) appears twice.

The real entry point runs as a subprocess in its own process group (`python -m distill.pipeline --out DIR`),
so SIGKILL takes down the driver, its local Ray and the rollout actors at once, as an OOM kill or a lost node
would.

    .venv/bin/pytest tests/reliability/test_resume.py -q -m slow
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distill.shards import shard_paths
from tests.reliability.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # two local Ray start-ups + a mini-web on 127.0.0.1

# 1 world x 24 multi-hop + 16 computation problems, 2 keys per shard: ~20 shards, so a kill lands mid-stage.
OVERRIDES = ["n_worlds=1", "multihop_per_world=24", "n_computation=16", "rl_multihop_per_world=2",
             "rl_computation=2", "n_heldout_worlds=1", "eval_per_world=2", "rollout.num_actors=1",
             "rollout.batch_size=2", "rollout.max_in_flight_per_actor=1", "rollout.show_progress=false",
             "rollout.ray_num_cpus=1"]


def _start(out: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_", "AFM_"))}
    return subprocess.Popen([sys.executable, "-m", "distill.pipeline", "--out", str(out), *OVERRIDES], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _keys(out: Path) -> list[tuple[str, int]]:
    keys = []
    for path in shard_paths(out / "rollouts"):
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                keys.append((row["problem_id"], row.get("sample_idx", 0)))
    return keys


def test_sigkill_mid_rollout_then_rerun_resumes_without_duplicates(tmp_path):
    out = tmp_path / "distill"
    proc = _start(out)
    deadline = time.monotonic() + 240
    while len(shard_paths(out / "rollouts")) < 3:
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.monotonic() < deadline, "no shards within 240 s"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "report.json").exists(), "the stage finished before the kill; the test proves nothing"

    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in shard_paths(out / "rollouts")}
    keys_before = _keys(out)
    assert len(keys_before) == len(set(keys_before)) >= 6

    rerun = _start(out)
    output = rerun.communicate(timeout=400)[0].decode()
    assert rerun.returncode == 0, output[-3000:]
    counts = json.loads((out / "report.json").read_text())["counts"]

    keys_after = _keys(out)
    assert len(keys_after) == len(set(keys_after)) == counts["problems"]  # every key exactly once
    assert counts["rollouts_skipped"] == len(keys_before)  # the shards already done were not redone
    assert counts["rollouts_new"] == counts["problems"] - len(keys_before)
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in shard_paths(out / "rollouts")}
    assert {name: after[name] for name in before} == before  # completed shards untouched
    rows = [json.loads(line) for line in (out / "sft.jsonl").read_text().splitlines()]
    # No log reaches the SFT set twice, apart from the filter's deliberate error-correction upsampling copies.
    originals = [r["metadata"]["source_log_id"] for r in rows if "upsampled_copy" not in r["metadata"]]
    assert originals and len(originals) == len(set(originals))
