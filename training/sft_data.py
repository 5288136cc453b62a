"""SFT data: CoA trajectories -> (input_ids, labels) examples -> packed rows -> model-ready batches.

Pipeline (plain functions, no Ray/Prefect; training/sft_rows.py runs the first two once per data set and
tokenizer, a chunk of records at a time, and stores the rows as a memory-mapped Arrow file in the artifact store):
    examples, report = build_examples(trajectories, tokenizer, system_prompt, max_len)
    rows = pack_examples(examples, max_len) if pack else [[e] for e in examples]
    order = epoch_row_order(len(rows), seed, epoch)
    batch = collate_rows([rows[i] for i in order[:4]])     # one flat (1, N) sequence of the rows' examples
    n_targets = count_targets(batch)           # the loss itself: training/sft_loss.py
    path, manifest = resolve_dataset("s3://afm/artifacts/stages/distill-<key>", "train.jsonl", work_dir)  # or a .jsonl

Labels. `labels[t] = input_ids[t]` where the model wrote token t (loss mask 1) and -100 on the prompt and on
EVERY observation token (tags and newlines included), as `models.tokenizer.encode_trajectory` masks them.
The first token of every example is always -100, so in a packed row no example's first token is ever a
target predicted from the previous example's last token.

Truncation. An example longer than `max_len` is cut at the end of an observation, i.e. at the segment
boundary just before the model turn that follows it; so a tool call is never kept without its observation
(the turn whose tool call or observation would not fit is dropped whole, think/plan segments before the
call included: the loss mask tells where observations end, not where segments inside a model turn start,
and that works for any tokenizer, tiny or Qwen). An example whose prompt, first model turn and first
observation already exceed `max_len` cannot be cut and is dropped; `DataReport` counts both cases.

Packing and the flat micro-batch. Examples are packed best-fit-decreasing into rows of at most `max_len`
tokens (rows are the unit of shuffling, resume and data parallelism). A micro-batch of rows is collated into
ONE flat sequence (1, N) of its examples, no padding, with `position_ids` restarting at 0 per example. The
trainer's model runs `models.packed_attention` (one causal sdpa call per example: cost sum(L_i^2), not N^2);
with stock sdpa/eager, transformers 5 (`masking_utils.find_packed_sequence_indices`) turns the same restarting
position_ids into a block-diagonal causal mask, so the result is the same, only slower (tests/sft/
test_sft_data.py checks both against each example alone), and flash-attention-2 on GPU reads them as varlen
cu_seqlens. `model_inputs` passes `attention_mask=None` and `use_cache=False`: with a KV cache or a 2D mask
transformers silently falls back to one causal mask over the whole sequence, letting examples see each other.

Only target positions reach the LM head (`target_positions`; the chunked loss is in training/sft_loss.py).
"""
from __future__ import annotations

import bisect
from pathlib import Path
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from afm.storage import open_store, sha256_file
from models.format import Trajectory
from models.tokenizer import EncodedExample, encode_trajectory

IGNORE_INDEX = -100


