"""Shared fixtures: a small corpus, a tokenizer trained on it, a 2-layer tiny model, and a model that has
memorized one CoA trajectory (so greedy decoding produces a real, well-formed rollout)."""
from __future__ import annotations

import pytest
import torch

from models.format import Segment, Trajectory, render_segments
from models.tiny import TinyModelConfig, build_tiny_model
from models.tokenizer import train_tokenizer
from tests.conftest import memorize_trajectory

torch.set_num_threads(1)

SYSTEM_PROMPT = "You are a Chain-of-Agents model. Use tags."


def sample_trajectory(idx: int = 0) -> Trajectory:
    return Trajectory(
        id=f"t{idx}",
        question=f"Who founded the company that employs person {idx}?",
        family="multihop",
        segments=[
            Segment("think", f"I need the employer of person {idx}."),
            Segment("plan", "Search the person, then the company."),
            Segment("web_search", f"person {idx} employer"),
            Segment("observation", f"Found 1 results:\n1. [Person {idx}](http://w/p{idx}) works at Acme."),
            Segment("reflection", "Tool effectiveness: good."),
            Segment("web_search", "Acme founder"),
            Segment("observation", "Acme was founded by Alice Smith in 1990."),
            Segment("suggested_answer", "Alice Smith"),
            Segment("double_check", "Score 4: the sources agree."),
            Segment("answer", "Alice Smith"),
        ],
        answer="Alice Smith",
    )


def corpus() -> list[str]:
    texts = []
    for i in range(20):
        t = sample_trajectory(i)
        texts += [t.question, render_segments(t.segments)]
    return texts * 5


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer(corpus(), vocab_size=400)


@pytest.fixture(scope="session")
def tiny_cfg():
    return TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)


@pytest.fixture()
def tiny_model(tokenizer, tiny_cfg):
    return build_tiny_model(tiny_cfg, tokenizer).eval()


@pytest.fixture(scope="session")
def memorized_model(tokenizer, tiny_cfg):
    """A tiny model trained to reproduce sample_trajectory(0) (model tokens only), so greedy decoding with
    tool observations inserted is a genuine multi-turn rollout."""
    return memorize_trajectory(build_tiny_model(tiny_cfg, tokenizer), tokenizer, sample_trajectory(0),
                               SYSTEM_PROMPT, max_steps=150)
