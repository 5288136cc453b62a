"""Serve a trained agent with Ray Serve, OpenAI-compatible: `/v1/models` (and `/v1/models/{id}`),
`/v1/chat/completions` (whole or streamed as server-sent events), and `/v1/agent`, which runs the whole
Chain-of-Agents loop with tools and returns the answer and trajectory (or streams each turn's segments as they
are produced).

    afm serve models:/afm-rl@champion --port 8000            # or a policy directory / s3:// artifact
    python -c "from openai import OpenAI; c = OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='none'); \\
               print(c.chat.completions.create(model='afm', messages=[{'role': 'user', 'content': 'hi'}]))"

    handle = run_server(ServeConfig(model=..., port=8000), blocking=False)   # tests: then handle.stop()

Every error is OpenAI's body `{"error": {"message", "type", "param", "code"}}`: 400 for a request that does not
validate (FastAPI's 422 included), 404 for an unknown model or route, 500 without a traceback (logged here).
The driver (this process, so the CLI's MLFLOW_TRACKING_URI and AFM_HOME) resolves models:/, runs:/ and s3://
URIs to a local directory before deploying: a registered version whose one copy is on this machine is used in
place, a remote one is downloaded. The replica gets that path, plus the tracking variables in its runtime_env.
On a multi-node cluster give a path every node sees. Stopping shuts Serve down (the HTTP proxy too, so the port
is free) and removes a downloaded copy. A port already in use is an error before anything starts.

Engines (`ServeConfig.engine`, `afm serve --engine`): `hf` runs the model in the replica with transformers;
`vllm` has the replica start vLLM's own OpenAI server as its child process and answer chat completions (whole
and streamed) and the /v1/agent loop through it, with this app's validation and error schema in front
(serving/vllm_server.py); `auto` (default) picks vllm when the Ray cluster has GPUs and `vllm.python` can import
vLLM, else hf. With vllm on GPUs the replica reserves `vllm.tensor_parallel_size` GPUs; the child stops with the
replica (and dies with it when the replica is killed).
Binds 127.0.0.1 unless `host` says otherwise. No authentication: put it behind a gateway before exposing it.
"""
# No `from __future__ import annotations` here: Ray Serve's ingress wraps the route methods, and FastAPI then
# cannot resolve string annotations (a ChatRequest body would become a required query parameter).
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import ray
import requests
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE
from starlette.exceptions import HTTPException as StarletteHTTPException

from afm.tracking import resolve_model_uri
from serving.openai_schema import AgentRequest, ChatRequest, OpenAIError, error_body, sse, validation_error
from serving.service import AgentService, ServeConfig, ServeError, check_tools, resolve_engine, serving_tools
from serving.vllm_server import VLLMConfig

log = logging.getLogger(__name__)
APP_NAME = "afm"
# What the replica must see as the CLI does (the stack's Ray was started without them). No credentials: a
# runtime_env is stored in Ray's GCS and listed by `ray list actors --detail`.
FORWARDED_ENV = ("MLFLOW_TRACKING_URI", "AFM_HOME", "AFM_STORE_URI", "AWS_ENDPOINT_URL")
INTERNAL_ERROR = "The server had an error while processing your request."

api = FastAPI(title="afm-platform agent server")


@api.exception_handler(OpenAIError)
async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


@api.exception_handler(RequestValidationError)
async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    error = validation_error(exc)
    return JSONResponse(error.body(), status_code=error.status)


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = f"Invalid URL ({request.method} {request.url.path})" if exc.status_code in (404, 405) else str(exc.detail)
    return JSONResponse(error_body(message), status_code=exc.status_code)


