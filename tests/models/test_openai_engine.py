"""OpenAIEngine against a real local HTTP server (tests/models/openai_server.py) that serves the tiny model."""
from __future__ import annotations

import openai
import pytest

from models.engines.hf import HFEngine
from models.engines.openai_http import OpenAIEngine
from models.tokenizer import encode_prompt
from tests.models.conftest import SYSTEM_PROMPT, sample_trajectory
from tests.models.openai_server import serve_openai

pytestmark = pytest.mark.integration


@pytest.fixture()
def served(memorized_model, tokenizer, monkeypatch):
    monkeypatch.setenv("AFM_TEST_KEY", "secret-key")
    engine = HFEngine(memorized_model, tokenizer)
    with serve_openai(engine, tokenizer, model_name="tiny", api_key="secret-key") as base_url:
        yield engine, base_url


def test_generate_returns_the_same_ids_and_logprobs_as_in_process(served, tokenizer):
    local, base_url = served
    remote = OpenAIEngine(base_url, model="tiny", api_key_env="AFM_TEST_KEY")
    prompts = [encode_prompt(tokenizer, sample_trajectory(i).question, SYSTEM_PROMPT) for i in range(3)]
    got = remote.generate(prompts, max_new_tokens=60, temperature=0)
    want = local.generate(prompts, max_new_tokens=60, temperature=0)
    assert got == want
    assert got[0].stop == "</web_search>" and got[0].finish_reason == "stop"
    short = remote.generate(prompts[:1], max_new_tokens=2, temperature=0)[0]
    assert short.finish_reason == "length" and short.stop is None and len(short.token_ids) == 2


def test_seeds_are_per_prompt_requests(served, tokenizer):
    local, base_url = served
    remote = OpenAIEngine(base_url, model="tiny", api_key_env="AFM_TEST_KEY")
    prompt = encode_prompt(tokenizer, sample_trajectory(0).question, SYSTEM_PROMPT)

    def alone(seed):
        return local.generate([prompt], max_new_tokens=12, temperature=1.5, seed=seed)[0]

    assert alone(5).token_ids != alone(9).token_ids
    # one request per prompt, each with its own seed: the two copies of one prompt are independent samples
    assert remote.generate([prompt, prompt], max_new_tokens=12, temperature=1.5, seed=[5, 9]) == [alone(5), alone(9)]
    assert remote.generate([prompt, prompt], max_new_tokens=12, temperature=1.5, seed=5) == [alone(5), alone(6)]
    with pytest.raises(ValueError, match="1 seeds for 2 prompts"):
        remote.generate([prompt, prompt], max_new_tokens=1, seed=[1])


def test_chat_returns_text_before_the_stop_string(served):
    _, base_url = served
    remote = OpenAIEngine(base_url, model="tiny", api_key_env="AFM_TEST_KEY")
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": sample_trajectory(0).question}]
    assert remote.chat(messages, stop=["</plan>"], max_tokens=60) == (
        "<think>I need the employer of person 0.</think><plan>Search the person, then the company."
    )


def test_api_key_comes_from_the_named_env_var(served, monkeypatch):
    _, base_url = served
    monkeypatch.setenv("AFM_WRONG_KEY", "nope")
    with pytest.raises(openai.AuthenticationError):
        OpenAIEngine(base_url, model="tiny", api_key_env="AFM_WRONG_KEY").generate([[1, 2]], max_new_tokens=1)
