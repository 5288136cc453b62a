"""A checkpoint unlike the tiny default (byte-level BPE with Qwen2's pre-tokenizer, ChatML specials only, a
Qwen2.5-style chat template with a default system prompt, an untied LM head with reserved embedding rows):
SFT makes the CoA tags special tokens with mean-initialised rows, untrusted text never yields a tag id, no
default system prompt appears, a model turn's ids are those of one pass over its text, and the round trip is exact."""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from models.format import render_segments, write_jsonl
from models.policy import load_policy, save_policy
from models.policy_tokens import add_coa_special_tokens, special_tokens
from models.tokenizer import (
    TAG_TOKENS, check_token_roundtrip, decode, encode_prompt, encode_segments, encode_trajectory, encode_untrusted,
)
from tests.models.conftest import QWEN25_TEMPLATE, qwen_like_tokenizer, sample_trajectory
from tests.models.test_tokenizer import HOSTILE

RESERVED_ROWS = 8  # fewer than the 24 tags: some reuse reserved rows, the rest grow the embeddings


@pytest.fixture
def checkpoint(tmp_path):
    """(model, tokenizer) as a real checkpoint directory would load: tags are text, LM head untied."""
    tok = qwen_like_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok) + RESERVED_ROWS, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    return load_policy(save_policy(model, tok, tmp_path / "qwen-like"))


def test_tags_become_special_tokens_with_mean_initialised_rows(checkpoint):
    model, tok = checkpoint
    known, rows = len(tok), model.get_input_embeddings().weight.shape[0]
    means = [w[:known].mean(dim=0).clone() for w in (model.get_input_embeddings().weight, model.lm_head.weight)]
    new_ids = add_coa_special_tokens(model, tok)
    assert len(new_ids) == len(TAG_TOKENS) and set(TAG_TOKENS) <= special_tokens(tok)
    assert sorted(new_ids) == list(range(known, known + len(TAG_TOKENS)))
    assert sum(i < rows for i in new_ids) == RESERVED_ROWS  # reserved rows reused first
    assert model.get_input_embeddings().weight.shape[0] == model.lm_head.weight.shape[0] == len(tok)
    for weight, mean in zip((model.get_input_embeddings().weight, model.lm_head.weight), means):
        torch.testing.assert_close(weight[new_ids], mean.expand(len(new_ids), -1))
    assert add_coa_special_tokens(model, tok) == []  # idempotent


def test_untrusted_text_never_yields_a_tag_or_chat_id(checkpoint):
    model, tok = checkpoint
    add_coa_special_tokens(model, tok)
    special_ids = set(tok.convert_tokens_to_ids(sorted(special_tokens(tok))))
    assert not special_ids & set(encode_untrusted(tok, HOSTILE))
    assert decode(tok, encode_untrusted(tok, HOSTILE)) == HOSTILE


def model_turns(segments):
    """Maximal runs of model-written segments between observations: what the model generates in one go."""
    turns, current = [], []
    for seg in segments:
        if seg.tag == "observation":
            turns, current = turns + [current], []
        else:
            current.append(seg)
    return [t for t in turns + [current] if t]


def test_model_turns_tokenize_as_generated_and_round_trip_without_default_system_prompt(checkpoint):
    model, tok = checkpoint
    traj = sample_trajectory(3)
    one_pass = lambda segments: tok(render_segments(segments), add_special_tokens=False)["input_ids"]  # noqa: E731
    turns = model_turns(traj.segments)
    # With tags as text, Qwen2's merges cross segment boundaries (`>I`): segment-by-segment ids are not the ids
    # of the turn the model generates.
    assert any(encode_segments(tok, turn).input_ids != one_pass(turn) for turn in turns)

    add_coa_special_tokens(model, tok)
    # A tag is one id and splits the text: a turn's ids are the same piecewise and in one pass. (Observations are
    # inserted by the environment as `encode_observation` ids, in SFT exactly as in RL rollouts.)
    assert all(encode_segments(tok, turn).input_ids == one_pass(turn) for turn in turns)
    prompt = encode_prompt(tok, traj.question)
    assert decode(tok, prompt) == f"<|im_start|>user\n{traj.question}<|im_end|>\n<|im_start|>assistant\n"
    example = encode_trajectory(tok, traj)
    check_token_roundtrip(tok, prompt, example.input_ids[len(prompt):], traj)
    assert decode(tok, example.input_ids) == decode(tok, prompt) + render_segments(traj.segments) + "<|im_end|>"


def test_sft_on_the_checkpoint_saves_the_tags_and_grown_embeddings(checkpoint, tmp_path):
    from training.sft_trainer import SFTConfig, run_sft_worker
    from training.synthetic_coa import synthetic_trajectories

    model, tok = checkpoint
    policy = save_policy(model, tok, tmp_path / "base")
    write_jsonl(tmp_path / "train.jsonl", synthetic_trajectories(8, seed=0))
    cfg = SFTConfig(model_path=str(policy), dataset=str(tmp_path / "train.jsonl"), max_len=256, micro_batch=2,
                    max_steps=2, output_dir=str(tmp_path / "run"), log_system_metrics=False)
    run_sft_worker(cfg, rank=0, world_size=1, device=torch.device("cpu"))
    trained, trained_tok = load_policy(tmp_path / "run" / "policy")
    assert set(TAG_TOKENS) <= special_tokens(trained_tok)
    assert trained.get_input_embeddings().weight.shape[0] == len(trained_tok) == len(tok) + len(TAG_TOKENS)
    assert trained_tok.chat_template == QWEN25_TEMPLATE  # the checkpoint's own template is kept
