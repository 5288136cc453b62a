"""The serving pieces without Ray: completions with stop strings (whole and streamed agree), the toolbox and
corpus recorded with a registered model and read back for /v1/agent, and the error paths that the Ray tests
cannot provoke (an exception inside a route or mid-stream: a 500 / an error event, no traceback).

    .venv/bin/pytest tests/serving/test_service.py -q      # seconds
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from serving.app import _internal_error, event_stream
from serving.openai_schema import ChatRequest
from serving.service import AgentService, ServeConfig, serving_tools


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from models.tiny import TinyModelConfig, create_default_policy

    texts = ["The capital of Ludoria is Vazoma.", "What is the capital of Ludoria?"] * 20
    cfg = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
    policy = create_default_policy(tmp_path_factory.mktemp("policy") / "tiny", texts, cfg, vocab_size=400)
    svc = AgentService(ServeConfig(model=str(policy)))
    yield svc
    svc.close()


def ask(**fields) -> ChatRequest:
    return ChatRequest.model_validate({"model": "afm", "messages": [{"role": "user", "content": "Capital?"}],
                                       "temperature": 0, **fields})


def test_stop_string_ends_the_completion_and_is_not_returned(service):
    # Sampled with a seed: varied text from the untrained model (greedy repeats one token), still reproducible.
    sampled = {"max_tokens": 24, "temperature": 1, "seed": 7}
    full = service.chat(ask(**sampled))["choices"][0]["message"]["content"]
    assert service.chat(ask(**sampled))["choices"][0]["message"]["content"] == full
    stop = full[4:7]
    assert full.find(stop) > 0 and len(set(full)) > 3, repr(full)
    cut = service.chat(ask(**sampled, stop=stop))
    assert cut["choices"][0]["message"]["content"] == full[:full.find(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"
    streamed = "".join(c["choices"][0]["delta"].get("content", "")
                       for c in service.chat_chunks(ask(**sampled, stop=[stop, "zzzz"])) if c["choices"])
    assert streamed == full[:full.find(stop)]  # held-back text never leaks part of a stop string


def test_recorded_toolbox_and_corpus_come_back_with_the_model(tmp_path, monkeypatch, service):
    from afm import tracking
    from agents.tools.toolbox import ToolboxConfig, build_toolbox
    from problems.miniweb import serve_corpus

    monkeypatch.setenv("AFM_HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    corpus = tmp_path / "work" / "corpus.jsonl"
    corpus.parent.mkdir()
    corpus.write_text(json.dumps({"id": "1", "title": "Ludoria", "url": "http://miniweb.local/wiki/Ludoria",
                                  "text": "The capital of Ludoria is Vazoma."}) + "\n")
    toolbox = ToolboxConfig(tools=["web_search", "code"], corpus_path=corpus, search_top_k=1,
                            cache_dir=tmp_path / "cache", web_search_endpoint="https://me:hunter22@search.example")
    with tracking.start_run("rl", "record-tools", params={"toolbox": toolbox.model_dump(mode="json")}):
        version = tracking.register_model(service.cfg.model, "afm-tools-test", tags={})
    corpus.unlink()  # the run's corpus was a temporary file; the record keeps its own copy
    model_dir = tracking.resolve_model_uri(f"models:/afm-tools-test/{version}", tmp_path / "download")

    served, served_corpus, source = serving_tools(ServeConfig(model=str(model_dir)), model_dir)
    assert source.startswith("recorded with the model")
    assert served.tools == ["web_search", "code"] and served.search_top_k == 1 and served.cache_dir is None
    assert served.web_search_api_key_env == "SERPER_API_KEY"  # an env var's name, kept (not redacted)
    assert served.web_search_endpoint == "<redacted>"  # credentials in a URL are not
    with serve_corpus(served, served_corpus) as live:
        assert "Vazoma" in build_toolbox(live).call("web_search", "Ludoria capital").text
    explicit = ToolboxConfig(tools=["code"])
    assert serving_tools(ServeConfig(model=str(model_dir), toolbox=explicit), model_dir)[0] == explicit
    bare = Path(service.cfg.model)  # a directory nothing was recorded in
    plain = serving_tools(ServeConfig(model=str(bare)), bare)
    assert plain[0].tools == ["code"] and plain[1] is None and plain[2].startswith("default")


def failing_app() -> FastAPI:
    app = FastAPI()
    app.middleware("http")(_internal_error)

    def events():
        yield {"object": "agent.turn", "turn": 1}
        raise RuntimeError("secret internal detail")

    @app.get("/boom")
    def boom():
        raise RuntimeError("secret internal detail")

    @app.get("/stream")
    def stream():
        return event_stream(events())

    return app


def test_internal_errors_are_500_or_an_error_event_without_details():
    client = TestClient(failing_app(), raise_server_exceptions=False)
    reply = client.get("/boom")
    assert reply.status_code == 500
    assert reply.json() == {"error": {"message": "The server had an error while processing your request.",
                                      "type": "server_error", "param": None, "code": None}}
    lines = [line for line in client.get("/stream").text.splitlines() if line]
    assert json.loads(lines[0].removeprefix("data: "))["object"] == "agent.turn"
    assert json.loads(lines[1].removeprefix("data: "))["error"]["type"] == "server_error"
    assert "[DONE]" not in lines[-1] and "secret" not in "".join(lines)
