"""Preflight checks the CLI runs before it starts a flow: configured servers answer, local inputs exist and parse.

Without them a closed MLflow/S3/Prefect/Ray port or a typo in a model path surfaces minutes later, deep inside a
Ray worker or after library retries, as a long traceback. With them the command exits 1 within seconds, naming
the endpoint (and the env var that set it) or the field and file.

Usage (cli/app.py):
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


# --- cluster recipes (issue #22): GPUs, vLLM, teacher/judge endpoints -------------------------------------------
# What a GPU recipe (configs/qwen7b-cluster.yaml) needs before any Ray actor starts. `check_cluster(cfg)` reads
# the stage sections present in `cfg` (a pipeline or stage config, or its dict):
# - GPUs: the most any one stage asks for at once (stages run one after another): sft `num_workers` (use_gpu),
#   rl `num_learners` (use_gpu) + `pool.rollout_workers * pool.gpus_per_worker` (pool.use_gpu), eval the same
#   for its pool. Counted on this machine (torch.cuda.device_count) or, with RAY_ADDRESS, on the Ray cluster
#   (its GPU total now; an autoscaling cluster that starts GPU nodes on demand: AFM_PREFLIGHT_SKIP_GPUS=1).
# - vLLM imports (in a subprocess, so a broken install's import error is caught, not raised here) when a pool
#   has engine: vllm.
# - Every OpenAI-compatible endpoint the config names answers GET <base>/models: the distill teacher
#   (backend: openai), the RL and eval judges (judge: llm); and serves the configured model when it lists any.
GPU_ENV_SKIP = "AFM_PREFLIGHT_SKIP_GPUS"
ENDPOINT_TIMEOUT_S = 5.0
VLLM_IMPORT_TIMEOUT_S = 180.0


def _as_dict(cfg) -> dict:
    return cfg.model_dump(mode="json") if hasattr(cfg, "model_dump") else dict(cfg)


def _pool_gpus(pool: dict | None) -> float:
    if not pool or not pool.get("use_gpu"):
        return 0.0
    return pool.get("rollout_workers", 1) * pool.get("gpus_per_worker", 1.0)


def requested_gpus(cfg) -> dict[str, int]:
    """{stage: GPUs it asks for at once} for the stages in `cfg` that use any."""
    import math

    data = _as_dict(cfg)
    wanted: dict[str, float] = {}
    sft = data.get("sft") or {}
    if sft.get("use_gpu"):
        wanted["sft"] = sft.get("num_workers", 1)
    rl = data.get("rl") or {}
    rl_gpus = (rl.get("num_learners", 1) if rl.get("use_gpu") else 0) + _pool_gpus(rl.get("pool"))
    if rl_gpus:
        wanted["rl"] = rl_gpus
    eval_gpus = _pool_gpus((data.get("eval") or {}).get("pool"))
    if eval_gpus:
        wanted["eval"] = eval_gpus
    return {stage: math.ceil(n) for stage, n in wanted.items()}


def local_gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def ray_cluster_gpu_count(address: str) -> int:
    """GPUs the Ray cluster at `address` has now (connects as a client, then disconnects)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return int(ray.cluster_resources().get("GPU", 0))
    finally:
        if started:
            ray.shutdown()


def vllm_import_error(timeout_s: float = VLLM_IMPORT_TIMEOUT_S) -> str | None:
    """None when `import vllm` succeeds in a fresh interpreter of this environment, else its last error line."""
    import subprocess
    import sys

    try:
        proc = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"import vllm did not finish in {timeout_s:g} s"
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {proc.returncode}"


def configured_llm_endpoints(cfg) -> list[tuple[str, str, str, str, str]]:
    """[(what, field, base URL, model, API-key env var)] of the OpenAI-compatible servers `cfg` will call (the
    judges read OPENAI_API_KEY: training/rewards.py)."""
    data = _as_dict(cfg)
    found = []
    teacher = (data.get("distill") or {}).get("teacher") or data.get("teacher") or {}
    if teacher.get("backend") == "openai" and teacher.get("endpoint"):
        found.append(("teacher", "distill.teacher.endpoint", teacher["endpoint"], teacher.get("model", ""),
                      teacher.get("api_key_env") or "OPENAI_API_KEY"))
    for section in ("rl", "eval"):
        stage = data.get(section) or {}
        if stage.get("judge") == "llm":
            found.append((f"{section} judge", f"{section}.judge_base_url", stage.get("judge_base_url", ""),
                          stage.get("judge_model", ""), "OPENAI_API_KEY"))
    return found


