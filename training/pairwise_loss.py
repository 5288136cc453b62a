"""AutoCoA's when-to-act objective (SFT stage 1): a reference-free pairwise loss on (chosen, rejected) pairs.

Both branches of a pair share the prompt and a reasoning prefix and differ only in the continuation: one acts (a
tool call) at that point, the other does not (it answers). Only the continuation tokens are labelled (the prompt
and prefix are -100). With P̄ = the mean log-probability per labelled token of a branch (length-normalised, so a
long tool call and a short answer are compared per token),

    L = -log σ(P̄_chosen - P̄_rejected) - α · P̄_chosen        (α = 0.2, no reference model; AutoCoA's
                                                               LogprobsPairwiseTrainer, β effectively 1)

The α term keeps the chosen branch likely in absolute terms: without it the margin can grow by pushing both
branches down.

Batches reuse the SFT packing (training/sft_data.py): every branch is one `SFTExample`, all branches of a batch go
into ONE flat row with positions restarting per example (so the attention keeps them apart), and
`example_index` says which branch each token belongs to. Chosen branches are examples 0..B-1, rejected B..2B-1.

Usage:
    chosen = continuation_example(tok, question, prefix_text, chosen_text)     # "afm" tags; labels = continuation
    rejected = continuation_example(tok, question, prefix_text, rejected_text)
    batch = collate_pairs([(chosen, rejected), ...])
    out = pairwise_loss(model, batch, PairwiseConfig().alpha); out.loss.backward()
    out.chosen_logp, out.rejected_logp          # P̄ per pair (detached), for logging the margin

In the SFT trainer (`sft.objective: pairwise`, `data_format: pairs`): `build_pair_examples` turns pair records into
(chosen, rejected) examples, `pack_pairs` packs whole pairs into rows laid out [c0, r0, c1, r1, ...] (the row table
stores them like any SFT rows), and `pairwise_loss_sum` is the trainer's loss: the SUM over the micro-batch's pairs,
LM head only on labelled positions and in chunks (as training/sft_loss.py), so gradient accumulation and data
parallelism weight every pair of a step once (the trainer divides by the step's global pair count).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Literal, Sequence

import torch
import torch.nn.functional as F
from pydantic import Field
from transformers import PreTrainedTokenizerBase

from afm.config import Config
from models.format import parse_segments
from models.tokenizer import encode_prompt, encode_segment, encode_untrusted
from torch.utils.checkpoint import checkpoint

from training.parallel import hf_model
from training.sft_data import (
    IGNORE_INDEX, DataReport, SFTExample, best_fit_rows, collate_rows, model_inputs, target_positions,
)

TagStyle = Literal["afm", "plain"]


class PairwiseConfig(Config):
    """The when-to-act objective's knobs."""

    alpha: float = Field(0.2, ge=0.0, description="Weight of the -P̄_chosen term (mean log-prob per labelled chosen "
                                                   "token) added to -log σ(P̄_chosen - P̄_rejected); AutoCoA uses 0.2.")


@dataclass
class PairwiseResult:
    loss: torch.Tensor  # mean over pairs, differentiable
    chosen_logp: torch.Tensor  # P̄_chosen per pair, detached
    rejected_logp: torch.Tensor  # P̄_rejected per pair, detached


def _assistant_ids(tokenizer: PreTrainedTokenizerBase, text: str, tags: TagStyle) -> list[int]:
    """Ids of assistant text. "afm": our rendered segments, tokenized segment by segment exactly as SFT and RL do
    (tags are special tokens, observations untrusted). "plain": foreign text (AutoCoA's `<begin_search>` tags are
    not ours), tokenized as untrusted text so nothing in it can become a special token."""
    if tags == "plain":
        return encode_untrusted(tokenizer, text)
    return [t for seg in parse_segments(text) for t in encode_segment(tokenizer, seg)]


