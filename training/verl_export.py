"""Export an RL problem set as verl-style parquet, so the same problems and rewards train at scale under verl.

Row layout (the AFM release's RL data):
    data_source            problem family ("computation", "multihop", ...): selects the reward in compute_score
    prompt                 [{"role": "user", "content": question}]
    ability                "code" or "qa" (verl groups metrics by it)
    reward_model           {"style": "rule", "ground_truth": "ans1|ans2"}   (alternatives joined with `|`)
    extra_info             {"index", "question", "answer": [...], "problem_id", "split"}

The reward for verl is `training.rewards.compute_score` (point verl's `custom_reward_function.path` at
training/rewards.py, `name: compute_score`).

Usage:
    python -m training.verl_export problems.jsonl out/train.parquet
    write_verl_parquet(problems, path); rows = read_verl_parquet(path)
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from problems.records import Problem, read_problems
from training.rewards import reward_kind


def problem_to_verl_row(problem: Problem, index: int) -> dict[str, Any]:
    return {
        "data_source": problem.family,
        "prompt": [{"role": "user", "content": problem.question}],
        "ability": "code" if reward_kind(problem.family) == "code" else "qa",
        "reward_model": {"style": "rule", "ground_truth": "|".join(problem.answers)},
        "extra_info": {"index": index, "question": problem.question, "answer": list(problem.answers),
                       "problem_id": problem.id, "split": problem.split},
    }


def write_verl_parquet(problems: Iterable[Problem], path: str | Path) -> int:
    """Write problems as verl parquet (temp file + rename); returns the row count."""
    rows = [problem_to_verl_row(p, i) for i, p in enumerate(problems)]
    if not rows:
        raise ValueError(f"{path}: no problems to export")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)
    return len(rows)


def read_verl_parquet(path: str | Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m training.verl_export PROBLEMS.jsonl OUT.parquet")
    count = write_verl_parquet(read_problems(sys.argv[1]), sys.argv[2])
    print(f"wrote {count} rows to {sys.argv[2]}")
