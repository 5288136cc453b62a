"""Computation problems: running the solution code prints the answer; running the slip prints the wrong value."""
import re
import subprocess
import sys

from problems.computation import KINDS, computation_problems


def _run(fenced: str) -> str:
    code = re.fullmatch(r"```python\n(.*)\n```", fenced, re.S).group(1)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30).stdout.strip()


def test_solution_code_prints_the_answer_and_slip_prints_a_wrong_one():
    problems = computation_problems(len(KINDS), rng_seed=0, split="train")
    assert {p.metadata["solution"]["kind"] for p in problems} == set(KINDS)
    for p in problems:
        sol = p.metadata["solution"]
        step = sol["steps"][0]
        assert step["tool"] == "code"
        assert _run(step["argument"]) == step["finding"] == p.answers[0]
        assert _run(sol["slip"]["argument"]) == sol["slip"]["finding"] != p.answers[0]
        assert int(p.answers[0]) > 50  # not a head-arithmetic number


def test_deterministic_distinct_and_split_dependent():
    a = computation_problems(21, rng_seed=4, split="train")
    assert [p.to_dict() for p in a] == [p.to_dict() for p in computation_problems(21, rng_seed=4, split="train")]
    assert len({p.question for p in a}) == 21
    test = computation_problems(21, rng_seed=4, split="test")
    assert not {p.question for p in a} & {p.question for p in test}
    assert all(p.family == "computation" and p.split == "test" for p in test)
