"""The `Problem` record every problem source yields and every stage (teacher, RL, eval) consumes.

A problem is one question with its accepted answers. `family` names the generator or dataset
("multihop", "computation", "humaneval", "hotpotqa", "gsm8k", "math", "afm_qa"); `split` is "train",
"heldout" (held-out *entities* for the generated world) or "test"; `metadata` carries what a family needs
(e.g. the solution path the scripted oracle follows, HumanEval's tests).

Usage:
    write_problems(path, problems); problems = read_problems(path)
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable


class ProblemFormatError(ValueError):
    """A malformed problem row; the message names file and line."""


@dataclass
class Problem:
    id: str
    question: str
    answers: list[str]
    family: str
    split: str = "train"
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Problem":
        return cls(
            id=str(data["id"]), question=data["question"], answers=list(data["answers"]), family=data["family"],
            split=data.get("split", "train"), source=data.get("source", ""), metadata=dict(data.get("metadata") or {}),
        )


def write_problems(path: str | Path, problems: Iterable[Problem]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps(p.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    return n


def read_problems(path: str | Path) -> list[Problem]:
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(Problem.from_dict(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ProblemFormatError(f"{path}:{lineno}: not a problem record: {exc}") from exc
    return out
