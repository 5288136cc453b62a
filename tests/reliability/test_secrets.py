"""Secrets and network exposure: canary credentials in the environment of a real pipeline run never reach any
file the run writes, and every server the platform starts binds 127.0.0.1.

The slow test runs the smoke pipeline ONCE (distill -> pretrain -> sft -> rl -> eval, ~1.5 min) with canary values in
OPENAI_API_KEY, AFM_LLM_API_KEY, SERPER_API_KEY and AWS_SECRET_ACCESS_KEY, PREFECT_HOME and RAY_TMPDIR pointed
into the run's own directories, stdout/stderr captured to files; then greps every file (MLflow's db and
artifacts, the artifact store, work dirs, Prefect's db, Ray's session logs, the captured output) for the
canaries. While it runs it samples the listening TCP sockets of the run's process tree (`ss -ltnp`).

    .venv/bin/pytest tests/reliability/test_secrets.py -q            # fast bind checks only with -m "not slow"
"""
from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from afm.stack import StackConfig, _commands
from problems.miniweb import MiniWeb
from serving.app import ServeConfig
from tests.flows.conftest import SMOKE_OVERRIDES
from tests.reliability.conftest import AFM_BIN, REPO, base_env

# The flow tests' smallest recipe: every stage runs for real, in the least time (the canaries and the sockets
# do not depend on how long each stage trains).
SMOKE_ARGS = ["pipeline", "--config", "configs/default.yaml", *(arg for o in SMOKE_OVERRIDES for arg in ("--set", o))]
LOOPBACK = ("127.0.0.1", "[::1]", "::1")
# Ray's GCS/raylet/object manager listen on the node IP whatever ray.init is told (see docs/reliability.md).
RAY_PROCESSES = ("gcs_server", "raylet", "ray::", "default_worker", "dashboard", "runtime_env", "log_monitor",
                 "monitor.py", "ray_client_server", "agent")


def _canaries() -> dict[str, str]:
    token = secrets.token_hex(12)
    return {"OPENAI_API_KEY": f"sk-canary-{token}", "AFM_LLM_API_KEY": f"afm-canary-{token}",
            "SERPER_API_KEY": f"serper-canary-{token}", "AWS_SECRET_ACCESS_KEY": f"aws-canary-{token}"}


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


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """Run the smoke pipeline once; yields (exit code, directories to scan, canaries, listeners seen)."""
    home = tmp_path_factory.mktemp("secrets") / "afm_home"
    (home / "prefect").mkdir(parents=True)
    ray_tmp = Path(tempfile.mkdtemp(prefix="afmray-", dir="/tmp"))  # short: Ray's socket paths are length-limited
    canaries = _canaries()
    env = {**base_env(home), **canaries, "PREFECT_HOME": str(home / "prefect"), "RAY_TMPDIR": str(ray_tmp)}
    logs = home / "logs"
    logs.mkdir()
    listeners: set[tuple[str, str]] = set()
    with open(logs / "stdout.txt", "w") as out, open(logs / "stderr.txt", "w") as err:
        proc = subprocess.Popen([str(AFM_BIN), *SMOKE_ARGS], cwd=REPO, env=env, stdout=out, stderr=err)
        deadline = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < deadline:
            listeners |= _listeners(_descendants(proc.pid))
            time.sleep(1.0)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    yield proc.returncode, [home, ray_tmp], canaries, listeners
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.integration
def test_canary_secrets_never_reach_any_output_file(smoke_run):
    code, roots, canaries, _ = smoke_run
    home = roots[0]
    assert code == 0, (home / "logs" / "stderr.txt").read_text()[-3000:]
    files = [p for root in roots for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    names = {p.name for p in files}
    # The scan covers what it claims to: tracking db, Prefect db, the store's manifests, the captured output.
    assert {"mlflow.db", "prefect.db", "manifest.json", "stdout.txt", "stderr.txt"} <= names
    assert any("session_" in str(p) for p in files)  # Ray's session logs
    leaks = []
    for path in files:
        data = path.read_bytes()
        leaks += [f"{path}: {var}" for var, value in canaries.items() if value.encode() in data]
    assert leaks == [], leaks
    assert len(files) > 50


@pytest.mark.slow
@pytest.mark.integration
def test_servers_started_by_the_pipeline_bind_loopback(smoke_run):
    _, _, _, listeners = smoke_run
    print("\n".join(f"{addr}  {cmd}" for addr, cmd in sorted(listeners)))  # shown with -rP: the measured listeners
    assert any("prefect" in cmd or "uvicorn" in cmd for _, cmd in listeners), listeners  # the ephemeral API server
    assert _exposed(listeners) == set(), _exposed(listeners)


def _exposed(listeners: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Non-loopback listeners that are not Ray's. Ray's processes are known by name; in the driver (the `afm`
    process itself) Ray's core-worker gRPC server listens on `*` (measured: `ray.init()` alone adds exactly
    that one listener), while our own servers there (MiniWeb) use 127.0.0.1 — so `*` in the driver is Ray's,
    and `0.0.0.0` or a node IP in it would be ours and fails."""
    return {(addr, cmd) for addr, cmd in listeners
            if addr not in LOOPBACK and not any(name in cmd for name in RAY_PROCESSES)
            and not (addr == "*" and str(AFM_BIN) in cmd)}


def test_server_defaults_bind_loopback(tmp_path):
    cfg = StackConfig(state_dir=tmp_path / "stack")
    assert cfg.host == "127.0.0.1"
    for name, (argv, _) in _commands(cfg).items():
        flag = {"s3": "-H", "mlflow": "--host", "prefect": "--host", "ray": "--node-ip-address"}[name]
        assert argv[argv.index(flag) + 1] == "127.0.0.1", name
    assert ServeConfig(model="x").host == "127.0.0.1"
    with MiniWeb({"/wiki/A": "<html></html>"}) as web:
        assert web._server.server_address[0] == "127.0.0.1" and web.address.startswith("127.0.0.1:")
