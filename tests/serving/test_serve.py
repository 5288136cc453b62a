"""`afm serve` on the tiny model, driven by the official `openai` client: /v1/models, chat completions whole
and streamed (SSE chunks, usage chunk, [DONE]), every invalid request a 4xx in OpenAI's error schema, and
/v1/agent whole and streamed, with the toolbox and corpus recorded with the registered model.

The model is served as `models:/afm-serve-test/1` from a temporary MLflow store named by MLFLOW_TRACKING_URI
(the driver resolves it), registered inside a run whose params carry a toolbox, as RL registers its model.
One Ray start-up for the whole module.

    .venv/bin/pytest tests/serving/test_serve.py -q      # ~1-2 min on 2 cores
"""
from __future__ import annotations

import json

import pytest
import requests

from tests.conftest import free_port
from tests.serving.policies import tiny_serving_policy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUESTION = [{"role": "user", "content": "Capital of Ludoria?"}]
RECORDED_TOOLS = ["web_search", "crawl_page", "code"]


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    texts = ["<think>Search the capital.</think><web_search>Ludoria</web_search><answer>Vazoma</answer>",
             "What is the capital of Ludoria? Vazoma is a city."] * 20
    return tiny_serving_policy(tmp_path_factory.mktemp("policy") / "tiny", texts)


@pytest.fixture(scope="module")
def registered_model(tiny_policy, tmp_path_factory):
    """models:/afm-serve-test/1 in a fresh store, registered in a run whose params hold a toolbox + corpus."""
    from afm import tracking
    from agents.tools.toolbox import ToolboxConfig

    home = tmp_path_factory.mktemp("afm-home")
    corpus = home / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "title": "Ludoria", "url": "http://miniweb.local/wiki/Ludoria",
                                  "text": "The capital of Ludoria is Vazoma."}) + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AFM_HOME", str(home))
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'mlflow.db'}")
        toolbox = ToolboxConfig(tools=RECORDED_TOOLS, corpus_path=corpus, cache_dir=home / "cache")
        with tracking.start_run("rl", "serve-test", params={"toolbox": toolbox.model_dump(mode="json")}):
            version = tracking.register_model(tiny_policy, "afm-serve-test", tags={"stage": "rl"})
        yield f"models:/afm-serve-test/{version}"


@pytest.fixture(scope="module")
def server(registered_model, tmp_path_factory):
    import ray

    from serving.app import ServeConfig, run_server

    ray.init(num_cpus=2, include_dashboard=False)
    cfg = ServeConfig(model=registered_model, port=free_port(), max_new_tokens=16, max_tokens_limit=64)
    handle = run_server(cfg, blocking=False)
    yield handle.url
    handle.stop()
    ray.shutdown()


@pytest.fixture
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server, api_key="unused", max_retries=0)


def test_openai_client_talks_to_the_server(client):
    import openai

    assert [m.id for m in client.models.list().data] == ["afm"]
    assert client.models.retrieve("afm").id == "afm"
    with pytest.raises(openai.NotFoundError, match="The model 'gpt-x' does not exist"):
        client.models.retrieve("gpt-x")
    reply = client.chat.completions.create(model="afm", messages=QUESTION, max_tokens=8, temperature=0)
    assert reply.choices[0].message.role == "assistant"
    assert isinstance(reply.choices[0].message.content, str)
    assert 1 <= reply.usage.completion_tokens <= 8
    again = client.chat.completions.create(model="afm", messages=QUESTION, max_tokens=8, temperature=0)
    assert again.choices[0].message.content == reply.choices[0].message.content  # greedy is deterministic
    parts = client.chat.completions.create(  # content as a list of text parts: the same prompt
        model="afm", messages=[{"role": "user", "content": [{"type": "text", "text": "Capital of "},
                                                            {"type": "text", "text": "Ludoria?"}]}],
        max_tokens=8, temperature=0)
    assert parts.choices[0].message.content == reply.choices[0].message.content
    assert parts.usage.prompt_tokens == reply.usage.prompt_tokens


