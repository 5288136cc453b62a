"""Fixtures for RL tests: the addition task (tests/rl/addition_task.py) solved with the real sandboxed `code`
tool, its tokenizer, and a tiny 2-layer Qwen2 briefly SFT'd on its hand-made CoA trajectories (a policy dir).

The SFT is short on purpose: the policy learns the format (think -> code -> answer) but not yet to copy the
observation into the answer every time, so RL has something to improve."""
from __future__ import annotations

import pytest
import torch

from models.policy import save_policy
from models.tiny import TinyModelConfig, build_tiny_model
from problems.records import write_problems
from tests.rl.addition_task import ALL_PAIRS, addition_problem, addition_trajectory, sft_briefly
from tests.rl.addition_task import addition_tokenizer as make_addition_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def addition_tokenizer():
    return make_addition_tokenizer()


@pytest.fixture(scope="session")
def tiny_cfg():
    return TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


@pytest.fixture()
def tiny_model(addition_tokenizer, tiny_cfg):
    return build_tiny_model(tiny_cfg, addition_tokenizer).eval()


@pytest.fixture(scope="session")
def sft_policy_dir(tmp_path_factory, addition_tokenizer, tiny_cfg):
    """A saved policy after a brief SFT on the 81 addition trajectories: right format most of the time, right
    answer about a third of the time (measured: reward 0.31 on 32 sampled episodes), so GRPO groups vary."""
    torch.manual_seed(0)
    model = build_tiny_model(tiny_cfg, addition_tokenizer)
    sft_briefly(model, addition_tokenizer, [addition_trajectory(a, b) for a, b in ALL_PAIRS], steps=280)
    return save_policy(model, addition_tokenizer, tmp_path_factory.mktemp("policy") / "sft")


@pytest.fixture(scope="session")
def addition_problems_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("problems") / "addition.jsonl"
    write_problems(path, [addition_problem(a, b) for a, b in ALL_PAIRS])
    return path
