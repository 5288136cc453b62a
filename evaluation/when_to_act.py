"""When-to-act metrics of issue #23: does the policy act when information is missing and answer when it is there?

Two views:
- `when_to_act_accuracy(model_dir, pairs)`: on held-out CoT+A pairs (distill/autocoa_pairs.py), the share where
  the policy prefers the chosen continuation: a higher P̄ (mean log-probability per continuation token, the very
  quantity the stage-1 pairwise loss trains; training/pairwise_loss.py) for chosen than for rejected. Overall and
  per case (`info_missing`: chosen acts; `info_present`: chosen answers). The acceptance target after SFT1 is
  >= 0.9.
- `action_rates(records, problems)`: on evaluation episodes (evaluation/records.py's EvalRecord), the
  acted-when-needed rate (a problem that needs a tool: the episode called one before it answered; also the
  stricter "before its first suggested answer", read from the transcript) and the abstained-when-not rate (a
  facts-given problem, distill/autocoa_pairs.facts_given_problem: the episode answered without any tool call).

Usage:
    when_to_act_accuracy("runs/sft1/policy", list(read_pairs("pairs_heldout.jsonl")))
    action_rates(read_records("runs/eval/episodes.jsonl"), problems)     # per model: filter records first
    .venv/bin/python -m pytest tests/autocoa/test_when_to_act.py -q
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from distill.autocoa_pairs import CASES, PairRecord, pair_examples
from evaluation.records import EvalRecord
from models.format import TOOL_TAGS
from models.packed_attention import packed_attention
from models.policy import load_policy
from problems.records import Problem
from training.pairwise_loss import collate_pairs, pairwise_loss_from_logits
from training.sft_data import model_inputs

_TOOL_OPEN = re.compile("|".join(f"<{t}>" for t in TOOL_TAGS))
_ANSWER_OPEN = re.compile(r"<(suggested_answer|answer)>")


@torch.no_grad()
def pair_margins(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, pairs: Sequence[PairRecord],
                 system_prompt: str | None = None, batch_size: int = 8) -> list[float]:
    """P̄_chosen - P̄_rejected per pair (eval mode, packed batches of `batch_size` pairs, as in training)."""
    was_training = model.training
    model.eval()
    margins: list[float] = []
    try:
        with packed_attention(model):
            for start in range(0, len(pairs), batch_size):
                batch = collate_pairs([pair_examples(tokenizer, p, system_prompt) for p in pairs[start:start + batch_size]])
                batch = {k: v.to(model.device) for k, v in batch.items()}
                out = pairwise_loss_from_logits(model(**model_inputs(batch)).logits, batch, alpha=0.0)
                margins += (out.chosen_logp - out.rejected_logp).tolist()
    finally:
        model.train(was_training)
    return margins


def margin_accuracy(pairs: Sequence[PairRecord], margins: Sequence[float]) -> dict:
    """{n, accuracy, margin_mean, <case>: {n, accuracy}} of per-pair margins (> 0: chosen preferred)."""
    def score(rows: list[float]) -> dict:
        return {"n": len(rows), "accuracy": sum(m > 0 for m in rows) / len(rows) if rows else 0.0}

    by_case = {case: score([m for p, m in zip(pairs, margins) if p.case == case]) for case in CASES}
    return {**score(list(margins)), "margin_mean": sum(margins) / len(margins) if margins else 0.0, **by_case}


def when_to_act_accuracy(model_dir: str | Path, pairs: list[PairRecord], system_prompt: str | None = None,
                         device: str = "cpu", batch_size: int = 8) -> dict:
    """When-to-act accuracy of the policy at `model_dir` on `pairs`: {n, accuracy, margin_mean,
    info_missing: {n, accuracy}, info_present: {n, accuracy}}. `system_prompt` must be the training one."""
    if not pairs:
        raise ValueError("when_to_act_accuracy: no pairs (is pairs_heldout.jsonl empty?)")
    model, tokenizer = load_policy(model_dir, device=device)
    return margin_accuracy(pairs, pair_margins(model, tokenizer, pairs, system_prompt, batch_size))


def acted_before_first_answer(record: EvalRecord) -> bool:
    """The episode called a tool before its first suggested or final answer (it did not guess first). Without a
    transcript (the teacher's records), any tool call counts."""
    if record.tool_calls == 0:
        return False
    if not record.transcript:
        return True
    first_tool, first_answer = _TOOL_OPEN.search(record.transcript), _ANSWER_OPEN.search(record.transcript)
    return first_tool is not None and (first_answer is None or first_tool.start() < first_answer.start())


def _rate(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def action_rates(records: Iterable[EvalRecord], problems: Iterable[Problem]) -> dict:
    """Rates over `records` (one model's episodes; filter by `record.model` first), split by what the problem
    needs. A problem needs a tool unless its metadata says `facts_given`. Returns
        acted_when_needed            share of needs-tool episodes with a tool call (an answer ends the episode,
                                     so every call came before the final answer)
        acted_before_first_answer    stricter: the first call came before the first suggested answer
        abstained_when_not           share of facts-given episodes answered (non-empty prediction) without a call
        needs_tool_episodes, facts_given_episodes
    A rate over no episode is None. Raises ValueError for a record whose problem is not in `problems`."""
    facts_given = {p.id: bool(p.metadata.get("facts_given")) for p in problems}
    needed, given = [], []
    for rec in records:
        if rec.problem_id not in facts_given:
            raise ValueError(f"record of problem {rec.problem_id!r} (set {rec.problem_set!r}): problem not given")
        (given if facts_given[rec.problem_id] else needed).append(rec)
    return {"acted_when_needed": _rate([r.tool_calls > 0 for r in needed]),
            "acted_before_first_answer": _rate([acted_before_first_answer(r) for r in needed]),
            "abstained_when_not": _rate([r.tool_calls == 0 and bool(r.prediction.strip()) for r in given]),
            "needs_tool_episodes": len(needed), "facts_given_episodes": len(given)}
