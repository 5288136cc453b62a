"""The local stack on 127.0.0.1: S3 (moto), MLflow (SQLite + S3 artifacts), Prefect server and a Ray head.

Usage (the `afm stack up|status|down` commands call these):
    env = stack_up(StackConfig())        # starts what is not running, waits for health, writes env.sh
    stack_status(StackConfig())          # {"s3": {"running": True, "healthy": True, "url": ...}, ...}
    stack_down(StackConfig())            # stops exactly the processes stack_up started; idempotent
    source .afm/stack/env.sh             # points clients (boto3, MLflow, Prefect, Ray) at the stack

State lives in `state_dir` (default `<AFM_HOME>/stack`): `pids.json` (PID + start time of every process it
started, written as each starts so a crash mid-startup can still be cleaned up), `logs/<service>.log`,
`env.sh`, `PREFECT_HOME` and Ray's temp dir. MLflow serves `mlflow_db`, by default `<AFM_HOME>/mlflow.db`: the
store the CLI writes when no server is set (afm/tracking.py), so one UI lists runs made with and without the
stack. Runs made without it keep their artifacts under <AFM_HOME>/mlartifacts, which this server reads in place.

Durability: MLflow (SQLite) and Prefect (SQLite in PREFECT_HOME) survive a restart; the S3 server is moto,
which keeps objects IN MEMORY, so artifacts (including MLflow's) are lost on `stack down`. moto's request
recorder (MOTO_ENABLE_RECORDING + replay) was tried and rejected: multipart uploads (every file > 8 MiB) do
not replay. For durable storage use infra/docker-compose.yml (MinIO) or a real S3 endpoint.

Network: moto, MLflow and Prefect bind `host` (127.0.0.1) only. Ray's GCS and raylet listen on ALL interfaces
(Ray resolves 127.0.0.1 to the node's IP), so the head runs with token auth (RAY_AUTH_MODE=token, a random
token in `state_dir/ray_auth_token`, mode 0600); clients get the same two variables from env.sh. The other
servers have no authentication: anyone with a shell on this machine can use them.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import time
import urllib.request
from pathlib import Path

from pydantic import Field

from afm.config import Config
from afm.paths import afm_home
from afm.processes import is_running, start_process, stop_processes

SERVICES = ("s3", "mlflow", "prefect", "ray")
# Dummy credentials: moto accepts any; clients and the MLflow server only need them to be set.
LOCAL_AWS_KEY_ID = "afm-local"
LOCAL_AWS_SECRET = "afm-local-secret"
# AF_UNIX socket paths are limited to 107 bytes; Ray puts sockets ~60 characters below its temp dir.
_MAX_RAY_TMPDIR_LENGTH = 45


class StackError(RuntimeError):
    """A local server did not start or become healthy; the message names the service and its log."""


class StackConfig(Config):
    """Where the local stack keeps its state and which 127.0.0.1 ports it binds."""

    state_dir: Path = Field(
        default_factory=lambda: afm_home() / "stack",
        description="Directory for pids.json, logs, env.sh, the MLflow db, PREFECT_HOME and Ray's temp dir.",
    )
    host: str = Field("127.0.0.1", description="Interface every server binds; keep it loopback-only.")
    s3_port: int = Field(9000, description="Port of the S3-compatible server (moto).")
    mlflow_port: int = Field(5000, description="Port of the MLflow tracking server (also serves the UI).")
    mlflow_db: Path = Field(
        default_factory=lambda: afm_home() / "mlflow.db",
        description="SQLite store the MLflow server serves: by default the one `make run` writes without the "
                    "stack (<AFM_HOME>/mlflow.db), so every run, with the stack or without, is in one UI.",
    )
    prefect_port: int = Field(4200, description="Port of the Prefect API server and UI.")
    ray_port: int = Field(6379, description="GCS port of the Ray head node (RAY_ADDRESS is host:ray_port).")
    ray_num_cpus: int = Field(2, description="CPUs the Ray head offers to tasks and actors.")
    bucket: str = Field("afm", description="S3 bucket created on start; MLflow artifacts go to s3://<bucket>/mlflow.")
    health_timeout_s: float = Field(180.0, description="Seconds to wait for all servers to answer health checks.")
    stop_timeout_s: float = Field(15.0, description="Seconds between SIGTERM and SIGKILL when stopping a server.")


def _url(cfg: StackConfig, port: int) -> str:
    return f"http://{cfg.host}:{port}"


def client_env(cfg: StackConfig) -> dict[str, str]:
    """Environment variables a client process needs to use the stack."""
    return {
        "AWS_ENDPOINT_URL": _url(cfg, cfg.s3_port),
        "AWS_ACCESS_KEY_ID": LOCAL_AWS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": LOCAL_AWS_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "MLFLOW_TRACKING_URI": _url(cfg, cfg.mlflow_port),
        "PREFECT_API_URL": f"{_url(cfg, cfg.prefect_port)}/api",
        "RAY_ADDRESS": f"{cfg.host}:{cfg.ray_port}",
        **_ray_auth_env(cfg),
        # Flows default their artifact store to this (tasks/stages.py), so datasets/checkpoints land in S3 too.
        "AFM_STORE_URI": f"s3://{cfg.bucket}/artifacts",
    }


def _ray_auth_env(cfg: StackConfig) -> dict[str, str]:
    """Token auth for Ray: its GCS and raylet listen on every interface whatever --node-ip-address says."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(cfg.state_dir / "ray_auth_token")}


