"""The copy circuit at init (models/copy_circuit.py): a previous-token head, an induction head that copies an
unseen token sequence before any training, and a checkpoint that stays a plain Qwen2.

Run: .venv/bin/pytest tests/models/test_copy_circuit.py -q
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from models.copy_circuit import install_copy_circuit, previous_token_pair_weights
from models.policy import load_policy, save_policy
from models.tiny import TinyModelConfig, build_tiny_model

# The default's shape (hidden 128, 4 heads of 32, 2 key/value heads) at its rope_theta.
CIRCUIT = TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512,
                          rope_theta=1e6, copy_circuit=True)


def _repeat_run(model, vocab: int, length: int = 100):
    """A random sequence of distinct tokens, shown twice; returns the attentions and the 2nd half's accuracy."""
    seq = torch.randperm(vocab - 20, generator=torch.Generator().manual_seed(0))[:length] + 20
    ids = torch.cat([seq, seq])[None]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    pred = out.logits[0, length:-1].argmax(-1)
    return out.attentions, (pred == ids[0, length + 1:]).float().mean().item()


def test_previous_token_weights_peak_at_distance_one():
    weights, margin = previous_token_pair_weights(head_dim=32, rope_theta=1e6, max_distance=2048)
    freqs = 1e6 ** (-np.arange(16) * 2 / 32)
    score = np.cos((np.arange(2049)[:, None] - 1) * freqs[None, :]) @ weights
    assert weights.min() >= 0 and abs(weights.sum() - 1) < 1e-6
    assert score.argmax() == 1 and margin > 0.2
    assert np.isclose(score[1] - np.delete(score, 1).max(), margin, atol=1e-6)


def test_untrained_circuit_copies_an_unseen_sequence(tokenizer):
    plain = build_tiny_model(CIRCUIT.model_copy(update={"copy_circuit": False}), tokenizer)
    circuit = build_tiny_model(CIRCUIT, tokenizer)
    _, plain_acc = _repeat_run(plain, len(tokenizer))
    attentions, circuit_acc = _repeat_run(circuit, len(tokenizer))
    length = 100
    prev = attentions[0][0, 0, torch.arange(1, 2 * length), torch.arange(0, 2 * length - 1)].mean().item()
    induction = attentions[1][0, 0, torch.arange(length, 2 * length), torch.arange(1, length + 1)].mean().item()
    assert prev > 0.95                      # layer 0, head 0 looks one token back
    assert induction > 0.4                  # layer 1, head 0 looks at the token after the earlier occurrence
    assert plain_acc < 0.05 and circuit_acc > 0.25, (plain_acc, circuit_acc)


def test_circuit_is_seeded_and_only_touches_its_heads(tokenizer):
    a, b = build_tiny_model(CIRCUIT, tokenizer), build_tiny_model(CIRCUIT, tokenizer)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    plain = build_tiny_model(CIRCUIT.model_copy(update={"copy_circuit": False}), tokenizer)
    head_dim = 32
    for layer in (0, 1):
        for name in ("q_proj", "k_proj", "v_proj"):
            got = getattr(a.model.layers[layer].self_attn, name).weight
            ref = getattr(plain.model.layers[layer].self_attn, name).weight
            assert torch.equal(got[head_dim:], ref[head_dim:])     # heads other than head 0 keep their init
    assert torch.equal(a.model.layers[0].mlp.up_proj.weight, plain.model.layers[0].mlp.up_proj.weight)


def test_circuit_checkpoint_is_a_plain_qwen2(tmp_path, tokenizer):
    model = build_tiny_model(CIRCUIT, tokenizer).eval()
    loaded, _ = load_policy(save_policy(model, tokenizer, tmp_path / "p"))
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert type(loaded).__name__ == "Qwen2ForCausalLM" and loaded.config.rope_parameters["rope_theta"] == 1e6


def test_circuit_needs_two_layers_and_slow_rope_pairs(tokenizer):
    with pytest.raises(ValidationError, match="num_layers >= 2"):
        TinyModelConfig(num_layers=1, copy_circuit=True)
    with pytest.raises(ValueError, match="Raise rope_theta"):
        build_tiny_model(CIRCUIT.model_copy(update={"rope_theta": 100.0}), tokenizer)
