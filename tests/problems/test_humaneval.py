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


def test_completion_code_reads_bodies_keeps_indentation_and_repairs_a_dedented_first_line():
    import textwrap

    from problems.humaneval import completion_code

    for p in humaneval_problems():
        meta, body = p.metadata, p.metadata["canonical_solution"]
        assert completion_code(meta, p.answers[0]) == "\n\n" + p.answers[0]  # whole function: after the prompt
        lines = body.split("\n")
        first = next(i for i, line in enumerate(lines) if line.strip())
        assert completion_code(meta, body) == "\n".join(lines[first:])  # a body keeps its indentation
        # what a .strip() leaves (first line at column 0) and a fully dedented body both come back as the body
        assert textwrap.dedent(completion_code(meta, body.strip())).strip() == textwrap.dedent(body).strip(), p.id
        assert textwrap.dedent(completion_code(meta, textwrap.dedent(body))).strip() == textwrap.dedent(body).strip()
    stripped = humaneval_problems()[0]
    assert _passes(humaneval_check_program(stripped, stripped.metadata["canonical_solution"].strip()))


def test_completion_code_tells_prose_from_code():
    from problems.humaneval import completion_code

    meta = humaneval_problems()[0].metadata
    for prose in ("done", "True", "It returns True for close numbers.", "42", "(" * 5000, "-" * 100_000 + "1", ""):
        assert completion_code(meta, prose) is None, prose[:20]
    assert completion_code(meta, "return False") == "    return False"
    assert completion_code(meta, "```python\n    return False\n```") == "    return False\n"