def _ensure_ray_token(cfg: StackConfig) -> None:
    path = cfg.state_dir / "ray_auth_token"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _commands(cfg: StackConfig) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Command line and extra environment of each server."""
    bin_dir = Path(sys.executable).parent
    state = cfg.state_dir
    s3_env = {
        "AWS_ACCESS_KEY_ID": LOCAL_AWS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": LOCAL_AWS_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return {
        "s3": ([str(bin_dir / "moto_server"), "-H", cfg.host, "-p", str(cfg.s3_port)], {}),
        "mlflow": (
            [
                str(bin_dir / "mlflow"), "server",
                "--backend-store-uri", f"sqlite:///{cfg.mlflow_db.resolve()}",
                "--artifacts-destination", f"s3://{cfg.bucket}/mlflow",
                "--host", cfg.host, "--port", str(cfg.mlflow_port),
                # One worker and no job runner: ~0.5 GiB instead of ~2.7 GiB and 12 s instead of ~40 s to start.
                "--workers", "1",
            ],
            {**s3_env, "MLFLOW_S3_ENDPOINT_URL": _url(cfg, cfg.s3_port), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        ),
        "prefect": (
            [str(bin_dir / "prefect"), "server", "start", "--host", cfg.host, "--port", str(cfg.prefect_port)],
            {"PREFECT_HOME": str(state / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"},
        ),
        "ray": (
            [
                str(bin_dir / "ray"), "start", "--head", "--block",
                "--node-ip-address", cfg.host, "--port", str(cfg.ray_port),
                "--num-cpus", str(cfg.ray_num_cpus), "--include-dashboard=false", "--disable-usage-stats",
                # These two have fixed defaults (10001, 52365) that collide with any other Ray on the machine.
                "--ray-client-server-port", str(_free_port(cfg.host)),
                "--dashboard-agent-listen-port", str(_free_port(cfg.host)),
            ],
            # No drain on SIGTERM: Ray 2.60 marks the node draining and waits up to 30 s for every worker lease
            # to come back (for Kubernetes rolling upgrades of Serve), so with any driver still attached
            # (a notebook, a Prefect worker's flow) `stack down` waited out stop_timeout_s and then SIGKILLed
            # the head: 15.6 s. On a one-node dev stack there is nowhere to drain to.
            {"RAY_TMPDIR": str(state / "ray"), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", **_ray_auth_env(cfg)},
        ),
    }


# 5 s: a server that just started on a busy 2-core machine (CI) can take seconds to answer one request.
HEALTH_PROBE_TIMEOUT_S = 5.0


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=HEALTH_PROBE_TIMEOUT_S) as response:
            return response.status == 200
    except OSError:
        return False


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=HEALTH_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def is_healthy(cfg: StackConfig, service: str) -> bool:
    """Whether `service` answers: HTTP health endpoints for the servers, the GCS port for Ray."""
    checks = {
        "s3": lambda: _http_ok(f"{_url(cfg, cfg.s3_port)}/moto-api/"),
        "mlflow": lambda: _http_ok(f"{_url(cfg, cfg.mlflow_port)}/health"),
        "prefect": lambda: _http_ok(f"{_url(cfg, cfg.prefect_port)}/api/health"),
        "ray": lambda: _port_open(cfg.host, cfg.ray_port),
    }
    return checks[service]()


def _pids_path(cfg: StackConfig) -> Path:
    return cfg.state_dir / "pids.json"


def _read_pids(cfg: StackConfig) -> dict[str, dict]:
    path = _pids_path(cfg)
    return json.loads(path.read_text()) if path.exists() else {}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _log_tail(record: dict, lines: int = 20) -> str:
    log = Path(record["log"])
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def _create_bucket(cfg: StackConfig) -> None:
    import boto3

    client = boto3.client(
        "s3", endpoint_url=_url(cfg, cfg.s3_port), aws_access_key_id=LOCAL_AWS_KEY_ID,
        aws_secret_access_key=LOCAL_AWS_SECRET, region_name="us-east-1",
    )
    existing = {bucket["Name"] for bucket in client.list_buckets().get("Buckets", [])}
    if cfg.bucket not in existing:
        client.create_bucket(Bucket=cfg.bucket)


def _wait_healthy(cfg: StackConfig, services: list[str], records: dict[str, dict]) -> None:
    deadline = time.monotonic() + cfg.health_timeout_s
    pending = list(services)
    while pending:
        for service in list(pending):
            if is_healthy(cfg, service):
                pending.remove(service)
                if service == "s3":
                    _create_bucket(cfg)
            elif not is_running(records[service]):
                raise StackError(f"{service} exited during startup; log {records[service]['log']}:\n"
                                 f"{_log_tail(records[service])}")
        if pending and time.monotonic() > deadline:
            service = pending[0]
            raise StackError(f"{service} not healthy after {cfg.health_timeout_s:.0f} s; log "
                             f"{records[service]['log']}:\n{_log_tail(records[service])}")
        time.sleep(0.5)


def write_env_file(cfg: StackConfig) -> Path:
    """Write `env.sh` (`export KEY=value` lines) for `source`-ing in a shell."""
    path = cfg.state_dir / "env.sh"
    lines = [f"export {key}={value}" for key, value in client_env(cfg).items()]
    _write_atomic(path, "\n".join(lines) + "\n")
    return path


def stack_up(cfg: StackConfig) -> dict[str, str]:
    """Start every server that is not already running (all in parallel), wait for health, return client env."""
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    ray_tmpdir = cfg.state_dir / "ray"
    if len(str(ray_tmpdir)) > _MAX_RAY_TMPDIR_LENGTH:
        raise StackError(f"state_dir {cfg.state_dir} is too long for Ray's socket paths; pick one with "
                         f"'{ray_tmpdir}' at most {_MAX_RAY_TMPDIR_LENGTH} characters (e.g. under /tmp)")
    for sub in ("logs", "prefect", "ray"):
        (cfg.state_dir / sub).mkdir(exist_ok=True)
    cfg.mlflow_db.parent.mkdir(parents=True, exist_ok=True)
    _ensure_ray_token(cfg)
    records = {name: rec for name, rec in _read_pids(cfg).items() if is_running(rec)}
    commands = _commands(cfg)
    to_start = [name for name in SERVICES if name not in records]
    ports = {"s3": cfg.s3_port, "mlflow": cfg.mlflow_port, "prefect": cfg.prefect_port, "ray": cfg.ray_port}
    busy = [f"{name} ({cfg.host}:{ports[name]})" for name in to_start if _port_open(cfg.host, ports[name])]
    if busy:
        raise StackError(f"ports already in use by processes this stack did not start: {', '.join(busy)}; "
                         "stop them or choose other ports in StackConfig")
    for name in to_start:
        cmd, extra_env = commands[name]
        records[name] = start_process(cmd, {**os.environ, **extra_env}, cfg.state_dir / "logs" / f"{name}.log")
        _write_atomic(_pids_path(cfg), json.dumps(records, indent=2))
    try:
        _wait_healthy(cfg, list(SERVICES), records)
    except BaseException:
        # Leave nothing half-started behind: the caller gets the error and a clean slate.
        stack_down(cfg)
        raise
    write_env_file(cfg)
    return client_env(cfg)


def stack_status(cfg: StackConfig) -> dict[str, dict]:
    """Per service: PID, whether our process is running, whether it answers health checks, its URL."""
    records = _read_pids(cfg)
    env = client_env(cfg)
    urls = {"s3": env["AWS_ENDPOINT_URL"], "mlflow": env["MLFLOW_TRACKING_URI"],
            "prefect": env["PREFECT_API_URL"], "ray": env["RAY_ADDRESS"]}
    status = {}
    for name in SERVICES:
        record = records.get(name)
        running = record is not None and is_running(record)
        status[name] = {
            "pid": record["pid"] if record else None,
            "running": running,
            "healthy": running and is_healthy(cfg, name),
            "url": urls[name],
        }
    return status


def stack_down(cfg: StackConfig) -> dict[str, str]:
    """Stop every process stack_up recorded (by process group), then forget them; safe to call twice."""
    result = stop_processes(_read_pids(cfg), cfg.stop_timeout_s)
    _pids_path(cfg).unlink(missing_ok=True)
    return result
