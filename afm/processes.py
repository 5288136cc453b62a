"""Start, identify and stop local server processes by PID and process group, without touching anyone else's.

Usage:
    record = start_process(["mlflow", "server", ...], env, log_path)   # own session: pgid == pid
    is_running(record); stop_processes({"mlflow": record}, timeout_s=15)

A record stores the leader's PID and its kernel start time. Before signalling, the start time is compared so
a PID the kernel has since reused for an unrelated process is never signalled. Members of the group are
found through /proc (Linux only). This does NOT cover daemons a server double-forks into a new session:
none of the stack's servers does that when run in the foreground.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def process_start_time(pid: int) -> int | None:
    """Kernel start time of `pid` (clock ticks since boot), or None if it does not exist or is a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces; fields after the closing parenthesis are fixed.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def start_process(cmd: list[str], env: dict[str, str], log_path: Path) -> dict:
    """Start `cmd` in a new session (so it outlives the caller and is stoppable as one group); return its record."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    return {"pid": proc.pid, "start_time": process_start_time(proc.pid), "cmd": cmd, "log": str(log_path)}


def _leader_is_ours(record: dict) -> bool:
    return process_start_time(record["pid"]) == record["start_time"]


def is_running(record: dict) -> bool:
    """True while the recorded leader, or any process left in its group, is alive."""
    if _leader_is_ours(record):
        return True
    # A PID stays reserved while its number is in use as a process group id, so live members of the group
    # are ours even after the leader has exited; a live leader with another start time is a reused PID.
    return process_start_time(record["pid"]) is None and bool(group_members(record["pid"]))


def _reap(pid: int) -> None:
    """Collect the exit status if `pid` is our child, so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_processes(records: dict[str, dict], timeout_s: float) -> dict[str, str]:
    """SIGTERM every recorded leader at once, SIGKILL what is left of each group after `timeout_s`.

    Only the leader gets SIGTERM: servers like `ray start --block` drain and stop their own children, and
    signalling the whole group at once makes them race (Ray then hangs past any reasonable timeout).

    Returns per name 'stopped', 'killed' (needed SIGKILL) or 'not running'.
    """
    result = {}
    pending = []
    for name, record in records.items():
        if is_running(record):
            if _leader_is_ours(record):
                os.kill(record["pid"], signal.SIGTERM)
            pending.append(name)
        else:
            _reap(record["pid"])
            result[name] = "not running"
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for name in list(pending):
            _reap(records[name]["pid"])
            if not group_members(records[name]["pid"]):
                result[name] = "stopped"
                pending.remove(name)
        time.sleep(0.2)
    for name in pending:
        try:
            os.killpg(records[name]["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
        result[name] = "killed"
    time.sleep(0.2 if pending else 0)
    for name in pending:
        _reap(records[name]["pid"])
    return result
