"""How the sandbox waits for its program: `_exited_within` sees an exit when it happens (pidfd), a timeout when
none comes, a child that exited before the wait began, and falls back to polling where pidfd_open fails. No
bwrap needed: plain child processes."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from agents.tools import sandbox
from agents.tools.sandbox import SandboxLimits


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "pidfd_open refused: polls"])
def test_exit_and_timeout(pidfd, monkeypatch):
    if not pidfd:
        def refused(pid):
            raise OSError(errno.ENOSYS, "pidfd_open")
        monkeypatch.setattr(os, "pidfd_open", refused)
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    assert sandbox._exited_within(quick, 30.0) and quick.returncode == 0
    slow = subprocess.Popen(["sleep", "30"])
    try:
        assert not sandbox._exited_within(slow, 0.2) and slow.returncode is None
    finally:
        slow.kill()
        slow.wait()


def test_a_child_that_exited_before_the_wait_is_reaped_with_its_status():
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    while Path(f"/proc/{child.pid}/stat").read_text().split()[2] != "Z":  # exited, not yet reaped: a zombie
        time.sleep(0.01)
    fds_before = len(os.listdir("/proc/self/fd"))
    assert sandbox._exited_within(child, 30.0) and child.returncode == 3
    assert len(os.listdir("/proc/self/fd")) == fds_before, "the pidfd was not closed"


@pytest.mark.parametrize("timeout_s", [0, -1, float("nan")])
def test_a_timeout_must_be_positive(timeout_s):
    with pytest.raises(ValidationError):
        SandboxLimits(timeout_s=timeout_s)
