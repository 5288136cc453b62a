"""LocalEngineBackend over a real tiny Qwen2 + HFEngine: real token counts, and the MAS runs on it to its budget."""
from __future__ import annotations

import pytest
import torch

from agents.teacher.backends import LocalEngineBackend, estimate_message_tokens, estimate_tokens
from agents.teacher.mas import TeacherConfig, run_mas
from models.engines.hf import HFEngine
from models.tiny import TinyModelConfig, build_tiny_model
from models.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def local_backend():
    torch.set_num_threads(1)
    tok = train_tokenizer(["Question: who directed Zarno? Search \"Zarno\". NEXT: search"] * 20, vocab_size=300)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                             intermediate_size=64), tok)
    return LocalEngineBackend(HFEngine(model, tok), tok, max_new_tokens=6, temperature=1.0, name="tiny"), tok


def test_local_backend_counts_real_tokens(local_backend):
    backend, tok = local_backend
    messages = [{"role": "system", "content": "You plan."}, {"role": "user", "content": "Question: who?"}]
    out = backend.complete("planning", messages, stop=None)
    expected = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert out.prompt_tokens == len(expected)
    assert 1 <= out.completion_tokens <= 6 and isinstance(out.text, str)


def test_mas_runs_on_a_local_model_until_its_budget(local_backend, world_setup, toolbox):
    backend, _ = local_backend
    cfg = TeacherConfig(max_steps=4)
    log = run_mas(world_setup.problems[0], backend, toolbox, cfg)
    calls = [e for e in log.events if e.prompt_tokens]
    n_calls = len(calls) + sum(log.parse_retries.values())  # re-asks of unparseable replies are calls too
    assert 4 <= n_calls <= 4 + 2 + max(cfg.parse_retries.values()) and log.teacher == "tiny"
    assert not log.verified and log.parse_failures  # an untrained model never verifies, and that is counted
    assert all(e.prompt_tokens > 0 for e in calls)


def test_estimate_rule():
    assert estimate_tokens("abcd" * 5) == 5 and estimate_tokens("abcde") == 2
    assert estimate_message_tokens([{"role": "user", "content": "abcd"}]) == 5
