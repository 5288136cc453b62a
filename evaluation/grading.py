"""Grade one episode and turn it into an `EvalRecord`: model rollouts (`training.rl_rollout.Episode`) and
teacher runs (`agents.teacher.log.MASLog`) end up in the same record shape.

Correctness by family (the same rules the RL reward uses, so eval measures what training optimized):
  * humaneval: the completion is run against the problem's tests in the sandbox; passing = exit status 0.
    The completion is the final <answer> if it holds a `def`, else the last <code> the model ran.
  * code/math families (computation, gsm8k, ...): numeric match of the final answer, else normalized match.
  * everything else: the configured judge (`training.rewards.Judge`: normalized match offline, an LLM judge
    when one is configured).
EM and F1 are always computed on normalized answers (SQuAD), as extra columns.

Tokens: a model episode counts prompt + generated + observation tokens (its one sequence); a teacher run
counts prompt + completion tokens of every agent call. See evaluation.efficiency.

Usage:
    record = episode_to_record(ep, model="sft", problem_set="multihop", judge=NormalizedMatchJudge(), limits=limits)
    record = mas_log_to_record(log, problem, problem_set="multihop", judge=judge, limits=limits)
"""
from __future__ import annotations

import re

from agents.teacher.log import MASLog
from agents.tools.sandbox import SandboxLimits, run_python
from evaluation.metrics import failure_category
from evaluation.records import EvalRecord
from problems.humaneval import humaneval_check_program
from problems.records import Problem
from training.rewards import (
    Judge, JudgeResult, exact_match, extract_answer, numeric_match, reward_kind, split_answers, token_f1,
)
from training.rl_rollout import Episode

_DEF_RE = re.compile(r"^\s*def \w+\s*\(", re.M)
_TOOL_FAILURES = ("error", "timeout", "memory", "killed", "sandbox_error", "refused", "not_found")


def grade_prediction(problem: Problem, prediction: str, judge: Judge, limits: SandboxLimits) -> JudgeResult:
    """Is `prediction` a correct answer to `problem`? (rules in the module docstring)"""
    if not prediction.strip():
        return JudgeResult(False, "no answer")
    if problem.family == "humaneval":
        result = run_python(humaneval_check_program(problem, prediction), limits)
        if result.status == "ok":
            return JudgeResult(True, "all tests passed")
        return JudgeResult(False, f"tests failed ({result.status}): {result.stderr.strip()[-300:]}")
    golden = split_answers(problem.answers)
    if reward_kind(problem.family) == "code":
        correct = bool(numeric_match(prediction, golden))
        return JudgeResult(correct, "numeric/normalized match" if correct else "no numeric/normalized match")
    return judge.judge(problem.question, golden, prediction)


def episode_prediction(problem: Problem, ep: Episode) -> str:
    """The answer text of a model episode ("" when it gave none); for HumanEval, the code to test."""
    answer = extract_answer(ep.model_text) or ""
    if problem.family != "humaneval" or _DEF_RE.search(answer):
        return answer
    code_calls = [call.argument for call in ep.tool_calls if call.tag == "code"]
    return code_calls[-1] if code_calls else answer


def episode_status(ep: Episode) -> str:
    """Rollout status mapped to evaluation.metrics categories: an unfinished episode whose last tool call
    failed counts as a tool error (the policy could not recover from it)."""
    if ep.status != "answered" and ep.tool_calls and ep.tool_calls[-1].status in _TOOL_FAILURES:
        return "tool_error"
    return ep.status


def _record(model: str, problem_set: str, problem: Problem, prediction: str, verdict: JudgeResult, steps: int,
            tokens: int, tool_calls: int, status: str, sample: int, transcript: str = "") -> EvalRecord:
    golden = split_answers(problem.answers)
    is_code = problem.family == "humaneval"
    return EvalRecord(
        model=model, problem_set=problem_set, problem_id=problem.id, question=problem.question, golden=golden,
        prediction=prediction, judge={"correct": verdict.correct, "rationale": verdict.rationale},
        em=float(verdict.correct) if is_code else exact_match(prediction, golden),
        f1=float(verdict.correct) if is_code else token_f1(prediction, golden),
        steps=steps, tokens=tokens, tool_calls=tool_calls, status=status,
        failure=failure_category(status, verdict.correct), sample=sample, transcript=transcript,
    )


def episode_to_record(ep: Episode, model: str, problem_set: str, judge: Judge, limits: SandboxLimits) -> EvalRecord:
    prediction = episode_prediction(ep.problem, ep)
    verdict = grade_prediction(ep.problem, prediction, judge, limits)
    return _record(model, problem_set, ep.problem, prediction, verdict, steps=ep.turns,
                   tokens=len(ep.prompt_ids) + len(ep.response_ids), tool_calls=len(ep.tool_calls),
                   status=episode_status(ep), sample=ep.sample_index, transcript=ep.response_text)


def mas_log_to_record(log: MASLog, problem: Problem, problem_set: str, judge: Judge, limits: SandboxLimits,
                      model: str = "teacher") -> EvalRecord:
    """A teacher MAS run as a record: tokens = every agent call's prompt + completion tokens."""
    prediction = log.final_answer or ""
    verdict = grade_prediction(problem, prediction, judge, limits)
    return _record(model, problem_set, problem, prediction, verdict, steps=len(log.events),
                   tokens=log.prompt_tokens + log.completion_tokens, tool_calls=log.tool_calls,
                   status="answered" if prediction.strip() else "no_answer", sample=log.sample_idx)


def failed_run_record(model: str, problem_set: str, problem: Problem, sample: int, error: str) -> EvalRecord:
    """A run that crashed (after retries) still counts: unanswered, with the error's tail as the rationale."""
    verdict = JudgeResult(False, f"run failed: {error.strip()[-300:]}")
    return _record(model, problem_set, problem, "", verdict, steps=0, tokens=0, tool_calls=0, status="no_answer",
                   sample=sample)
