"""Plain-text documents as training examples (the pretraining stage): every token after the first is a target.

The pretraining stage runs the SFT trainer unchanged (packing, per-example attention, checkpoints, Ray Train,
MLflow) on a JSONL file of `{"text": ...}` records instead of trajectories (`SFTConfig.data_format: text`).
A document becomes `tokens(text) + eos`; one longer than `max_len` is cut into `max_len` pieces (nothing is
dropped). Text is tokenized as untrusted plain text (`encode_untrusted`): a page that contains `<answer>` never
yields a tag id.

    examples, report = build_text_examples(read_text_records(path), tokenizer, max_len=1024)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

from transformers import PreTrainedTokenizerBase

from models.tokenizer import encode_untrusted
from training.sft_data import IGNORE_INDEX, DataReport, SFTExample


def read_text_records(path: str | Path) -> Iterator[str]:
    """The `text` of every JSONL record; a bad line raises ValueError naming file and line."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not JSON ({exc.msg}); expected {{\"text\": \"...\"}}") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"{path}:{line_no}: expected an object with a string field 'text'")
            yield record["text"]


def build_text_examples(texts: Iterable[str], tokenizer: PreTrainedTokenizerBase, max_len: int
                        ) -> tuple[list[SFTExample], DataReport]:
    """One example per `max_len` piece of each document; labels = ids (the first token of a piece is never a
    target: it has no prediction within the piece). `DataReport.trajectories` counts documents."""
    report = DataReport()
    examples: list[SFTExample] = []
    for text in texts:
        report.trajectories += 1
        ids = encode_untrusted(tokenizer, text) + [tokenizer.eos_token_id]
        if len(ids) > max_len:
            report.truncated += 1
        for start in range(0, len(ids), max_len):
            piece = ids[start:start + max_len]
            if len(piece) < 2:  # a lone token predicts nothing
                continue
            example = SFTExample(piece, [IGNORE_INDEX] + piece[1:])
            examples.append(example)
            report.tokens += len(example)
            report.target_tokens += example.n_targets
    report.examples = len(examples)
    return examples, report
