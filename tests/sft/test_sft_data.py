"""SFT data: observation masking, truncation at observation boundaries, packing and its attention isolation."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models.format import OBSERVATION_CLOSE, TOOL_TAGS, parse_segments
from models.tiny import build_tiny_model
from models.tokenizer import decode, encode_observation, encode_prompt
from models.packed_attention import PACKED_ATTENTION
from training.sft_data import (
    IGNORE_INDEX, build_examples, collate_rows, count_targets, model_inputs, pack_examples, target_positions,
)
from training.sft_loss import token_loss_sum


def _find(haystack: list[int], needle: list[int], start: int = 0) -> int:
    for i in range(start, len(haystack) - len(needle) + 1):
        if haystack[i:i + len(needle)] == needle:
            return i
    raise AssertionError("observation ids not found in the encoded example")


def test_no_observation_or_prompt_token_carries_a_label(trajectories, tokenizer):
    examples, report = build_examples(trajectories, tokenizer, "You are an agent.", max_len=1024)
    assert report.examples == len(trajectories) and report.truncated == 0
    for traj, example in zip(trajectories, examples):
        prompt = encode_prompt(tokenizer, traj.question, "You are an agent.")
        assert all(label == IGNORE_INDEX for label in example.labels[:len(prompt)])
        pos = len(prompt)
        for seg in traj.segments:
            if seg.tag != "observation":
                continue
            obs = encode_observation(tokenizer, seg.text)
            pos = _find(example.input_ids, obs, pos)
            assert all(label == IGNORE_INDEX for label in example.labels[pos:pos + len(obs)]), traj.id
            pos += len(obs)
        # Everything the model wrote (and only that) is learned: the labeled text has no observation in it.
        learned = decode(tokenizer, [t for t in example.labels if t != IGNORE_INDEX])
        assert "<observation>" not in learned and "Found 2 results" not in learned
        assert learned.endswith(f"<answer>{traj.answer}</answer><|im_end|>")


def test_truncation_cuts_after_an_observation_and_counts_drops(trajectories, tokenizer):
    two_hop = [t for t in trajectories if t.tool_calls == 2]
    full, _ = build_examples(two_hop, tokenizer, None, max_len=1024)
    max_len = min(len(e) for e in full) - 1  # too short for every 2-hop example, long enough for its first hop
    examples, report = build_examples(two_hop, tokenizer, None, max_len=max_len)
    assert report.truncated == len(two_hop) and report.dropped_too_long == 0
    for example in examples:
        assert len(example) <= max_len
        text = decode(tokenizer, example.input_ids)
        assert text.endswith(OBSERVATION_CLOSE)
        segments = parse_segments(text.split("<|im_start|>assistant\n", 1)[1])
        for i, seg in enumerate(segments):  # every tool call is followed by its observation
            if seg.tag in TOOL_TAGS:
                assert segments[i + 1].tag == "observation"
    _, report = build_examples(two_hop, tokenizer, None, max_len=40)
    assert report.dropped_too_long == len(two_hop) and report.examples == 0


def test_packing_keeps_every_example_once_within_max_len(trajectories, tokenizer):
    examples, _ = build_examples(trajectories, tokenizer, None, max_len=512)
    rows = pack_examples(examples, max_len=512)
    assert all(sum(len(e) for e in row) <= 512 for row in rows)
    assert sorted(id(e) for row in rows for e in row) == sorted(id(e) for e in examples)
    assert len(rows) <= len(examples) // 2  # ~150-token examples: at least 3 per row


@pytest.mark.parametrize("attn", [PACKED_ATTENTION, "sdpa", "eager"])
def test_packed_logits_equal_each_example_alone(trajectories, tokenizer, tiny_model_cfg, attn):
    model = build_tiny_model(tiny_model_cfg, tokenizer).eval()
    examples, _ = build_examples(trajectories[:6], tokenizer, None, max_len=512)
    batch = collate_rows([examples[:3], examples[3:]])  # two rows -> one flat sequence of six examples
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([e.input_ids]), use_cache=False).logits[0] for e in examples]
        model.set_attn_implementation(attn)
        packed = model(**model_inputs(batch)).logits[0]
    start = 0
    for example, logits in zip(examples, alone):
        torch.testing.assert_close(packed[start:start + len(example)], logits, atol=1e-5, rtol=1e-5)
        start += len(example)
    assert start == batch["input_ids"].shape[1]  # no padding


def test_packed_attention_gradients_equal_each_example_alone(trajectories, tokenizer, tiny_model_cfg):
    examples, _ = build_examples(trajectories[:4], tokenizer, None, max_len=512)
    grads = []
    for attn, batches in ((PACKED_ATTENTION, [collate_rows([examples])]), ("sdpa", [collate_rows([[e]]) for e in examples])):
        model = build_tiny_model(tiny_model_cfg, tokenizer)
        model.set_attn_implementation(attn)
        sum(token_loss_sum(model, b) for b in batches).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("attn", [PACKED_ATTENTION, "sdpa"])
def test_packed_examples_do_not_attend_across_boundaries(trajectories, tokenizer, tiny_model, attn):
    tiny_model.set_attn_implementation(attn)
    first, second = build_examples(trajectories[:2], tokenizer, None, max_len=512)[0]
    changed = type(first)([(t + 7) % len(tokenizer) for t in first.input_ids], first.labels)
    with torch.no_grad():
        out = [tiny_model(**model_inputs(collate_rows([[a, second]]))).logits[0, len(first):] for a in (first, changed)]
    torch.testing.assert_close(out[0], out[1], atol=0, rtol=0)
    # Sanity: the same sequence WITHOUT restarting positions does let the second example see the first.
    batch = collate_rows([[first, second]])
    tiny_model.set_attn_implementation("sdpa")
    with torch.no_grad():
        leaky = tiny_model(input_ids=batch["input_ids"], use_cache=False).logits[0, len(first):]
    assert (leaky - out[0]).abs().max() > 1e-3


def test_packed_loss_equals_token_weighted_mean_of_unpacked_losses(trajectories, tokenizer, tiny_model):
    tiny_model.set_attn_implementation(PACKED_ATTENTION)
    examples, _ = build_examples(trajectories[:8], tokenizer, None, max_len=512)
    rows = pack_examples(examples, max_len=512)
    packed = collate_rows(rows)
    with torch.no_grad():
        packed_loss = token_loss_sum(tiny_model, packed) / count_targets(packed)
        sums, counts = 0.0, 0
        for example in examples:
            alone = collate_rows([[example]])
            sums += token_loss_sum(tiny_model, alone).item()
            counts += count_targets(alone)
    assert count_targets(packed) == counts
    assert abs(packed_loss.item() - sums / counts) < 1e-5


def test_loss_on_target_positions_equals_loss_over_all_logits(trajectories, tokenizer, tiny_model):
    examples, _ = build_examples(trajectories[:5], tokenizer, None, max_len=512)
    batch = collate_rows([examples])
    with torch.no_grad():
        logits = tiny_model(**model_inputs(batch)).logits[0, :-1]  # every position, as a plain causal LM loss
        everything = F.cross_entropy(logits, batch["labels"][0, 1:], ignore_index=IGNORE_INDEX, reduction="sum")
        # prompt and observation positions are skipped: the LM head sees fewer positions than the sequence has
        assert 0 < target_positions(batch).numel() == count_targets(batch) < logits.shape[0]
        torch.testing.assert_close(token_loss_sum(tiny_model, batch), everything, atol=1e-4, rtol=1e-6)
