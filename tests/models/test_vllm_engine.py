"""VLLMEngine (GPU machines with vllm installed): same greedy output as HFEngine, weight updates take effect."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from models.engines.hf import HFEngine
from models.policy import save_policy
from models.tokenizer import encode_prompt
from tests.models.conftest import SYSTEM_PROMPT, sample_trajectory

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
                       reason="needs CUDA and vllm"),
]


def test_vllm_matches_hf_and_updates_weights(tmp_path, tiny_model, memorized_model, tokenizer):
    from models.engines.vllm_engine import VLLMEngine

    path = save_policy(tiny_model, tokenizer, tmp_path / "policy")
    engine = VLLMEngine(str(path), dtype="float32", max_model_len=512, gpu_memory_utilization=0.2, enforce_eager=True)
    prompts = [encode_prompt(tokenizer, sample_trajectory(i).question, SYSTEM_PROMPT) for i in range(4)]

    def same_as_hf(model):
        got = engine.generate(prompts, max_new_tokens=40, temperature=0)
        want = HFEngine(model, tokenizer).generate(prompts, max_new_tokens=40, temperature=0)
        assert [g.token_ids for g in got] == [w.token_ids for w in want]
        assert [(g.finish_reason, g.stop) for g in got] == [(w.finish_reason, w.stop) for w in want]
        for g, w in zip(got, want):
            assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-3)
        return got

    same_as_hf(tiny_model)
    engine.update_weights(memorized_model.state_dict())
    after = same_as_hf(memorized_model)
    assert after[0].stop == "</web_search>"
