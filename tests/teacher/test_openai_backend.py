"""OpenAIChatBackend against a real HTTP server on 127.0.0.1 that answers scripted statuses: retries on 429, 5xx
and timeouts only, none on other 4xx; the per-endpoint concurrency limit; usage counts; the API key (from the
environment or a Prefect Secret block) never shows.

    .venv/bin/python -m pytest -q tests/teacher/test_openai_backend.py
"""
from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from agents.teacher.backends import OpenAIChatBackend, OpenAIClientConfig, backoff_delay
from agents.teacher.mas import TeacherConfig, run_mas

CANARY = "sk-canary-7f3a9c1e-do-not-print"
FAST = OpenAIClientConfig(max_retries=3, backoff_base_s=0.01, backoff_max_s=0.05, timeout_s=5)
MESSAGES = [{"role": "user", "content": "hi"}]


class ScriptedServer:
    """Each POST takes the next (status, delay_s) from `script` (the last one repeats) and counts requests, keys
    seen and the most requests in flight at once."""

    def __init__(self, script: list[tuple[int, float]], reply: str = "NEXT: planning"):
        self.script, self.reply = list(script), reply
        self.requests, self.in_flight, self.max_in_flight = 0, 0, 0
        self.auth: list[str] = []
        self.lock = threading.Lock()

    def handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                with server.lock:
                    status, delay = server.script[min(server.requests, len(server.script) - 1)]
                    server.requests += 1
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    server.auth.append(self.headers.get("Authorization", ""))
                time.sleep(delay)
                with server.lock:
                    server.in_flight -= 1
                body = ({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": server.reply}}],
                         "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}}
                        if status == 200 else {"error": {"message": f"scripted {status}", "type": "x"}})
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    if status == 429:
                        self.send_header("Retry-After", "0")
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

        return Handler


@contextmanager
def serve(script, reply="NEXT: planning"):
    scripted = ScriptedServer(script, reply)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), scripted.handler())
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield scripted, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def backend(url, client=FAST, key_env="AFM_TEST_TEACHER_KEY"):
    return OpenAIChatBackend(url, "m", key_env, temperature=0.0, max_tokens=8, client=client)


@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_transient_statuses_are_retried(status):
    with serve([(status, 0), (status, 0), (200, 0)]) as (server, url):
        out = backend(url).complete("thinking", MESSAGES, None)
    assert server.requests == 3 and out.text == "NEXT: planning"
    assert (out.prompt_tokens, out.completion_tokens) == (11, 3)  # the server's usage, not an estimate


def test_a_timeout_is_retried():
    client = FAST.model_copy(update={"timeout_s": 0.3})
    with serve([(200, 1.0), (200, 0)]) as (server, url):
        out = backend(url, client).complete("thinking", MESSAGES, None)
    assert server.requests == 2 and out.completion_tokens == 3


@pytest.mark.parametrize("status,error", [(400, openai.BadRequestError), (401, openai.AuthenticationError),
                                          (404, openai.NotFoundError), (422, openai.UnprocessableEntityError)])
def test_other_client_errors_are_not_retried(status, error):
    with serve([(status, 0), (200, 0)]) as (server, url):
        with pytest.raises(error):
            backend(url).complete("thinking", MESSAGES, None)
    assert server.requests == 1


def test_retries_give_up_after_the_budget():
    with serve([(503, 0)]) as (server, url):
        with pytest.raises(openai.InternalServerError):
            backend(url).complete("thinking", MESSAGES, None)
    assert server.requests == FAST.max_retries + 1


def test_backoff_doubles_with_jitter_and_respects_the_cap():
    import random

    rng = random.Random(0)
    delays = [backoff_delay(a, 1.0, 10.0, rng) for a in range(6)]
    assert 0.5 <= delays[0] <= 1.0 and 1.0 <= delays[1] <= 2.0 and 4.0 <= delays[3] <= 8.0
    assert all(d <= 10.0 for d in delays) and len(set(delays)) == len(delays)
    assert backoff_delay(0, 1.0, 10.0, rng, retry_after_s=30.0) == 10.0  # Retry-After, capped


def test_the_concurrency_limit_per_endpoint_holds():
    client = FAST.model_copy(update={"max_concurrency": 3})
    with serve([(200, 0.15)]) as (server, url):
        # two backend objects on one endpoint share the process-wide bound
        backends = [backend(url, client), backend(url, client)]
        with ThreadPoolExecutor(12) as pool:
            list(pool.map(lambda i: backends[i % 2].complete("thinking", MESSAGES, None), range(12)))
    assert server.requests == 12 and server.max_in_flight == 3


def test_the_api_key_appears_in_no_output(monkeypatch, caplog, world_setup, toolbox, tmp_path):
    monkeypatch.setenv("AFM_TEST_TEACHER_KEY", CANARY)
    caplog.set_level(logging.DEBUG)  # openai and httpx log requests at DEBUG
    outputs = []
    with serve([(200, 0)]) as (server, url):
        b = backend(url)
        cfg = TeacherConfig(backend="openai", endpoint=url, model="m", api_key_env="AFM_TEST_TEACHER_KEY", max_steps=4)
        log = run_mas(world_setup.problems[0], b, toolbox, cfg)
        outputs += [json.dumps(log.to_dict()), repr(b), repr(cfg), cfg.model_dump_json(), str(vars(b))]
    with serve([(401, 0)]) as (_, url):
        try:
            backend(url).complete("thinking", MESSAGES, None)
        except openai.AuthenticationError as exc:
            outputs += [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
    with serve([(503, 0)]) as (_, url):
        try:
            backend(url).complete("thinking", MESSAGES, None)
        except openai.InternalServerError as exc:
            outputs += [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
    outputs.append(caplog.text)
    assert server.auth and all(a == f"Bearer {CANARY}" for a in server.auth)  # it was sent, to the server only
    assert len(outputs) == 12 and not [o for o in outputs if CANARY in o]


@pytest.mark.integration
@pytest.mark.slow
def test_the_key_can_come_from_a_prefect_secret_block(monkeypatch, caplog):
    from prefect.blocks.system import Secret
    from prefect.testing.utilities import prefect_test_harness

    monkeypatch.delenv("AFM_TEST_TEACHER_KEY", raising=False)
    caplog.set_level(logging.DEBUG)
    client = FAST.model_copy(update={"api_key_secret_block": "afm-teacher-key"})
    with prefect_test_harness(server_startup_timeout=90):
        Secret(value=CANARY).save("afm-teacher-key")
        with serve([(200, 0)]) as (server, url):
            b = backend(url, client)
            b.complete("thinking", MESSAGES, None)
    assert server.auth == [f"Bearer {CANARY}"]
    assert CANARY not in repr(b) + str(vars(b)) + client.model_dump_json() + caplog.text
