"""Process records: stop by group (children included), SIGKILL escalation, and no signal to a reused PID."""
from __future__ import annotations

import time

from afm.processes import group_members, is_running, start_process, stop_processes


def _wait_members(pgid: int, count: int) -> None:
    deadline = time.monotonic() + 5
    while len(group_members(pgid)) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def test_stop_takes_children_with_the_leader(tmp_path):
    # The leader starts a child and waits; SIGTERM to the leader alone would orphan the child.
    record = start_process(["bash", "-c", "sleep 60 & wait"], {"PATH": "/usr/bin:/bin"}, tmp_path / "log")
    _wait_members(record["pid"], 2)
    assert is_running(record) and len(group_members(record["pid"])) == 2
    result = stop_processes({"sleeper": record}, timeout_s=0.5)
    assert result["sleeper"] in ("stopped", "killed")
    assert group_members(record["pid"]) == [] and not is_running(record)


def test_term_ignoring_process_is_killed(tmp_path):
    record = start_process(["bash", "-c", "trap '' TERM; while true; do sleep 0.1; done"], {"PATH": "/usr/bin:/bin"},
                           tmp_path / "log")
    time.sleep(0.3)  # let bash install the trap
    started = time.monotonic()
    assert stop_processes({"stubborn": record}, timeout_s=1.0) == {"stubborn": "killed"}
    assert time.monotonic() - started < 3
    assert group_members(record["pid"]) == []


def test_reused_pid_is_not_signalled(tmp_path):
    record = start_process(["sleep", "30"], {"PATH": "/usr/bin:/bin"}, tmp_path / "log")
    stale = {**record, "start_time": record["start_time"] - 1}  # same PID, different process
    assert not is_running(stale)
    assert stop_processes({"old": stale}, timeout_s=0.5) == {"old": "not running"}
    assert is_running(record)
    assert stop_processes({"new": record}, timeout_s=5) == {"new": "stopped"}