def test_chat_streams_chunks_with_usage(client):
    whole = client.chat.completions.create(model="afm", messages=QUESTION, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model="afm", messages=QUESTION, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content]
    assert len(content) >= 2  # token by token, not one block
    assert "".join(content) == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    plain = list(client.chat.completions.create(model="afm", messages=QUESTION, max_tokens=4, stream=True))
    assert all(c.usage is None for c in plain)  # usage only when asked


def test_stream_is_sse_ending_with_done(server):
    body = {"model": "afm", "messages": QUESTION, "max_tokens": 4, "stream": True}
    with requests.post(f"{server}/chat/completions", json=body, stream=True, timeout=60) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in reply.iter_lines(decode_unicode=True) if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[0].removeprefix("data: "))["object"] == "chat.completion.chunk"


@pytest.mark.parametrize("change, says", [
    ({"messages": []}, "messages"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10**9}, "max_tokens is too large"),
    ({"max_tokens": 65}, "max_tokens is too large"),  # above the server's cap (64)
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"n": 2}, "n"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]},
     "messages.0.content"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
])
def test_invalid_requests_are_400_in_openai_schema(client, change, says):
    import openai

    kwargs = {"model": "afm", "messages": QUESTION, "max_tokens": 4, **change}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**kwargs)
    error = caught.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert says in error["message"] and says in str(caught.value)
    assert "Traceback" not in caught.value.response.text


def test_invalid_stream_request_is_400_before_any_chunk(client):
    import openai

    with pytest.raises(openai.BadRequestError, match="max_tokens is too large"):
        client.chat.completions.create(model="afm", messages=QUESTION, max_tokens=10**6, stream=True)


def test_unknown_model_and_route_are_404_in_openai_schema(client, server):
    import openai

    with pytest.raises(openai.NotFoundError, match="The model 'gpt-x' does not exist") as caught:
        client.chat.completions.create(model="gpt-x", messages=QUESTION, max_tokens=4)
    assert caught.value.response.json()["error"]["code"] == "model_not_found"
    reply = requests.post(f"{server}/completions", json={"model": "afm", "prompt": "hi"}, timeout=30)
    assert reply.status_code == 404
    assert reply.json() == {"error": {"message": "Invalid URL (POST /v1/completions)",
                                      "type": "invalid_request_error", "param": None, "code": None}}
    malformed = requests.post(f"{server}/chat/completions", data="{not json", timeout=30,
                              headers={"content-type": "application/json"})
    assert malformed.status_code == 400 and set(malformed.json()["error"]) == {"message", "type", "param", "code"}


def test_second_server_in_the_same_ray_is_refused_and_the_first_keeps_serving(server, client, tiny_policy):
    from serving.app import ServeConfig, run_server
    from serving.service import ServeError

    with pytest.raises(ServeError, match="Ray Serve already runs in this Ray cluster"):
        run_server(ServeConfig(model=str(tiny_policy), port=free_port()), blocking=False)
    assert [m.id for m in client.models.list().data] == ["afm"]


def test_agent_answers_with_the_recorded_toolbox(client):
    out = client.post("/agent", body={"question": "What is the capital of Ludoria?"}, cast_to=object)
    assert out["object"] == "agent.result"
    assert out["tools"] == RECORDED_TOOLS  # recorded with the model, not the code-only default
    assert out["status"] in {"answered", "max_turns", "token_budget", "format_error"}
    assert out["turns"] >= 1
    assert isinstance(out["trajectory"], list) and isinstance(out["tool_calls"], list)
    assert out["usage"]["total_tokens"] >= out["usage"]["completion_tokens"] >= 1


def test_agent_streams_each_turn_then_the_result(client):
    from openai import Stream

    events = list(client.post("/agent", body={"question": "What is the capital of Ludoria?", "stream": True},
                              cast_to=object, stream=True, stream_cls=Stream[object]))
    turns, result = events[:-1], events[-1]
    assert result["object"] == "agent.result"
    assert [e["object"] for e in turns] == ["agent.turn"] * result["turns"]
    assert [e["turn"] for e in turns] == list(range(1, result["turns"] + 1))
    assert [s for e in turns for s in e["segments"]] == result["trajectory"]
    whole = client.post("/agent", body={"question": "What is the capital of Ludoria?"}, cast_to=object)
    assert whole["text"] == result["text"]  # greedy: streaming changes the delivery, not the episode
