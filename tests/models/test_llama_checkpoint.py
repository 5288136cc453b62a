"""A Llama-family checkpoint is a valid `policy.base_model` too (#21 item 6: Qwen2/2.5/3 and Llama): a random
2-layer LlamaForCausalLM directory with the byte-level BPE + ChatML tokenizer trains under FSDP2 (one gloo
process) with activation checkpointing, gets the CoA tags as special tokens, and saves a loadable policy.

    .venv/bin/pytest -q tests/models/test_llama_checkpoint.py       # ~10 s
"""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from models.format import write_jsonl
from models.policy import load_policy, save_policy
from models.policy_tokens import special_tokens
from models.tokenizer import TAG_TOKENS
from tests.models.conftest import qwen_like_tokenizer
from training.parallel import decoder_layers, single_process_group
from training.sft_trainer import MetricsHistory, SFTConfig, run_sft_worker
from training.synthetic_coa import synthetic_trajectories


def test_llama_checkpoint_trains_under_fsdp_with_tags_as_special_tokens(tmp_path):
    tok = qwen_like_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    assert len(decoder_layers(model)) == 2  # FSDP finds the blocks it shards one by one
    base = save_policy(model, tok, tmp_path / "llama")
    write_jsonl(tmp_path / "train.jsonl", synthetic_trajectories(16, seed=0))
    cfg = SFTConfig(model_path=str(base), dataset=str(tmp_path / "train.jsonl"), max_len=256, micro_batch=2,
                    max_steps=3, parallelism="fsdp", activation_checkpointing=True, output_dir=str(tmp_path / "run"),
                    log_system_metrics=False)
    history = MetricsHistory()
    with single_process_group("gloo"):
        outcome = run_sft_worker(cfg, 0, 1, torch.device("cpu"), history)
    assert outcome.steps == 3 and all(torch.isfinite(torch.tensor(list(history.series("loss").values()))))

    trained, trained_tok = load_policy(tmp_path / "run" / "policy")
    assert type(trained).__name__ == "LlamaForCausalLM"
    assert set(TAG_TOKENS) <= special_tokens(trained_tok)
    assert trained.get_input_embeddings().weight.shape[0] == len(trained_tok) == len(tok) + len(TAG_TOKENS)
    before, _ = load_policy(base)
    changed = [not torch.equal(p, q) for (name, p), q in zip(trained.named_parameters(), before.parameters())
               if "embed" not in name and "lm_head" not in name]  # the grown rows change the shapes there
    assert changed and all(changed)
