"""The when-to-act pairwise loss: exact value against a hand computation, and one optimizer step on a tiny Qwen2
moves P̄_chosen up and P̄_rejected down.

    .venv/bin/python -m pytest tests/autocoa/test_pairwise_loss.py -q
"""
from __future__ import annotations

import math

import pytest
import torch

from models.format import Segment, render_segments
from training.pairwise_loss import (
    PairwiseConfig, collate_pairs, continuation_example, mean_logprobs, pairwise_loss, pairwise_loss_from_logits,
)
from training.sft_data import IGNORE_INDEX, SFTExample


def _hand_mean_logprob(logits: list[list[float]], ids: list[int], labels: list[int]) -> float:
    """Mean over labelled tokens t of log softmax(logits[t-1])[ids[t]], written out with math."""
    terms = []
    for t in range(1, len(ids)):
        if labels[t] == IGNORE_INDEX:
            continue
        row = logits[t - 1]
        log_z = math.log(sum(math.exp(v) for v in row))
        terms.append(row[ids[t]] - log_z)
    return sum(terms) / len(terms)


def test_loss_matches_hand_computation():
    # two pairs, vocabulary of 4; prefixes masked, continuations of different lengths
    pairs = [
        (SFTExample([0, 1, 2, 3], [IGNORE_INDEX, IGNORE_INDEX, 2, 3]), SFTExample([0, 1, 3], [IGNORE_INDEX, IGNORE_INDEX, 3])),
        (SFTExample([1, 2, 0], [IGNORE_INDEX, IGNORE_INDEX, 0]), SFTExample([1, 2, 1, 1, 2], [IGNORE_INDEX, IGNORE_INDEX, 1, 1, 2])),
    ]
    batch = collate_pairs(pairs)
    n = batch["input_ids"].shape[1]
    logits = torch.randn(1, n, 4, generator=torch.Generator().manual_seed(0))
    alpha = 0.2
    out = pairwise_loss_from_logits(logits, batch, alpha)

    rows = logits[0].tolist()
    examples = [c for c, _ in pairs] + [r for _, r in pairs]
    starts = [sum(len(e) for e in examples[:i]) for i in range(len(examples))]
    p = [_hand_mean_logprob(rows[s:s + len(e)], e.input_ids, e.labels) for s, e in zip(starts, examples)]
    expected = sum(
        -math.log(1 / (1 + math.exp(-(p[i] - p[i + 2])))) - alpha * p[i] for i in range(2)
    ) / 2
    assert out.chosen_logp.tolist() == pytest.approx(p[:2], abs=1e-5)
    assert out.rejected_logp.tolist() == pytest.approx(p[2:], abs=1e-5)
    assert out.loss.item() == pytest.approx(expected, abs=1e-5)


def test_alpha_default_and_unlabelled_branch_is_an_error():
    assert PairwiseConfig().alpha == 0.2
    batch = collate_pairs([(SFTExample([0, 1], [IGNORE_INDEX, 1]), SFTExample([0, 1], [IGNORE_INDEX, IGNORE_INDEX]))])
    with pytest.raises(ValueError, match=r"examples \[1\] have no labelled token"):
        mean_logprobs(torch.zeros(1, 4, 3), batch["labels"], batch["example_index"], 2)


def test_continuation_example_labels_only_the_continuation(tokenizer):
    prefix = render_segments([Segment("think", "I need the employer.")])
    act = render_segments([Segment("web_search", "Kato Rimu")])
    ex = continuation_example(tokenizer, "Who employs Kato Rimu?", prefix, act)
    labelled = [t for t in ex.labels if t != IGNORE_INDEX]
    assert tokenizer.decode(labelled) == "<web_search>Kato Rimu</web_search>"
    assert ex.input_ids[-len(labelled):] == labelled


def test_one_step_pushes_chosen_up_and_rejected_down(tokenizer, tiny_model):
    torch.manual_seed(0)
    prefix = render_segments([Segment("think", "The question names Kato Rimu but not the employer.")])
    questions = ["Who employs Kato Rimu?", "Where was Vazo Mira born?"]
    pairs = []
    for q, name in zip(questions, ["Kato Rimu", "Vazo Mira"]):
        chosen = render_segments([Segment("web_search", name)])
        rejected = render_segments([Segment("answer", "Lumo Works")])
        pairs.append((continuation_example(tokenizer, q, prefix, chosen), continuation_example(tokenizer, q, prefix, rejected)))
    batch = collate_pairs(pairs)
    model = tiny_model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = pairwise_loss(model, batch, alpha=0.2)
    before.loss.backward()
    opt.step()
    with torch.no_grad():
        after = pairwise_loss(model, batch, alpha=0.2)
    assert (after.chosen_logp > before.chosen_logp).all()
    assert (after.rejected_logp < before.rejected_logp).all()
    assert after.loss < before.loss
