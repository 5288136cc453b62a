"""VLLMEngine's seeds per prompt (CPU, no vLLM needed) and, where CUDA and vLLM exist, weight sync through vLLM's
CUDA-IPC weight-transfer engine around sleep / wake-up (never run on the machine this was written on)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from models.engines.vllm_engine import VLLMEngine, per_prompt_seeds

def test_per_prompt_seeds():
    assert per_prompt_seeds(None, 3) == [None, None, None]
    assert per_prompt_seeds(7, 3) == [7, 8, 9]
    assert per_prompt_seeds((4, 2, 9), 3) == [4, 2, 9]
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        per_prompt_seeds([1, 2], 3)


def test_unknown_weight_sync_is_refused():
    with pytest.raises(ValueError, match="weight_sync must be one of"):
        VLLMEngine("unused", weight_sync="gloo")


@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
                    reason="needs CUDA and vllm")
def test_ipc_sync_while_asleep(tmp_path, tiny_model, memorized_model, tokenizer, level):
    from models.engines.hf import HFEngine
    from models.policy import save_policy
    from models.tokenizer import encode_prompt
    from tests.models.conftest import SYSTEM_PROMPT, sample_trajectory

    path = save_policy(tiny_model, tokenizer, tmp_path / "policy")
    engine = VLLMEngine(str(path), dtype="float32", max_model_len=512, gpu_memory_utilization=0.2,
                        enforce_eager=True, weight_sync="ipc", enable_sleep_mode=True)
    prompts = [encode_prompt(tokenizer, sample_trajectory(i).question, SYSTEM_PROMPT) for i in range(4)]
    free_awake = torch.cuda.mem_get_info()[0]
    engine.sleep(level)
    assert torch.cuda.mem_get_info()[0] > free_awake
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(prompts, max_new_tokens=4, temperature=0)
    engine.update_weights({k: v.cuda() for k, v in memorized_model.state_dict().items()})
    engine.wake_up()
    got = engine.generate(prompts, max_new_tokens=40, temperature=0)
    want = HFEngine(memorized_model, tokenizer).generate(prompts, max_new_tokens=40, temperature=0)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert got[0].stop == "</web_search>"
