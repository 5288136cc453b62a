"""Ray rollout pool: exactly once per (problem, sample), resume from shards, survive a killed actor."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from agents.teacher.log import MASLog
from agents.teacher.mas import TeacherConfig
from distill.rollouts import RolloutConfig, actor_name, run_rollouts
from distill.shards import iter_logs, shard_paths

pytestmark = pytest.mark.integration


def keys_in(out_dir):
    """Every (problem_id, sample_idx) in the complete shards, duplicates included."""
    return [(log.problem_id, log.sample_idx) for path in shard_paths(out_dir) for log in _read(path)]


def _read(path):
    return [MASLog.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def test_exactly_once_and_resume(ray_session, world_setup, toolbox_cfg, tmp_path):
    problems = world_setup.problems
    cfg = RolloutConfig(num_actors=2, samples_per_problem=2, batch_size=4, show_progress=False)
    wanted = sorted((p.id, s) for p in problems for s in range(2))
    first = run_rollouts(problems, TeacherConfig(), toolbox_cfg, cfg, tmp_path, run_id="a")
    assert (first.produced, first.skipped, first.failed) == (len(wanted), 0, 0)
    assert sorted(keys_in(tmp_path)) == wanted
    assert all(l.verified for l in iter_logs(tmp_path))

    again = run_rollouts(problems, TeacherConfig(), toolbox_cfg, cfg, tmp_path, run_id="b")
    assert (again.produced, again.skipped) == (0, len(wanted))

    lost = shard_paths(tmp_path)[1]  # not the first: a restart at index 0 would overwrite shard 0
    lost_keys = sorted((l.problem_id, l.sample_idx) for l in _read(lost))
    lost.unlink()
    (tmp_path / ".shard-a-99999.jsonl.tmp").write_text("half a line")  # a crashed write is ignored
    resumed = run_rollouts(problems, TeacherConfig(), toolbox_cfg, cfg, tmp_path, run_id="a")  # same id again
    assert resumed.produced == len(lost_keys) and resumed.skipped == len(wanted) - len(lost_keys)
    assert sorted(keys_in(tmp_path)) == wanted


def test_killed_actor_work_is_redone_once(ray_session, world_setup, toolbox_cfg, tmp_path):
    problems = world_setup.problems
    cfg = RolloutConfig(num_actors=2, samples_per_problem=8, batch_size=2, max_in_flight_per_actor=1,
                        show_progress=False)
    box = {}
    runner = threading.Thread(target=lambda: box.update(result=run_rollouts(
        problems, TeacherConfig(), toolbox_cfg, cfg, tmp_path, run_id="kill")))
    runner.start()
    deadline = time.time() + 60
    while not shard_paths(tmp_path) and time.time() < deadline:
        time.sleep(0.01)
    victim = ray_session.get_actor(actor_name("kill", 0, 0))
    os.kill(ray_session.get(victim.pid.remote()), signal.SIGKILL)
    runner.join(timeout=120)
    result = box["result"]
    assert result.actor_restarts >= 1
    got = keys_in(tmp_path)
    assert len(got) == len(set(got)) == len(problems) * 8
    assert result.produced == len(problems) * 8 and result.failed == 0
