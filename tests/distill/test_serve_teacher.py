"""The teacher against the platform's own server: `afm serve` (Ray Serve, OpenAI-compatible) started as a
subprocess on 127.0.0.1 with the tiny teacher model, used only through its public HTTP API. It has no guided
decoding, so replies are plain text: the tolerant parser, the retry budgets and the parse-failure counts carry
the protocol, and token counts come from the server's `usage`.

    .venv/bin/python -m pytest -q -m integration tests/distill/test_serve_teacher.py
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agents.teacher.mas import TeacherConfig, run_mas
from distill.rollout_work import build_llm_backend
from models.policy import save_policy
from tests.conftest import free_port
from tests.models.openai_server import tiny_teacher_engine, wait_for_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STARTUP_S = 240  # a local Ray + Serve start: ~30 s on 2 idle cores, much more under load


@pytest.fixture(scope="module")
def afm_serve(tmp_path_factory):
    engine, tok = tiny_teacher_engine()
    policy = save_policy(engine.model, tok, tmp_path_factory.mktemp("teacher") / "policy")
    port = free_port()
    log_path = Path(policy).parent / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "afm"), "serve", str(policy), "--port", str(port),
                                 "--set", "model_name=teacher"], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/v1"
        try:
            wait_for_server(url, proc, log_path, STARTUP_S)
            yield url
        finally:
            proc.terminate()  # afm serve shuts Ray Serve down on SIGTERM
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_mas_runs_against_afm_serve(afm_serve, world_setup, toolbox):
    cfg = TeacherConfig(backend="openai", endpoint=afm_serve, model="teacher", api_key_env="AFM_TEST_UNSET_KEY",
                        max_tokens=24, max_steps=6, observation_chars=120, temperature=0.7,
                        client={"max_concurrency": 2, "timeout_s": 120})
    backend = build_llm_backend(cfg)
    logs = [run_mas(p, backend, toolbox, cfg) for p in world_setup.problems[:2]]
    for log in logs:
        calls = [e for e in log.events if e.prompt_tokens]
        assert calls and all(e.completion_tokens > 0 for e in calls)  # the server's usage, per call
        assert log.teacher == "openai:teacher"
        # every coordinator reply either routed somewhere or was re-asked and then counted as a failure
        unrouted = sum(1 for a, b in zip(log.events, log.events[1:] + [None])
                       if a.role == "thinking" and (b is None or b.role == "thinking"))
        assert log.parse_failures.get("thinking", 0) == unrouted
