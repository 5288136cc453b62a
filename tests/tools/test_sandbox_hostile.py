"""The hostile-program suite: every program in hostile_programs.PROGRAMS must be contained (limits hold, the
parent is unaffected, the canary secret never appears, nothing outlives the run, no connection reaches the host)."""
from __future__ import annotations

import os
import shutil

import pytest

from agents.tools.sandbox import SandboxLimits, run_python
from tests.tools.hostile_programs import BASE_LIMITS, PROGRAMS, run_hostile

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


@pytest.mark.parametrize(
    "program", [pytest.param(p, marks=[pytest.mark.slow] if p.slow else []) for p in PROGRAMS],
    ids=[p.name for p in PROGRAMS])
def test_hostile_program_is_contained(program):
    result, _ = run_hostile(program)
    os.kill(os.getpid(), 0)  # the parent (this test process) is alive and well
    assert result.duration_s < max(BASE_LIMITS["timeout_s"], program.limits.get("timeout_s", 0)) + 1.0


def test_suite_is_large_enough():
    assert len(PROGRAMS) >= 25


@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare is not installed")
def test_fallback_without_bwrap_still_isolates_network_and_limits():
    limits = SandboxLimits(timeout_s=2, cpu_s=5, memory_mb=256, use_bwrap=False)
    net = run_python("import socket\ntry:\n    socket.create_connection(('8.8.8.8', 53), timeout=1)\n"
                     "    print('CONNECTED')\nexcept OSError as e: print('DENIED', e)", limits)
    assert net.status == "ok" and "DENIED" in net.stdout
    assert run_python("x = bytearray(1024 * 1024 * 1024)", limits).status == "memory"
    assert run_python("while True: pass", limits).status == "timeout"
    if os.geteuid() == 0:
        assert "65534" in run_python("import os; print(os.getuid())", limits).stdout
