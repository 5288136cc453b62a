"""The smoke pipeline, run once for the whole test session: a run that fails in its middle stage, then the
re-run that resumes it (tests/flows/test_pipeline.py checks the resume; tests/reliability/test_secrets.py greps
both runs' files for canary credentials and checks the sockets they listened on).

One shared pair of runs instead of one per test module: the smoke pipeline is ~2 minutes on 2 cores, and CI
ran it once for the resume test and once more for the secrets test with the same stages and sizes.

`run_smoke_pipeline(root)` runs the real console script (`.venv/bin/afm`) twice as subprocesses, with:
- canary values in OPENAI_API_KEY, AFM_LLM_API_KEY, SERPER_API_KEY and AWS_SECRET_ACCESS_KEY;
- PREFECT_HOME and RAY_TMPDIR pointed into the run's own directories, stdout/stderr captured to files;
- the listening TCP sockets of each run's process tree sampled every second (`ss -ltnp`).
The fixture `smoke_pipeline` (tests/conftest.py) calls it at most once per session."""
from __future__ import annotations

import re
import secrets
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.flows.conftest import SMOKE_OVERRIDES
from tests.reliability.conftest import AFM_BIN, REPO, base_env

SMOKE_ARGS = ["pipeline", "--config", "configs/default.yaml", *(arg for o in SMOKE_OVERRIDES for arg in ("--set", o))]
# The first run's SFT is given a dataset file its distill artifact does not have, so it fails after distill,
# the base policy and pretraining are complete.
FAILING_OVERRIDE = "sft.dataset_file=missing.jsonl"


@dataclass
class Run:
    returncode: int
    output: str  # stdout + stderr


@dataclass
class SmokeRuns:
    home: Path
    ray_tmp: Path
    canaries: dict[str, str]
    failed: Run
    resumed: Run
    stages_after_failure: dict[str, bool]  # artifacts/stages/ after the failed run: directory -> has a manifest
    distill_manifest_after_failure: bytes
    listeners: set[tuple[str, str]]  # {(local address, command line)} of both runs


def canaries() -> dict[str, str]:
    token = secrets.token_hex(12)
    return {"OPENAI_API_KEY": f"sk-canary-{token}", "AFM_LLM_API_KEY": f"afm-canary-{token}",
            "SERPER_API_KEY": f"serper-canary-{token}", "AWS_SECRET_ACCESS_KEY": f"aws-canary-{token}"}


def run_smoke_pipeline(root: Path) -> SmokeRuns:
    home = root / "afm_home"
    (home / "prefect").mkdir(parents=True)
    ray_tmp = Path(tempfile.mkdtemp(prefix="afmray-", dir="/tmp"))  # short: Ray's socket paths are length-limited
    secrets_env = canaries()
    env = {**base_env(home), **secrets_env, "PREFECT_HOME": str(home / "prefect"), "RAY_TMPDIR": str(ray_tmp)}
    listeners: set[tuple[str, str]] = set()
    failed = _run(SMOKE_ARGS + ["--set", FAILING_OVERRIDE], env, home / "logs" / "failed", listeners)
    stages = home / "artifacts" / "stages"
    after_failure = {d.name: (d / "manifest.json").is_file() for d in stages.iterdir()} if stages.is_dir() else {}
    distill = next(stages.glob("distill-*/manifest.json"), None)
    distill_bytes = distill.read_bytes() if distill else b""
    resumed = _run(SMOKE_ARGS, env, home / "logs" / "resumed", listeners)
    return SmokeRuns(home, ray_tmp, secrets_env, failed, resumed, after_failure, distill_bytes, listeners)


def _run(args: list[str], env: dict[str, str], logs: Path, listeners: set[tuple[str, str]]) -> Run:
    logs.mkdir(parents=True)
    with open(logs / "stdout.txt", "w") as out, open(logs / "stderr.txt", "w") as err:
        proc = subprocess.Popen([str(AFM_BIN), *args], cwd=REPO, env=env, stdout=out, stderr=err)
        deadline = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < deadline:
            listeners |= _listeners(_descendants(proc.pid))
            time.sleep(1.0)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return Run(proc.returncode, (logs / "stdout.txt").read_text() + (logs / "stderr.txt").read_text())


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def _listeners(pids: set[int]) -> set[tuple[str, str]]:
    """{(local address, process name)} of LISTEN TCP sockets owned by `pids`."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    found = set()
    for line in out.splitlines():
        parts = line.split()
        for name, pid in re.findall(r'\("([^"]+)",pid=(\d+)', line):
            if int(pid) in pids:
                found.add((parts[3].rsplit(":", 1)[0], _cmdline(int(pid)) or name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return ""
