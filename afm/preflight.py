"""Preflight checks the CLI runs before it starts a flow: configured servers answer, local inputs exist and parse.

Without them a closed MLflow/S3/Prefect/Ray port or a typo in a model path surfaces minutes later, deep inside a
Ray worker or after library retries, as a long traceback. With them the command exits 1 within seconds, naming
the endpoint (and the env var that set it) or the field and file.

Usage (afm/cli.py):
    problems = check_endpoints(store_uri=cfg.store_uri) + check_local_inputs({"sft.model_path": ...},
                                                                              trajectory_files=[...])
    if problems: print them, exit 1

Endpoints probed (a TCP connect with PROBE_TIMEOUT_S): MLFLOW_TRACKING_URI (http/https only), PREFECT_API_URL,
RAY_ADDRESS (host:port or ray://host:port), and AWS_ENDPOINT_URL when the store is s3://.
NOT covered: credentials and permissions (a reachable server that refuses us fails later, in the stage); real
AWS S3 without AWS_ENDPOINT_URL (not probed: boto3's standard retries apply); a server that accepts the TCP
connection but then hangs; an endpoint that goes away mid-run (the stages' transient-error retries handle that).
"""
from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from models.format import TrajectoryError, read_jsonl

PROBE_TIMEOUT_S = 3.0
_DEFAULT_PORTS = {"http": 80, "https": 443, "ray": 10001}
# Values that name a model or dataset without being a local path.
_REMOTE_PREFIXES = ("s3://", "models:/", "runs:/", "mlflow-artifacts:", "http://", "https://", "file://")


def _host_port(address: str) -> tuple[str, int]:
    """'http://h:5000/x' -> ('h', 5000); 'h:6379' -> ('h', 6379); raises ValueError when no port can be found."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    if not parts.hostname or port is None:
        raise ValueError(f"cannot read host:port from {address!r}")
    return parts.hostname, port


def probe_tcp(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None if `host:port` accepts a TCP connection within `timeout_s`, else the error as text."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return str(exc) or type(exc).__name__


def configured_endpoints(store_uri: str, env: Mapping[str, str] = os.environ) -> list[tuple[str, str, str]]:
    """[(service, env var, address)] of the servers this run will talk to, from the environment."""
    endpoints = []
    mlflow_uri = env.get("MLFLOW_TRACKING_URI", "")
    if mlflow_uri.startswith(("http://", "https://")):
        endpoints.append(("MLflow", "MLFLOW_TRACKING_URI", mlflow_uri))
    if env.get("PREFECT_API_URL"):
        endpoints.append(("Prefect", "PREFECT_API_URL", env["PREFECT_API_URL"]))
    ray_address = env.get("RAY_ADDRESS", "")
    if ray_address and ray_address not in ("auto", "local"):
        endpoints.append(("Ray", "RAY_ADDRESS", ray_address))
    store = store_uri or env.get("AFM_STORE_URI", "")
    if store.startswith("s3://") and env.get("AWS_ENDPOINT_URL"):
        endpoints.append(("S3", "AWS_ENDPOINT_URL", env["AWS_ENDPOINT_URL"]))
    return endpoints


def check_endpoints(store_uri: str = "", env: Mapping[str, str] = os.environ) -> list[str]:
    """One message per configured endpoint that does not accept a connection (empty list: all reachable)."""
    problems = []
    for service, var, address in configured_endpoints(store_uri, env):
        try:
            host, port = _host_port(address)
        except ValueError as exc:
            problems.append(f"{service} address {var}={address!r} is malformed: {exc}")
            continue
        error = probe_tcp(host, port)
        if error is not None:
            problems.append(
                f"{service} at {address} ({var}) unreachable: {error}. Start it (`afm stack up`, then "
                f"`source .afm/stack/env.sh`) or unset {var} to run without it."
            )
    return problems


def check_local_inputs(paths: Mapping[str, str], trajectory_files: Iterable[str] = ()) -> list[str]:
    """Messages for config fields naming a local path that does not exist, and for trajectory JSONL files with
    a bad row (the message names file and line). URIs (s3://, models:/, ...) and empty values are skipped."""
    problems = []
    for field, value in paths.items():
        if value and not value.startswith(_REMOTE_PREFIXES) and not Path(value).exists():
            problems.append(f"field '{field}': {value!r} does not exist; pass an existing directory or a URI "
                            "(s3://..., models:/name/version)")
    for path in trajectory_files:
        if path.endswith(".jsonl") and not path.startswith(_REMOTE_PREFIXES) and Path(path).is_file():
            try:
                for _ in read_jsonl(path):
                    pass
            except (TrajectoryError, ValueError) as exc:
                problems.append(f"{exc}; fix or drop that line")
    return problems
