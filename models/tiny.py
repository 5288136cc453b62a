"""The tiny default policy: a seeded, randomly initialised Qwen2 built from a config, with a local tokenizer.

No weights can be downloaded here, so the platform's default model is a Qwen2ForCausalLM of about a million
parameters (defaults: hidden 128, 4 layers) whose vocabulary comes from `models.tokenizer.train_tokenizer`.
It has the same class, files and code paths as a real Qwen checkpoint, so every stage runs unchanged on both.
With `copy_circuit` its first two layers start as previous-token and induction heads (models/copy_circuit.py).

Usage:
    path = create_default_policy(out_dir, texts, TinyModelConfig(num_layers=2), vocab_size=2048)
    model, tok = models.policy.load_policy(path)
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch
from pydantic import Field, model_validator
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from afm.config import Config
from models.copy_circuit import install_copy_circuit
from models.policy import save_policy
from models.tokenizer import train_tokenizer


class TinyModelConfig(Config):
    """Architecture of the tiny Qwen2 built from scratch."""

    hidden_size: int = Field(128, ge=16, description="Width of the residual stream (embedding size).")
    num_layers: int = Field(4, ge=1, le=8, description="Number of transformer decoder layers (2-4 is the tiny range).")
    num_heads: int = Field(
        4, ge=1, description="Attention heads; must divide hidden_size. vLLM's CPU kernels need hidden_size / num_heads "
        "(head_dim) in 32, 64, 80, 96, 112, 128, ...",
    )
    num_kv_heads: int = Field(2, ge=1, description="Key/value heads (grouped-query attention); must divide num_heads.")
    intermediate_size: int = Field(512, ge=16, description="Hidden width of each layer's SwiGLU MLP.")
    max_position_embeddings: int = Field(2048, ge=64, description="Longest sequence (prompt + response) in tokens.")
    tie_word_embeddings: bool = Field(True, description="Share input embedding and output head (halves embedding params).")
    rope_theta: float = Field(
        10000.0, gt=0, description="RoPE base. Qwen2 checkpoints use 1e6; the copy circuit needs a large one (its "
        "induction head matches tokens on the slowly rotating pairs).",
    )
    copy_circuit: bool = Field(
        False, description="Initialise layers 0-1 with previous-token heads (1 and 2 tokens back) and an induction "
        "head (models/copy_circuit.py), as a pretrained base has them: copying unseen names works from step 0 instead "
        "of after thousands of steps. Needs >= 2 layers and >= 2 heads; configs/default.yaml sets it with rope_theta "
        "1e6 (the 4-layer quality preset did worse with it: docs/quality.md).",
    )
    seed: int = Field(0, description="Seed of the random initialisation; the same seed gives the same weights.")

    @model_validator(mode="after")
    def _check_heads(self) -> "TinyModelConfig":
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide hidden_size={self.hidden_size}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        if self.copy_circuit and self.num_layers < 2:
            raise ValueError(f"copy_circuit needs num_layers >= 2 (got {self.num_layers}): its induction head reads "
                             "layer 0's previous-token head")
        return self


def build_tiny_model(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2ForCausalLM sized by `cfg`, vocabulary and eos/pad taken from `tokenizer`."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # Seed a private generator state so building a model does not reset the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = Qwen2ForCausalLM(config)
    if cfg.copy_circuit:
        install_copy_circuit(model, seed=cfg.seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def create_default_policy(
    out_dir: str | Path, texts: Iterable[str], model_cfg: TinyModelConfig, vocab_size: int = 2048
) -> Path:
    """Train a tokenizer on `texts`, build the tiny model, save both (safetensors) to `out_dir`; returns it."""
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    model = build_tiny_model(model_cfg, tokenizer)
    return save_policy(model, tokenizer, out_dir)