def probe_openai_endpoint(base_url: str, model: str = "", api_key: str = "",
                          timeout_s: float = ENDPOINT_TIMEOUT_S) -> str | None:
    """None when GET <base_url>/models answers 200 with a model list that has `model` (or lists none), else why."""
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(base_url.rstrip("/") + "/models",
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 (configured endpoint)
            body = json.loads(resp.read().decode("utf-8") or "{}")
    except urllib.error.HTTPError as exc:
        hint = " (set the API key variable the config names)" if exc.code in (401, 403) else ""
        return f"answered HTTP {exc.code} to GET /models{hint}"
    except (urllib.error.URLError, OSError) as exc:
        return f"unreachable: {getattr(exc, 'reason', exc)}"
    except ValueError as exc:
        return f"GET /models did not return JSON ({exc}); is this an OpenAI-compatible /v1 base URL?"
    served = [m.get("id") for m in body.get("data", []) if isinstance(m, dict)] if isinstance(body, dict) else []
    if model and served and model not in served:
        return f"does not serve model {model!r} (it serves {served[:5]})"
    return None


def check_cluster(cfg, env: Mapping[str, str] = os.environ, gpu_count=None, vllm_probe=None) -> list[str]:
    """Problems of a GPU/cluster recipe, one message each: what failed and what to do (empty: all fine).
    `gpu_count() -> (count, where)` and `vllm_probe() -> error | None` are injectable for tests."""
    problems = []
    wanted = requested_gpus(cfg)
    if wanted and env.get(GPU_ENV_SKIP) != "1":
        if gpu_count is None:
            ray_address = env.get("RAY_ADDRESS", "")
            if ray_address and ray_address != "local":
                def gpu_count():
                    return ray_cluster_gpu_count(ray_address), f"the Ray cluster at RAY_ADDRESS={ray_address}"
            else:
                def gpu_count():
                    return local_gpu_count(), "this machine (torch.cuda.device_count)"
        have, where = gpu_count()
        stage, need = max(wanted.items(), key=lambda item: item[1])
        if have < need:
            asks = ", ".join(f"{s} {n}" for s, n in wanted.items())
            problems.append(
                f"GPUs: the config asks for {need} at once ({asks}) but {where} has {have}. Lower the workers "
                f"(sft.num_workers, rl.num_learners, rl.pool.rollout_workers, eval.pool.rollout_workers), run on a "
                f"cluster with more GPUs (infra/k8s/raycluster.yaml, docs/cluster.md), or, when an autoscaler "
                f"adds GPU nodes on demand, set {GPU_ENV_SKIP}=1.")
    data = _as_dict(cfg)
    vllm_users = [f"{s}.pool.engine" for s in ("rl", "eval")
                  if ((data.get(s) or {}).get("pool") or {}).get("engine") == "vllm"]
    if vllm_users:
        error = (vllm_probe or vllm_import_error)()
        if error is not None:
            problems.append(
                f"vLLM: {', '.join(vllm_users)} is 'vllm' but `import vllm` fails here: {error}. Run in the worker "
                f"image (infra/Dockerfile.worker installs infra/requirements-gpu.lock) or set the engine to 'hf'.")
    for what, field, url, model, key_env in configured_llm_endpoints(cfg):
        if not url:
            problems.append(f"{what}: {field} is empty; set it to the OpenAI-compatible base URL (…/v1)")
            continue
        error = probe_openai_endpoint(url, model, env.get(key_env, ""))
        if error is not None:
            model_field = field.replace("judge_base_url", "judge_model").replace("endpoint", "model")
            problems.append(f"{what} at {url} ({field}) {error}. Start that server, or fix {field} / "
                            f"{model_field} (API key from ${key_env}).")
    return problems
