"""Secrets and network exposure: canary credentials in the environment of a real pipeline run never reach any
file the run writes, and every server the platform starts binds 127.0.0.1.

The slow tests read the session's smoke runs (tests/smoke_pipeline.py: the smoke pipeline failing in SFT, then
its resumed re-run, distill -> pretrain -> sft -> rl -> eval, ~2 min in all) with canary values in
OPENAI_API_KEY, AFM_LLM_API_KEY, SERPER_API_KEY and AWS_SECRET_ACCESS_KEY, PREFECT_HOME and RAY_TMPDIR pointed
into the runs' own directories, stdout/stderr captured to files; they grep every file (MLflow's db and
artifacts, the artifact store, work dirs, Prefect's db, Ray's session logs, the captured output) for the
canaries, and check the listening TCP sockets sampled from both runs' process trees (`ss -ltnp`).

    .venv/bin/pytest tests/reliability/test_secrets.py -q            # fast bind checks only with -m "not slow"
"""
from __future__ import annotations

import pytest

from afm.stack import StackConfig, _commands
from problems.miniweb import MiniWeb
from serving.app import ServeConfig
from tests.reliability.conftest import AFM_BIN

LOOPBACK = ("127.0.0.1", "[::1]", "::1")
# Ray's GCS/raylet/object manager listen on the node IP whatever ray.init is told (see docs/reliability.md).
RAY_PROCESSES = ("gcs_server", "raylet", "ray::", "default_worker", "dashboard", "runtime_env", "log_monitor",
                 "monitor.py", "ray_client_server", "agent")


@pytest.mark.slow
@pytest.mark.integration
def test_canary_secrets_never_reach_any_output_file(smoke_pipeline):
    runs = smoke_pipeline  # a failed run and its resumed re-run, canaries in both runs' environment
    assert runs.failed.returncode != 0 and runs.resumed.returncode == 0, runs.resumed.output[-3000:]
    roots = [runs.home, runs.ray_tmp]
    files = [p for root in roots for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    names = {p.name for p in files}
    # The scan covers what it claims to: tracking db, Prefect db, the store's manifests, the captured output.
    assert {"mlflow.db", "prefect.db", "manifest.json", "stdout.txt", "stderr.txt"} <= names
    assert any("session_" in str(p) for p in files)  # Ray's session logs
    leaks = []
    for path in files:
        data = path.read_bytes()
        leaks += [f"{path}: {var}" for var, value in runs.canaries.items() if value.encode() in data]
    assert leaks == [], leaks
    assert len(files) > 50


@pytest.mark.slow
@pytest.mark.integration
def test_servers_started_by_the_pipeline_bind_loopback(smoke_pipeline):
    listeners = smoke_pipeline.listeners
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
