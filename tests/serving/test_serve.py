"""`afm serve` on the tiny model: Ray Serve answers the official `openai` client unchanged (/v1/models,
/v1/chat/completions) and runs the whole CoA loop behind /v1/agent."""
from __future__ import annotations

import pytest
import requests

from tests.conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    from models.tiny import TinyModelConfig, create_default_policy

    texts = ["<think>Search the capital.</think><web_search>Ludoria</web_search><answer>Vazoma</answer>",
             "What is the capital of Ludoria? Vazoma is a city."] * 20
    cfg = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
    return create_default_policy(tmp_path_factory.mktemp("policy") / "tiny", texts, cfg, vocab_size=400)


@pytest.fixture(scope="module")
def server(tiny_policy):
    import ray
    from ray import serve

    from serving.app import ServeConfig, run_server

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False)
    cfg = ServeConfig(model=str(tiny_policy), port=port, max_new_tokens=16)
    run_server(cfg, blocking=False)
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


def test_openai_client_talks_to_the_server(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["afm"]
    reply = client.chat.completions.create(model="afm", messages=[{"role": "user", "content": "Capital of Ludoria?"}],
                                           max_tokens=8, temperature=0)
    assert reply.choices[0].message.role == "assistant"
    assert isinstance(reply.choices[0].message.content, str)
    assert 1 <= reply.usage.completion_tokens <= 8
    again = client.chat.completions.create(model="afm", messages=[{"role": "user", "content": "Capital of Ludoria?"}],
                                           max_tokens=8, temperature=0)
    assert again.choices[0].message.content == reply.choices[0].message.content  # greedy is deterministic


def test_unknown_model_is_404(server):
    from openai import NotFoundError, OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key="unused")
    with pytest.raises(NotFoundError):
        client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}], max_tokens=4)


def test_agent_endpoint_runs_the_coa_loop(server):
    out = requests.post(f"{server}/v1/agent", json={"question": "What is the capital of Ludoria?"}, timeout=120).json()
    assert out["status"] in {"answered", "max_turns", "token_budget", "format_error"}
    assert out["turns"] >= 1
    assert isinstance(out["trajectory"], list) and isinstance(out["tool_calls"], list)
    assert out["usage"]["total_tokens"] >= out["usage"]["completion_tokens"] >= 1
