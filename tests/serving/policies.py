"""The tiny policy the serving tests serve: 2 layers, head_dim 32 (vLLM's CPU attention kernels take 32, 64, 80,
...; models/engines/vllm_engine.py), a tokenizer trained on the texts the test's questions use.

    path = tiny_serving_policy(tmp_dir / "tiny", texts)
"""
from __future__ import annotations

from pathlib import Path


def tiny_serving_policy(out_dir: Path, texts: list[str]) -> Path:
    from models.tiny import TinyModelConfig, create_default_policy

    cfg = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
    return create_default_policy(out_dir, texts, cfg, vocab_size=400)
