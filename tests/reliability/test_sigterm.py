"""SIGTERM to an `afm` command unwinds it (cli/app.py `exit_on_sigterm`): `finally` blocks and atexit handlers
run and the servers it started stop, Prefect's temporary API server included, instead of being orphaned.

    .venv/bin/python -m pytest tests/reliability/test_sigterm.py
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.reliability.conftest import REPO, base_env

# The real `afm` entry point (cli.app.main) with the typer app swapped for a command that runs one Prefect flow
# (which starts Prefect's temporary API server as a child process, as `afm pipeline` does) and then waits.
BLOCKING_COMMAND = """
import sys, time
from pathlib import Path
from prefect import flow
import cli.app as cli

@flow
def one_flow():
    return 1

def long_command():
    one_flow()
    try:  # "ready" inside the try: a SIGTERM sent the moment it is read must land within it (before, on a loaded
        print("ready", flush=True)  # machine, one arrived between the print and the try, and no finally ran)
        time.sleep(300)
    finally:
        Path(sys.argv[1]).write_text("unwound")

cli.app = long_command
cli.main()
"""


@pytest.mark.integration
def test_sigterm_unwinds_the_command_and_stops_prefects_server(tmp_path):
    marker = tmp_path / "finally.txt"
    env = {**base_env(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect")}
    proc = subprocess.Popen([sys.executable, "-c", BLOCKING_COMMAND, str(marker)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children: list[psutil.Process] = []
    try:
        output = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and (line := proc.stdout.readline()):
            output.append(line)
            if line.strip() == "ready":
                break
        assert output and output[-1].strip() == "ready", "".join(output)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any("uvicorn" in " ".join(c.cmdline()) for c in children), [c.cmdline() for c in children]

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert marker.read_text() == "unwound"
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [c.cmdline() for c in alive]
    finally:  # a failed check must not leave the command or its server running
        for process in [proc, *children]:
            try:
                process.kill()
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
        proc.wait()
        proc.stdout.close()
