"""Shared helpers for the reliability suite: one thread for torch, a closed 127.0.0.1 port, and the CLI runner.

`run_afm(args, env_overrides, timeout_s)` runs the real console script (`.venv/bin/afm`) as a subprocess with a
scrubbed copy of the environment and returns (exit code, stdout + stderr, seconds)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[2]
AFM_BIN = Path(sys.executable).with_name("afm")


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on: bind port 0, read it, close the socket."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(home: Path) -> dict[str, str]:
    """The caller's environment without any platform endpoint, so each test names exactly the one it breaks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AFM_", "PREFECT_", "RAY_", "AWS_"))}
    env.update(AFM_HOME=str(home), PYTHONUNBUFFERED="1")
    return env


def run_afm(args: list[str], env: dict[str, str], timeout_s: float = 120) -> tuple[int, str, float]:
    started = time.perf_counter()
    proc = subprocess.run([str(AFM_BIN), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - started


@pytest.fixture()
def afm_home(tmp_path) -> Path:
    home = tmp_path / "afm_home"
    home.mkdir()
    return home
