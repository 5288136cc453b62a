"""Per-episode evaluation records and their JSONL file (one line per sampled episode).

A record is one sample of one model (or the teacher MAS) on one problem: what it answered, what the judge
said, how many steps / tokens / tool calls it spent and how it ended. The AFM release writes
{question_id, question, golden_answer, prediction, llm_judge, steps, status, error}; we keep the same content
plus the cost fields the efficiency report needs.

Usage:
    write_records(path, records)        # temp file + rename: a crash never leaves a half-written file
    records = read_records(path)
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable


@dataclass
class EvalRecord:
    model: str          # label of the model in the comparison ("teacher", "sft", ...)
    problem_set: str    # label of the problem set ("multihop", "computation", "humaneval", ...)
    problem_id: str
    question: str
    golden: list[str]   # accepted answers (for HumanEval: the tests are run, golden is the canonical solution)
    prediction: str     # the final answer text ("" when the episode gave none)
    judge: dict[str, Any]  # {"correct": bool, "rationale": str}
    em: float           # exact match of the normalized prediction against any golden answer (0/1)
    f1: float           # best token F1 against the golden answers
    steps: int          # model turns (teacher: agent calls)
    tokens: int         # tokens processed for this episode; see evaluation.efficiency for what is counted
    tool_calls: int
    status: str         # how the episode ended: answered, format_error, max_turns, length, tool_error, no_answer
    failure: str        # evaluation.metrics.failure_category(status, correct)
    sample: int         # sample index 0..n-1 (for pass@k)
    transcript: str = ""  # the episode as the model saw it (generated turns + observations); teacher: ""

    @property
    def correct(self) -> bool:
        return bool(self.judge["correct"])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EvalRecord":
        return cls(**data)


def write_records(path: str | Path, records: Iterable[EvalRecord]) -> int:
    """Write records as JSONL via a temp file renamed into place; returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def read_records(path: str | Path) -> list[EvalRecord]:
    """Read a records JSONL; a malformed line raises ValueError naming file and line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(EvalRecord.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not an evaluation record: {exc}") from exc
    return out