@dataclass
class SFTExample:
    """One training sequence: token ids and labels (-100 where no loss is taken)."""

    input_ids: list[int]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def n_targets(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


@dataclass
class DataReport:
    """What happened to the trajectories on the way to examples."""

    trajectories: int = 0
    examples: int = 0
    truncated: int = 0  # cut at an observation boundary to fit max_len
    dropped_too_long: int = 0  # could not be cut to fit max_len
    dropped_ids: list[str] = field(default_factory=list)
    tokens: int = 0  # tokens in kept examples
    target_tokens: int = 0  # tokens that carry a label

    def add(self, other: "DataReport") -> None:
        """Fold in the report of another chunk of the same data (counts add up, dropped ids append)."""
        for name in ("trajectories", "examples", "truncated", "dropped_too_long", "tokens", "target_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.dropped_ids.extend(other.dropped_ids)

    def as_metrics(self) -> dict[str, int]:
        return {
            "data.trajectories": self.trajectories, "data.examples": self.examples,
            "data.truncated": self.truncated, "data.dropped_too_long": self.dropped_too_long,
            "data.tokens": self.tokens, "data.target_tokens": self.target_tokens,
        }


def labels_from_mask(encoded: EncodedExample, learn_observations: bool = False) -> SFTExample:
    """Labels = ids where loss_mask is 1, else -100; the first token is never a target (see module doc).

    `learn_observations` (AutoCoA's world-model stage): every token after the prompt is a target, observations
    included, so the model learns to predict what the tools return."""
    if len(encoded.input_ids) != len(encoded.loss_mask):
        raise ValueError(f"input_ids ({len(encoded.input_ids)}) and loss_mask ({len(encoded.loss_mask)}) differ in length")
    mask = encoded.loss_mask
    if learn_observations:
        prompt_end = next((i for i, keep in enumerate(mask) if keep), len(mask))
        mask = [0] * prompt_end + [1] * (len(mask) - prompt_end)
    labels = [tok if keep else IGNORE_INDEX for tok, keep in zip(encoded.input_ids, mask)]
    if labels:
        labels[0] = IGNORE_INDEX
    return SFTExample(list(encoded.input_ids), labels)


def observation_end_cuts(loss_mask: Sequence[int]) -> list[int]:
    """Token positions where an observation ends and a model turn begins (0 -> 1 after the prompt).

    Cutting a sequence at one of these keeps every tool call together with its whole observation.
    """
    prompt_end = next((i for i, keep in enumerate(loss_mask) if keep), len(loss_mask))
    return [i for i in range(prompt_end + 1, len(loss_mask)) if loss_mask[i] and not loss_mask[i - 1]]


def truncate_at_observation_boundary(encoded: EncodedExample, max_len: int) -> EncodedExample | None:
    """`encoded` if it fits, else its longest prefix ending at an observation boundary within max_len, else None."""
    if len(encoded.input_ids) <= max_len:
        return encoded
    cuts = [c for c in observation_end_cuts(encoded.loss_mask) if c <= max_len]
    if not cuts:
        return None
    cut = cuts[-1]
    return EncodedExample(encoded.input_ids[:cut], encoded.loss_mask[:cut])


def build_examples(
    trajectories: Iterable[Trajectory],
    tokenizer: PreTrainedTokenizerBase,
    system_prompt: str | None,
    max_len: int,
    learn_observations: bool = False,
) -> tuple[list[SFTExample], DataReport]:
    """Encode, truncate and label every trajectory; returns the kept examples and a report of what was cut.
    Truncation still cuts at observation ends when observations are learned (a call keeps its observation)."""
    report = DataReport()
    examples: list[SFTExample] = []
    for traj in trajectories:
        report.trajectories += 1
        encoded = encode_trajectory(tokenizer, traj, system_prompt)
        fitted = truncate_at_observation_boundary(encoded, max_len)
        if fitted is None:
            report.dropped_too_long += 1
            report.dropped_ids.append(traj.id)
            continue
        if fitted is not encoded:
            report.truncated += 1
        example = labels_from_mask(fitted, learn_observations)
        examples.append(example)
        report.tokens += len(example)
        report.target_tokens += example.n_targets
    report.examples = len(examples)
    return examples, report


def best_fit_rows(lengths: Sequence[int], max_len: int) -> list[list[int]]:
    """Best-fit-decreasing bin packing of items with these token lengths into rows of at most `max_len` tokens
    (deterministic); returns each row's item indices in placement order.

    Longest items first; each goes into the open row with the least room that still fits it.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    # (room left, row index) sorted by room, so bisect finds the tightest row that fits.
    rooms: list[tuple[int, int]] = []
    for i in order:
        pos = bisect.bisect_left(rooms, (lengths[i], -1))
        if pos == len(rooms):
            rows.append([i])
            bisect.insort(rooms, (max_len - lengths[i], len(rows) - 1))
            continue
        room, row = rooms.pop(pos)
        rows[row].append(i)
        bisect.insort(rooms, (room - lengths[i], row))
    return rows


def pack_examples(examples: Sequence[SFTExample], max_len: int) -> list[list[SFTExample]]:
    """Best-fit-decreasing rows of examples (`best_fit_rows`). Rows keep examples in placement order; the
    trainer shuffles row order per epoch."""
    for example in examples:
        if len(example) > max_len:
            raise ValueError(f"example of {len(example)} tokens exceeds max_len={max_len}; "
                             "build_examples truncates first")
    return [[examples[i] for i in row] for row in best_fit_rows([len(e) for e in examples], max_len)]


def epoch_row_order(n_rows: int, seed: int, epoch: int) -> list[int]:
    """The row order of one epoch: a permutation that depends only on (seed, epoch), so resume can rebuild it."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n_rows, generator=generator).tolist()


def collate_rows(rows: Sequence[Sequence[SFTExample]]) -> dict[str, torch.Tensor]:
    """Rows of examples -> ONE flat sequence: `input_ids`, `labels`, `position_ids` of shape (1, N), no padding.

    Positions restart at 0 per example (module doc); N = the examples' total length.
    """
    examples = [example for row in rows for example in row]
    return {
        "input_ids": torch.tensor([[t for e in examples for t in e.input_ids]], dtype=torch.long),
        "labels": torch.tensor([[t for e in examples for t in e.labels]], dtype=torch.long),
        "position_ids": torch.cat([torch.arange(len(e)) for e in examples]).unsqueeze(0),
    }


def model_inputs(batch: dict[str, torch.Tensor]) -> dict:
    """Forward kwargs that keep packed examples apart (restarting positions, no 2D mask, no KV cache)."""
    return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "attention_mask": None, "use_cache": False}


def target_positions(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Positions t of the flat sequence whose next token t+1 carries a label (what the loss predicts from)."""
    return (batch["labels"][0, 1:] != IGNORE_INDEX).nonzero().flatten()


def count_targets(batch: dict[str, torch.Tensor]) -> int:
    """Number of predicted tokens in a batch (labels after the shift that are not -100)."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def resolve_dataset(dataset: str, dataset_file: str, work_dir: Path) -> tuple[Path, dict]:
    """A local JSONL path for `dataset` and its manifest (`uri`, `digest`, ...).

    A `.jsonl` file is used in place (manifest made here: digest = its sha256); anything else is an
    artifact (`<root>/<name>` directory or s3:// URI) fetched sha256-verified into `work_dir`.
    """
    path = Path(dataset)
    if dataset.endswith(".jsonl") and path.is_file():
        digest = sha256_file(path)
        return path, {"uri": str(path.resolve()), "digest": digest, "files": {path.name: {"sha256": digest}}}
    root, _, name = dataset.rstrip("/").rpartition("/")
    store = open_store(root or ".")
    manifest = store.read_manifest(name)
    if manifest is None:
        raise FileNotFoundError(
            f"dataset {dataset!r}: neither a .jsonl file nor an artifact with a manifest.json; "
            f"pass the trajectories file or the artifact written by the filtering stage"
        )
    if dataset_file not in manifest["files"]:
        raise FileNotFoundError(f"dataset {dataset!r}: no {dataset_file!r} in its manifest (has {sorted(manifest['files'])}); set dataset_file")
    local = store.fetch_artifact(name, Path(work_dir) / name)
    return local / dataset_file, manifest


def dataset_identity(dataset: str) -> tuple[str, str]:
    """(uri, sha256 digest) of the dataset, for lineage: the manifest digest of an artifact, else the file's sha."""
    if dataset.endswith(".jsonl") and Path(dataset).is_file():
        return str(Path(dataset).resolve()), sha256_file(Path(dataset))
    root, _, name = dataset.rstrip("/").rpartition("/")
    manifest = open_store(root or ".").read_manifest(name)
    return manifest["uri"], manifest["digest"]
