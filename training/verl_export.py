"""Export an RL problem set as verl-style parquet, so the same problems and rewards train at scale under verl.

Row layout (the AFM release's RL data):
    data_source            problem family ("computation", "multihop", ...): selects the rule in compute_score
    prompt                 [{"role": "user", "content": question}]
    ability                "code" or "qa" (verl groups metrics by it)
    reward_model           {"style": "rule", "ground_truth": ...}: QA families "ans1|ans2" (alternatives joined
                           with `|`, AFM convention); code/math families the first answer, never `|`-joined
                           (`|` is Python's `or`, math's absolute value)
    extra_info             {"index", "question", "answer": [...], "problem_id", "split"}, plus for families
                           scored by tests (HumanEval) "tests": {"prompt", "test", "entry_point"}. `answer` is
                           the list of alternatives compute_score grades against; `tests` is what it runs a
                           code answer against (rows without tests read back with tests=None).

The reward for verl is `training.rewards.compute_score` (point verl's `custom_reward_function.path` at
training/rewards.py, `name: compute_score`): the same grader (training.scoring) the in-process RL trainer and
evaluation use, so a HumanEval answer is executed against its tests, not compared as text.

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
from training.scoring import TEST_FIELDS, reward_kind


def problem_to_verl_row(problem: Problem, index: int) -> dict[str, Any]:
    kind = reward_kind(problem.family)
    code = kind in ("code", "tests")
    extra_info: dict[str, Any] = {"index": index, "question": problem.question, "answer": list(problem.answers),
                                  "problem_id": problem.id, "split": problem.split}
    if kind == "tests":
        missing = [key for key in TEST_FIELDS if not problem.metadata.get(key)]
        if missing:
            raise ValueError(f"problem {problem.id} ({problem.family}): metadata lacks {missing}; its answers "
                             "could not be run against tests")
        extra_info["tests"] = {key: problem.metadata[key] for key in TEST_FIELDS}
    ground_truth = next(iter(problem.answers), "") if code else "|".join(problem.answers)
    return {
        "data_source": problem.family,
        "prompt": [{"role": "user", "content": problem.question}],
        "ability": "code" if code else "qa",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
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
