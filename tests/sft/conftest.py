"""Fixtures for SFT tests: synthetic CoA trajectories, a tokenizer trained on them, a seeded tiny Qwen2 policy."""
from __future__ import annotations

import pytest
import torch

from models.format import render_segments, write_jsonl
from models.tiny import TinyModelConfig, build_tiny_model
from models.policy import save_policy
from models.tokenizer import train_tokenizer
from training.sft_trainer import SFTConfig
from training.synthetic_coa import synthetic_trajectories

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def trajectories():
    return synthetic_trajectories(48, seed=0)


@pytest.fixture(scope="session")
def tokenizer(trajectories):
    texts = [t.question + render_segments(t.segments) for t in trajectories]
    return train_tokenizer(texts, vocab_size=400)


@pytest.fixture(scope="session")
def tiny_model_cfg():
    return TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                           max_position_embeddings=512, seed=0)


@pytest.fixture
def tiny_model(tokenizer, tiny_model_cfg):
    return build_tiny_model(tiny_model_cfg, tokenizer).eval()


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory, tokenizer, tiny_model_cfg):
    out = tmp_path_factory.mktemp("policy") / "tiny"
    return save_policy(build_tiny_model(tiny_model_cfg, tokenizer), tokenizer, out)


@pytest.fixture(scope="session")
def dataset_file(tmp_path_factory, trajectories):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    write_jsonl(path, trajectories)
    return path


@pytest.fixture
def afm_home(tmp_path, monkeypatch):
    """An isolated local MLflow store (sqlite) per test."""
    monkeypatch.setenv("AFM_HOME", str(tmp_path / "afm_home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "afm_home"


@pytest.fixture
def sft_cfg(tmp_path, policy_dir, dataset_file, afm_home):
    """A seconds-long local SFT job on the tiny policy."""
    return SFTConfig(
        model_path=str(policy_dir), dataset=str(dataset_file), max_len=256, micro_batch=2, grad_accum=1,
        lr=3e-3, warmup_ratio=0.2, max_steps=5, checkpoint_every=100, report_every=100, seed=0,
        output_dir=str(tmp_path / "run"), log_system_metrics=False, registered_model_name="afm-sft-test",
    )
