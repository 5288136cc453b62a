"""afm.hard_exit: the end-of-process path that skips native teardown after Ray (see docs/reliability.md).

Checks that Python-level cleanup still happens (atexit handlers, buffered output, the exit status), and that
the reason for it still holds: Ray's C++ threads outlive `ray.shutdown()`. When a Ray upgrade makes that
second test fail, the hard exit can go."""
from __future__ import annotations

import subprocess
import sys

import pytest

CLEANUP_PROGRAM = """
import atexit, sys
from afm.hard_exit import exit_after_python_cleanup
atexit.register(lambda: open(sys.argv[1], "w").write("atexit ran"))
sys.stdout.write("buffered, no newline")
exit_after_python_cleanup(3)
print("never printed")
"""

RAY_THREADS_PROGRAM = """
import os, ray
from afm.hard_exit import exit_after_python_cleanup
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
ray.shutdown()
names = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
print("threads after shutdown:", names)
exit_after_python_cleanup(0)
"""


def test_atexit_handlers_and_buffered_output_survive_the_hard_exit(tmp_path):
    marker = tmp_path / "marker"
    done = subprocess.run([sys.executable, "-c", CLEANUP_PROGRAM, str(marker)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered, no newline"
    assert marker.read_text() == "atexit ran"


@pytest.mark.integration
def test_ray_native_threads_outlive_shutdown():
    done = subprocess.run([sys.executable, "-c", RAY_THREADS_PROGRAM], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("threads after shutdown:"))
    assert "gcs_client_io_s" in line, line  # Ray's GCS client io thread is still running after ray.shutdown()
