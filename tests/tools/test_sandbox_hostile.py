"""The hostile-program suite: every program in hostile_programs.PROGRAMS must be contained (limits hold, the
parent is unaffected, the canary secret never appears, nothing outlives the run, no connection reaches the host);
legitimate programs (numpy, multiprocessing, files, subprocesses) must still run; the fallbacks say what they are."""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from agents.tools import sandbox
from agents.tools.sandbox import SandboxLimits, _cgroup_parents, run_python
from tests.tools.hostile_programs import BASE_LIMITS, PROGRAMS, run_hostile

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")

LEGIT = """
import multiprocessing, os, subprocess, sys
import numpy as np

def square(x):
    return x * x

if __name__ == "__main__":
    print("numpy", float(np.linalg.norm(np.arange(12.0).reshape(3, 4))))
    with multiprocessing.Pool(2) as pool:
        print("pool", pool.map(square, range(5)))
    with open("data.txt", "w") as f:
        f.write("kept")
    print("file", open("data.txt").read(), os.getcwd())
    print("child", subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout.strip())
"""


@pytest.mark.parametrize(
    "program", [pytest.param(p, marks=[pytest.mark.slow] if p.slow else []) for p in PROGRAMS],
    ids=[p.name for p in PROGRAMS])
def test_hostile_program_is_contained(program):
    result, _ = run_hostile(program)
    os.kill(os.getpid(), 0)  # the parent (this test process) is alive and well
    assert result.duration_s < max(BASE_LIMITS["timeout_s"], program.limits.get("timeout_s", 0)) + 1.0


def test_suite_is_large_enough():
    assert len(PROGRAMS) >= 48


def test_legitimate_programs_still_work():
    result = run_python(LEGIT, SandboxLimits(timeout_s=20, cpu_s=20))
    assert result.status == "ok", result.stderr[-1000:]
    assert "numpy 22.49" in result.stdout and "pool [0, 1, 4, 9, 16]" in result.stdout
    assert "file kept /tmp/work" in result.stdout and "child 42" in result.stdout


def test_same_program_same_output():
    # the script's path inside the sandbox is fixed, so tracebacks (and hence tool observations) repeat exactly
    limits = SandboxLimits(timeout_s=5)
    first, second = (run_python("import sys\nprint(sys.argv[0])\n1 / 0", limits) for _ in range(2))
    assert first.stdout == second.stdout == "/tmp/work/main.py\n" and first.stderr == second.stderr
    assert 'File "/tmp/work/main.py", line 3' in first.stderr


@pytest.mark.skipif(not sandbox._editable_pth_covers(),
                    reason="no editable install in this interpreter's site-packages")
def test_editable_install_finder_is_not_loaded_inside():
    """The editable install's .pth (a finder for the checkout) is covered, so `site` never imports it; the venv's
    packages still import (numpy: test_legitimate_programs_still_work)."""
    pth = sandbox._editable_pth_covers()[-1]
    probe = ("import sys\nprint(sorted(type(f).__module__ for f in sys.meta_path))\n"
             "print(sorted(m for m in sys.modules if 'editable' in m))\n"
             f"try:\n    open({pth!r})\nexcept PermissionError:\n    print('covered')")
    result = run_python(probe, SandboxLimits(timeout_s=10))
    assert result.status == "ok", result.stderr[-500:]
    finders, editable_modules, covered = result.stdout.splitlines()
    assert "editable" not in finders and editable_modules == "[]" and covered == "covered", result.stdout


@pytest.mark.skipif(_cgroup_parents() is None or os.geteuid() != 0, reason="no writable cgroup hierarchy here")
@pytest.mark.skipif(not shutil.which("bwrap"), reason="bwrap mode")
def test_interpreter_under_tmp_is_bound_over_the_private_tmp(tmp_path):
    """A clone in /tmp (CI's fresh clones) has its venv under /tmp: the sandbox's private /tmp must not hide it."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    # the outer program imports the project and its libraries from here; the sandboxed one needs only stdlib
    (next(env_dir.glob("lib/python*/site-packages")) / "afm_test.pth").write_text(
        "\n".join([*site.getsitepackages(), str(Path(sandbox.__file__).resolve().parents[2])]) + "\n")
    outer = ("from agents.tools.sandbox import SandboxLimits, run_python\n"
             "r = run_python('import sys, os; print(sys.prefix, os.getcwd())', SandboxLimits(timeout_s=20))\n"
             "print(r.status, r.stdout.strip(), r.stderr.strip()[-300:])\n")
    done = subprocess.run([str(env_dir / "bin" / "python"), "-c", outer], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["ok", str(env_dir), "/tmp/work"], done.stdout


def test_cgroup_caps_the_tree_and_is_removed(monkeypatch):
    made = []
    create = sandbox._Cgroup.create
    monkeypatch.setattr(sandbox._Cgroup, "create", classmethod(lambda cls, limits: made.append(create(limits)) or made[-1]))
    result = run_python("x = bytearray(b'1') * (40 << 20)\nprint('held')", SandboxLimits(timeout_s=10))
    assert result.status == "ok" and result.cgroup == "v1"
    assert 40 << 20 < result.peak_memory_bytes < 200 << 20
    assert made[0] is not None and not any(path.exists() for path in made[0].dirs), "the run's cgroups were left"


def test_without_cgroup_the_result_says_so():
    result = run_python("print('hi')", SandboxLimits(timeout_s=5, use_cgroup=False))
    assert result.status == "ok" and result.cgroup is None and result.peak_memory_bytes is None


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