def continuation_example(tokenizer: PreTrainedTokenizerBase, question: str, prefix: str, continuation: str,
                         system_prompt: str | None = None, tags: TagStyle = "afm") -> SFTExample:
    """Prompt + shared prefix (labels -100) + continuation (labelled). No eos: a branch that ends in a tool call
    stops there (the environment speaks next), so neither branch is taught to end the turn."""
    context = encode_prompt(tokenizer, question, system_prompt) + (_assistant_ids(tokenizer, prefix, tags) if prefix else [])
    tail = _assistant_ids(tokenizer, continuation, tags)
    if not tail:
        raise ValueError("empty continuation: a pair branch must label at least one token")
    return SFTExample(context + tail, [IGNORE_INDEX] * len(context) + tail)


def collate_pairs(pairs: Sequence[tuple[SFTExample, SFTExample]]) -> dict[str, torch.Tensor]:
    """(chosen, rejected) pairs -> one packed row (collate_rows) plus `example_index` (1, N): chosen branches are
    examples 0..B-1, rejected ones B..2B-1."""
    if not pairs:
        raise ValueError("collate_pairs: no pairs")
    examples = [c for c, _ in pairs] + [r for _, r in pairs]
    batch = collate_rows([examples])
    batch["example_index"] = torch.cat(
        [torch.full((len(e),), i, dtype=torch.long) for i, e in enumerate(examples)]).unsqueeze(0)
    return batch


def mean_logprobs(logits: torch.Tensor, labels: torch.Tensor, example_index: torch.Tensor, n_examples: int) -> torch.Tensor:
    """P̄ per example: mean over its labelled tokens of log p(token | everything before it), in float32.

    `logits`, `labels`, `example_index` are (rows, T[, V]); position t's logits score token t+1. A packed row's
    boundary needs no care: every example's first label is -100, so no token is scored from another example.
    Raises ValueError if an example has no labelled token (its mean would be 0/0).
    """
    targets = labels[:, 1:]
    keep = targets != IGNORE_INDEX
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    token_logp = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)[keep]
    owner = example_index[:, 1:][keep]
    sums = torch.zeros(n_examples, dtype=torch.float32, device=logits.device).index_add(0, owner, token_logp)
    counts = torch.bincount(owner, minlength=n_examples)
    if bool((counts == 0).any()):
        raise ValueError(f"examples {(counts == 0).nonzero().flatten().tolist()} have no labelled token")
    return sums / counts


def pairwise_objective(chosen_logp: torch.Tensor, rejected_logp: torch.Tensor, alpha: float) -> torch.Tensor:
    """mean over pairs of -log σ(P̄_c - P̄_r) - α·P̄_c (logsigmoid: stable for large margins)."""
    return (-F.logsigmoid(chosen_logp - rejected_logp) - alpha * chosen_logp).mean()


def pairwise_loss_from_logits(logits: torch.Tensor, batch: dict[str, torch.Tensor], alpha: float) -> PairwiseResult:
    """The objective for logits already computed over `batch` (collate_pairs' layout)."""
    n_pairs = int(batch["example_index"].max()) // 2 + 1
    logp = mean_logprobs(logits, batch["labels"], batch["example_index"], 2 * n_pairs)
    chosen, rejected = logp[:n_pairs], logp[n_pairs:]
    return PairwiseResult(pairwise_objective(chosen, rejected, alpha), chosen.detach(), rejected.detach())


def pairwise_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], alpha: float) -> PairwiseResult:
    """One forward of the packed pair batch through `model` (a causal LM), then the objective."""
    logits = model(**model_inputs(batch)).logits
    return pairwise_loss_from_logits(logits, batch, alpha)


