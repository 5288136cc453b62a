"""Fixtures for the AutoCoA tests: a small multihop world with its problems, a tokenizer trained on synthetic CoA
text, and a seeded tiny Qwen2 policy (seconds on CPU)."""
from __future__ import annotations

import pytest
import torch

from models.format import render_segments
from models.tiny import TinyModelConfig, build_tiny_model
from models.tokenizer import train_tokenizer
from training.synthetic_coa import synthetic_trajectories

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    texts = [t.question + render_segments(t.segments) for t in synthetic_trajectories(48, seed=0)]
    return train_tokenizer(texts, vocab_size=400)


@pytest.fixture
def tiny_model(tokenizer):
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                          max_position_embeddings=512, seed=0)
    return build_tiny_model(cfg, tokenizer)
