"""Grade one episode and turn it into an `EvalRecord`: model rollouts (`training.rl_rollout.Episode`) and
teacher runs (`agents.teacher.log.MASLog`) end up in the same record shape.

Correctness is `training.scoring.grade`, the one grader the RL reward and verl's compute_score use too, on the
prediction `training.scoring.extract_prediction` reads from the model's text; so eval measures what training
optimized, rule for rule: HumanEval code runs against the problem's tests in the sandbox (the final <answer>
when it is code, a whole function or a body; else the last <code> the model ran), numeric families use numeric
match, everything else the configured judge (`training.scoring.Judge`: normalized match offline, an LLM judge
when one is configured); per-family answer-size limits are reported in the rationale. A teacher run's final
answer goes through the same `grade`. EM and F1 are always computed on normalized answers (SQuAD), as extra
columns.

Tokens: a model episode counts prompt + generated + observation tokens (its one sequence); a teacher run
counts prompt + completion tokens of every agent call. See evaluation.efficiency.

Usage:
    record = episode_to_record(ep, model="sft", problem_set="multihop", judge=NormalizedMatchJudge(), limits=limits)
    record = mas_log_to_record(log, problem, problem_set="multihop", judge=judge, limits=limits)
"""
from __future__ import annotations

from agents.teacher.log import MASLog
from agents.tools.sandbox import SandboxLimits
from evaluation.metrics import failure_category
from evaluation.records import EvalRecord
from problems.records import Problem
from training.rl_rollout import Episode
from training.scoring import (
    Judge, JudgeResult, exact_match, extract_prediction, golden_answers, grade, reward_kind, token_f1,
)

_TOOL_FAILURES = ("error", "timeout", "memory", "killed", "sandbox_error", "refused", "not_found")


def grade_prediction(problem: Problem, prediction: str, judge: Judge, limits: SandboxLimits) -> JudgeResult:
    """Is `prediction` a correct answer to `problem`? (`training.scoring.grade`: the rules RL and verl use)"""
    return grade(problem.family, prediction, problem.answers, judge, problem.question, tests=problem.metadata,
                 limits=limits)


def episode_prediction(problem: Problem, ep: Episode) -> str:
    """What a model episode is graded on ("" when it gave none): its final answer, or for HumanEval the last
    <code> it ran when the answer is not code (`training.scoring.extract_prediction`, as the RL reward reads)."""
    return extract_prediction(problem.family, ep.model_text, problem.metadata) or ""


def episode_status(ep: Episode) -> str:
    """Rollout status mapped to evaluation.metrics categories: an unfinished episode whose last tool call
    failed counts as a tool error (the policy could not recover from it)."""
    if ep.status != "answered" and ep.tool_calls and ep.tool_calls[-1].status in _TOOL_FAILURES:
        return "tool_error"
    return ep.status


def _record(model: str, problem_set: str, problem: Problem, prediction: str, verdict: JudgeResult, steps: int,
            tokens: int, tool_calls: int, status: str, sample: int, transcript: str = "") -> EvalRecord:
    golden = golden_answers(problem.family, problem.answers)
    is_code = reward_kind(problem.family) == "tests"  # a program has no meaningful EM/F1: its verdict stands in
    return EvalRecord(
        model=model, problem_set=problem_set, problem_id=problem.id, question=problem.question, golden=golden,
        prediction=prediction, judge={"correct": verdict.correct, "rationale": verdict.rationale},
        em=float(verdict.correct) if is_code else exact_match(prediction, golden, problem.family),
        f1=float(verdict.correct) if is_code else token_f1(prediction, golden, problem.family),
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