@api.middleware("http")
async def _internal_error(request: Request, call_next):
    # A middleware, not an Exception handler: Starlette re-raises after such a handler, and the body must not
    # carry the traceback either way.
    try:
        return await call_next(request)
    except Exception:  # noqa: BLE001 - every unexpected failure becomes a 500 in OpenAI's schema
        log.exception("internal error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(INTERNAL_ERROR, "server_error"), status_code=500)


def event_stream(events: Iterable[dict]) -> StreamingResponse:
    """SSE: one `data:` line per event, then `data: [DONE]`; a failure mid-stream (the status is already 200)
    is sent as an error event, which the openai client raises as an APIError."""

    def body() -> Iterator[bytes]:
        try:
            for event in events:
                yield sse(event)
        except Exception:  # noqa: BLE001
            log.exception("internal error while streaming")
            yield sse(error_body(INTERNAL_ERROR, "server_error"))
            return
        yield sse("[DONE]")

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@serve.deployment(name="afm-agent", num_replicas=1, ray_actor_options={"num_cpus": 1})
@serve.ingress(api)
class AgentDeployment:
    """The Ray Serve replica: holds one AgentService and maps the OpenAI-style routes onto it."""

    def __init__(self, cfg_json: str):
        self.service = AgentService(ServeConfig.model_validate_json(cfg_json))

    def __del__(self):  # Serve deletes the replica on shutdown: stop the mini-web with it
        service = getattr(self, "service", None)  # None when __init__ failed
        if service is not None:
            service.close()

    def check_health(self):  # Ray Serve calls it periodically; raising replaces the replica
        self.service.check_health()

    @api.get("/v1/models")
    def list_models(self):
        return self.service.models()

    @api.get("/v1/models/{model}")
    def retrieve_model(self, model: str):
        return self.service.model_card(model)

    @api.post("/v1/chat/completions")
    def chat_completions(self, req: ChatRequest):
        if req.stream:
            return event_stream(self.service.chat_chunks(req))
        return self.service.chat(req)

    @api.post("/v1/agent")
    def agent(self, req: AgentRequest):
        if req.stream:
            return event_stream(self.service.agent_events(req))
        return self.service.agent(req)


class PortInUseError(ServeError):
    """The requested port already has a listener: serving there would silently be someone else's server."""


def check_port_free(host: str, port: int) -> None:
    """Raise PortInUseError when something listens on host:port (SO_REUSEADDR, as the HTTP server binds, so a
    closed connection in TIME_WAIT does not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUseError(f"port {port} on {host} is already in use ({exc.strerror}); stop what listens "
                                 f"there or pass another --port") from exc


def prepare_model(uri: str) -> tuple[Path, Path | None]:
    """(local model directory, temporary copy to delete at stop or None): registry and S3 URIs are resolved
    here, in the driver, through the same tracking URI and store as the CLI; a registered version whose one
    copy is on this machine (a local stage store) is used in place, anything remote is downloaded."""
    if uri.startswith(("models:/", "runs:/", "s3://")):
        cache = Path(tempfile.mkdtemp(prefix="afm-serve-"))
        try:
            local = resolve_model_uri(uri, cache)
        except BaseException:
            shutil.rmtree(cache, ignore_errors=True)
            raise
        if local.is_relative_to(cache):
            return local, cache
        shutil.rmtree(cache)
        return local, None
    return resolve_model_uri(uri, Path()), None


@dataclass
class ServerHandle:
    """A running server; `stop()` shuts Serve and its HTTP proxy down, waits for the port, removes the copy."""

    url: str
    host: str
    port: int
    cache: Path | None
    own_ray: bool
    own_serve: bool = False  # False until this process starts Serve: never shut down another server's

    def stop(self, timeout_s: float = 30.0) -> None:
        try:
            if self.own_serve and ray.is_initialized():  # serve.shutdown() would otherwise start a Ray
                serve.shutdown()
            if self.own_ray:
                ray.shutdown()
        finally:
            if self.cache is not None:
                shutil.rmtree(self.cache, ignore_errors=True)
        if timeout_s <= 0:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                check_port_free(self.host, self.port)
                return
            except PortInUseError:
                time.sleep(0.2)
        raise PortInUseError(f"port {self.port} still in use {timeout_s:.0f} s after Serve shut down")


def serve_running() -> bool:
    """Whether this Ray cluster already runs Ray Serve (one Serve instance per cluster: serve.start would keep
    the other's HTTP port, and serve.run of our app would replace the other's)."""
    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        return True
    except ValueError:
        return False


def wait_ready(url: str, model_name: str, timeout_s: float) -> None:
    """Until GET /v1/models lists `model_name`: serve.run returning does not prove the proxy listens."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            reply = requests.get(f"{url}/models", timeout=5)
            if reply.ok and any(m.get("id") == model_name for m in reply.json().get("data", [])):
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise ServeError(f"nothing answers at {url} {timeout_s:.0f} s after deploying (see the Ray logs)")


def absolute_python(vllm: VLLMConfig) -> VLLMConfig:
    """`vllm.python` as an absolute path (a relative one or a name on PATH is the CLI's; the replica runs
    elsewhere). Not resolved: a venv's interpreter is a symlink that must stay one to find its packages."""
    if vllm.python is None:
        return vllm
    return vllm.model_copy(update={"python": str(Path(shutil.which(vllm.python) or vllm.python).absolute())})


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def run_server(cfg: ServeConfig, blocking: bool = True, ready_timeout_s: float = 120.0) -> ServerHandle:
    """Start Ray Serve on cfg.host:cfg.port with one replica of the agent service. Blocking: serve until
    SIGINT/SIGTERM, then stop. Otherwise return the handle (the caller stops it)."""
    check_port_free(cfg.host, cfg.port)
    model_dir, cache = prepare_model(cfg.model)
    url = f"http://{cfg.host}:{cfg.port}/v1"
    handle = ServerHandle(url, cfg.host, cfg.port, cache, own_ray=not ray.is_initialized())
    try:
        toolbox, corpus, tools_source = serving_tools(cfg, model_dir)
        check_tools(toolbox, corpus)
        if handle.own_ray:
            # RAY_ADDRESS (the stack's Ray) when set, else a local Ray that goes away with this process.
            ray.init(include_dashboard=False, log_to_driver=False)
        if serve_running():
            raise ServeError("Ray Serve already runs in this Ray cluster (another `afm serve`?); stop it first "
                             "(`serve shutdown`), or unset RAY_ADDRESS to serve from a Ray of this process")
        gpus = ray.cluster_resources().get("GPU", 0) > 0
        engine = resolve_engine(cfg, gpus)
        handle.own_serve = True
        serve.start(http_options={"host": cfg.host, "port": cfg.port})
        env = {name: os.environ[name] for name in FORWARDED_ENV if os.environ.get(name)}
        actor = {"num_cpus": 1, "runtime_env": {"env_vars": env}}
        if engine == "vllm" and gpus:  # Ray then sets CUDA_VISIBLE_DEVICES, which the vLLM child inherits
            actor["num_gpus"] = cfg.vllm.tensor_parallel_size
        local_cfg = cfg.model_copy(update={"model": str(model_dir), "engine": engine,
                                           "vllm": absolute_python(cfg.vllm)})
        serve.run(AgentDeployment.options(ray_actor_options=actor).bind(local_cfg.model_dump_json()), name=APP_NAME,
                  route_prefix="/", blocking=False)
        wait_ready(url, cfg.model_name, ready_timeout_s + (cfg.vllm.startup_timeout_s if engine == "vllm" else 0))
    except BaseException:
        handle.stop(timeout_s=0)
        raise
    if not blocking:
        return handle
    print(f"serving {cfg.model} as {cfg.model_name!r} at {url} (Ctrl-C to stop); /v1/agent tools: "
          f"{', '.join(toolbox.tools)}, {tools_source}; engine: {engine}", flush=True)
    # SIGTERM (kill, a supervisor) must stop Serve as Ctrl-C does, not leave the proxy answering on the port.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        handle.stop()
        print(f"stopped; port {cfg.port} is free", flush=True)
    return handle
