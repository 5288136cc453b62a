"""HumanEval loads from the installed package and its check program passes/fails the right completions."""
import subprocess
import sys

from problems.humaneval import humaneval_check_program, humaneval_problems


def _passes(program: str) -> bool:
    return subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=30).returncode == 0


def test_loads_all_164_problems():
    problems = humaneval_problems()
    assert len(problems) == 164 and len({p.id for p in problems}) == 164
    p = problems[0]
    assert p.id == "HumanEval/0" and p.family == "humaneval" and p.split == "test"
    assert set(p.metadata) == {"prompt", "test", "entry_point", "canonical_solution"}
    assert p.metadata["prompt"] in p.question


def test_check_program_accepts_body_or_whole_function_and_rejects_wrong_code():
    problems = humaneval_problems()
    for p in problems[:3]:
        assert _passes(humaneval_check_program(p, p.metadata["canonical_solution"]))
        whole = f"Here it is:\n```python\n{p.answers[0]}```\n"  # a chat-style fenced whole function
        assert _passes(humaneval_check_program(p, whole))
        assert not _passes(humaneval_check_program(p, "    return None\n"))
