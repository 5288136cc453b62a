"""The copy circuit at init (models/copy_circuit.py): previous-token heads, an induction head that copies an
unseen token sequence (and one over a 10-symbol alphabet, as digits are) before any training, and a checkpoint
that stays a plain Qwen2.

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


def _repeat_run(model, seq: torch.Tensor):
    """`seq` shown twice; returns the attentions and the accuracy of greedy next-token guesses on the 2nd half."""
    length = len(seq)
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
    length, gen = 100, torch.Generator().manual_seed(0)
    distinct = torch.randperm(len(tokenizer) - 20, generator=gen)[:length] + 20
    _, plain_acc = _repeat_run(plain, distinct)
    attentions, circuit_acc = _repeat_run(circuit, distinct)
    back = [attentions[0][0, head, torch.arange(d, 2 * length), torch.arange(0, 2 * length - d)].mean().item()
            for head, d in ((0, 1), (1, 2))]
    induction = attentions[1][0, 0, torch.arange(length, 2 * length), torch.arange(1, length + 1)].mean().item()
    assert min(back) > 0.95                 # layer 0: head 0 looks one token back, head 1 two
    assert induction > 0.6                  # layer 1, head 0 looks at the token after the earlier occurrence
    assert plain_acc < 0.05 and circuit_acc > 0.6, (plain_acc, circuit_acc)
    # Ten symbols recur ~20 times each: only a match on two tokens finds the right earlier position.
    symbols = torch.randint(0, 10, (length,), generator=gen) + 20
    _, plain_acc = _repeat_run(plain, symbols)
    _, circuit_acc = _repeat_run(circuit, symbols)
    assert circuit_acc > plain_acc + 0.1 and circuit_acc > 0.2, (plain_acc, circuit_acc)


def test_circuit_is_seeded_and_only_touches_its_heads(tokenizer):
    a, b = build_tiny_model(CIRCUIT, tokenizer), build_tiny_model(CIRCUIT, tokenizer)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    plain = build_tiny_model(CIRCUIT.model_copy(update={"copy_circuit": False}), tokenizer)
    head_dim = 32
    # Set: layer 0 query heads 0-1 (key/value head 0), layer 1 query head 0 (key/value head 0); the rest keeps
    # its init.
    for layer, q_heads in ((0, 2), (1, 1)):
        attn, ref = a.model.layers[layer].self_attn, plain.model.layers[layer].self_attn
        assert torch.equal(attn.q_proj.weight[q_heads * head_dim:], ref.q_proj.weight[q_heads * head_dim:])
        for name in ("k_proj", "v_proj"):
            assert torch.equal(getattr(attn, name).weight[head_dim:], getattr(ref, name).weight[head_dim:])
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