def read_pair_dicts(path: str | Path) -> Iterator[dict]:
    """Pair records (distill/autocoa_pairs.py's JSONL) as dicts; a line that is not an object with the string fields
    question/prefix/chosen/rejected raises ValueError naming file and line."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not all(isinstance(record.get(k), str) for k in ("question", "prefix", "chosen", "rejected")):
                    raise ValueError("question/prefix/chosen/rejected must be strings")
            except (json.JSONDecodeError, ValueError, AttributeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a pair record: {exc}") from exc
            yield record


def build_pair_examples(records: Iterable[dict], tokenizer: PreTrainedTokenizerBase, system_prompt: str | None,
                        max_len: int) -> tuple[list[tuple[SFTExample, SFTExample]], DataReport]:
    """(chosen, rejected) examples of every pair whose two branches fit one row of `max_len` together (a pair is
    never cut: truncating a branch would change what is contrasted). `report.trajectories` counts pairs,
    `examples` branches."""
    report, pairs = DataReport(), []
    for record in records:
        report.trajectories += 1
        pair = tuple(continuation_example(tokenizer, record["question"], record["prefix"], record[k], system_prompt,
                                          record.get("tags", "afm")) for k in ("chosen", "rejected"))
        if len(pair[0]) + len(pair[1]) > max_len:
            report.dropped_too_long += 1
            report.dropped_ids.append(str(record.get("id", report.trajectories - 1)))
            continue
        pairs.append(pair)
        report.tokens += len(pair[0]) + len(pair[1])
        report.target_tokens += pair[0].n_targets + pair[1].n_targets
    report.examples = 2 * len(pairs)
    return pairs, report


def pack_pairs(pairs: Sequence[tuple[SFTExample, SFTExample]], max_len: int, pack: bool = True) -> list[list[SFTExample]]:
    """Rows of whole pairs, laid out [c0, r0, c1, r1, ...]: best-fit decreasing on a pair's total length (as
    sft_data.pack_examples), or one pair per row when `pack` is False."""
    if not pack:
        return [[c, r] for c, r in pairs]
    rows = best_fit_rows([len(c) + len(r) for c, r in pairs], max_len)
    return [[example for i in row for example in pairs[i]] for row in rows]


def count_pairs(batch: dict[str, torch.Tensor]) -> int:
    """Pairs in a collate_rows batch of pair rows (two examples a pair; every example starts at position 0)."""
    return int((batch["position_ids"][0] == 0).sum()) // 2


@dataclass
class PairwiseSums:
    loss_sum: torch.Tensor  # sum over the batch's pairs of the objective, differentiable
    chosen_logp: torch.Tensor  # P̄_chosen per pair, detached
    rejected_logp: torch.Tensor  # P̄_rejected per pair, detached


def pairwise_loss_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor], alpha: float,
                      chunk_tokens: int = 2048) -> PairwiseSums:
    """The objective summed over the pairs of a batch of pair rows ([c, r, c, r, ...] per row, collate_rows).

    Only labelled positions reach the LM head, `chunk_tokens` at a time under a non-reentrant checkpoint, so at
    most one chunk of fp32 (tokens x vocab) log-probabilities exists at once (a 152k vocabulary on long rows)."""
    keep = target_positions(batch).to(batch["input_ids"].device)
    out = model(**model_inputs(batch), logits_to_keep=keep[:0], output_hidden_states=True)
    hidden = out.hidden_states[-1][0, keep]
    targets = batch["labels"][0, keep + 1]
    head = hf_model(model).get_output_embeddings()

    def piece(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(head(h).float(), dim=-1).gather(-1, t.unsqueeze(-1)).squeeze(-1)

    if hidden.shape[0] <= chunk_tokens:
        token_logp = piece(hidden, targets)
    else:
        token_logp = torch.cat([checkpoint(piece, hidden[s:s + chunk_tokens], targets[s:s + chunk_tokens],
                                           use_reentrant=False) for s in range(0, hidden.shape[0], chunk_tokens)])
    # Example number of each position: positions restart at 0 per example; position t+1's example owns target t.
    starts = (batch["position_ids"][0] == 0).long()
    owner = (torch.cumsum(starts, 0) - 1).to(keep.device)[keep + 1]
    n_examples = int(starts.sum())
    sums = torch.zeros(n_examples, dtype=torch.float32, device=hidden.device).index_add(0, owner, token_logp)
    counts = torch.bincount(owner, minlength=n_examples)
    if bool((counts == 0).any()):
        raise ValueError(f"examples {(counts == 0).nonzero().flatten().tolist()} have no labelled token")
    mean = sums / counts
    chosen, rejected = mean[0::2], mean[1::2]
    loss = (-F.logsigmoid(chosen - rejected) - alpha * chosen).sum()
    return PairwiseSums(loss, chosen.detach(), rejected.detach())
