"""Grading episodes into records: judge routing, numeric match, HumanEval tests in the sandbox, and the token
accounting of a hand-built teacher MAS log."""
from __future__ import annotations

import json

import pytest

from agents.teacher.log import MASEvent, MASLog, ToolCall as MASToolCall
from agents.tools.sandbox import SandboxLimits
from evaluation.efficiency import compare_efficiency
from evaluation.grading import episode_prediction, episode_to_record, grade_prediction, mas_log_to_record
from problems.humaneval import humaneval_problems
from problems.records import Problem
from tests.evaluation.helpers import make_record
from training.rewards import LLMJudge, NormalizedMatchJudge
from training.rl_rollout import Episode, ToolCall

LIMITS = SandboxLimits(timeout_s=10, cpu_s=10)
QA = Problem(id="q1", question="Where was Kato Rimu born?", answers=["Velamo|Velamo City"], family="multihop")
COMP = Problem(id="c1", question="How many primes below 10?", answers=["41431"], family="computation")


def test_qa_goes_to_the_judge_and_keeps_its_rationale():
    replies = []

    def complete(messages):  # a judge endpoint that answers in AFM's JSON verdict format
        replies.append(messages[0]["content"])
        return 'Sure: {"rationale": "same city", "judgement": "correct"}'

    verdict = grade_prediction(QA, "velamo city", LLMJudge(complete), LIMITS)
    assert verdict.correct and verdict.rationale == "same city"
    assert "Golden answer(s): Velamo | Velamo City" in replies[0]
    assert not grade_prediction(QA, "Oslo", NormalizedMatchJudge(), LIMITS).correct
    assert grade_prediction(QA, "  ", NormalizedMatchJudge(), LIMITS).rationale == "no answer"


def test_computation_uses_numeric_match():
    assert grade_prediction(COMP, "41,431", NormalizedMatchJudge(), LIMITS).correct
    assert not grade_prediction(COMP, "41432", NormalizedMatchJudge(), LIMITS).correct


def test_humaneval_runs_tests_in_sandbox():
    problem = humaneval_problems()[0]
    assert grade_prediction(problem, problem.answers[0], NormalizedMatchJudge(), LIMITS).correct
    wrong = problem.metadata["prompt"] + "    return False\n"
    verdict = grade_prediction(problem, wrong, NormalizedMatchJudge(), LIMITS)
    assert not verdict.correct and "tests failed" in verdict.rationale


def test_episode_record_fields_and_humaneval_prediction_from_last_code_call():
    problem = humaneval_problems()[0]
    solution = problem.answers[0]
    ep = Episode(problem=problem, prompt_index=0, sample_index=2, prompt_ids=[1] * 10, response_ids=[2] * 30,
                 model_text=f"<code>```python\n{solution}```</code><answer>done</answer>",
                 tool_calls=[ToolCall("code", "```python\nprint(1)\n```", "ok", 0.1),
                             ToolCall("code", f"```python\n{solution}```", "ok", 0.1)],
                 turns=3, status="answered", pieces=["<code>x</code>", "<observation>ok</observation>"])
    assert episode_prediction(problem, ep) == f"```python\n{solution}```"
    rec = episode_to_record(ep, "sft", "humaneval", NormalizedMatchJudge(), LIMITS)
    assert rec.correct and rec.tokens == 40 and rec.tool_calls == 2 and rec.steps == 3 and rec.sample == 2
    assert rec.transcript == "<code>x</code><observation>ok</observation>"   # readable in episodes.jsonl
    assert rec.failure == "correct" and rec.em == 1.0


def test_unfinished_episode_after_failed_tool_is_tool_error():
    ep = Episode(problem=COMP, prompt_index=0, sample_index=0, prompt_ids=[1], response_ids=[2],
                 model_text="<code>```python\n1/0\n```</code>",
                 tool_calls=[ToolCall("code", "```python\n1/0\n```", "error", 0.1)], turns=1, status="max_turns")
    rec = episode_to_record(ep, "rl", "computation", NormalizedMatchJudge(), LIMITS)
    assert rec.status == "tool_error" and rec.failure == "tool_error" and rec.prediction == ""


def hand_built_log(sample: int, answer: str) -> MASLog:
    """Three agents: 100+20, 150+30 (search), 80+10 tokens; one tool call."""
    events = [
        MASEvent(0, "thinking", "thinking", "search it", prompt_tokens=100, completion_tokens=20),
        MASEvent(1, "search", "search", "q", tool_call=MASToolCall("web_search", "Kato Rimu"), observation="...",
                 prompt_tokens=150, completion_tokens=30),
        MASEvent(2, "thinking", "answer", answer, prompt_tokens=80, completion_tokens=10),
    ]
    return MASLog(f"q1#{sample}", "q1", QA.question, "multihop", events, answer, True, "oracle", sample_idx=sample)


def test_teacher_tokens_count_every_agent_call():
    rec = mas_log_to_record(hand_built_log(1, "Velamo"), QA, "multihop", NormalizedMatchJudge(), LIMITS)
    assert rec.tokens == 390 and rec.tool_calls == 1 and rec.steps == 3 and rec.sample == 1 and rec.correct
    assert rec.model == "teacher" and rec.status == "answered"
    empty = mas_log_to_record(hand_built_log(0, ""), QA, "multihop", NormalizedMatchJudge(), LIMITS)
    assert empty.status == "no_answer" and not empty.correct
    model = [make_record("rl", "q1", True, tokens=60, tool_calls=1)]
    cmp = compare_efficiency(model, [rec])
    assert cmp.token_reduction_pct == pytest.approx(100 * (60 - 390) / 390)
    assert json.loads(json.dumps(rec.to_dict()))["judge"]["correct"] is True


def test_failed_run_counts_as_unanswered():
    from evaluation.grading import failed_run_record

    rec = failed_run_record("teacher", "multihop", QA, 1, "Traceback ...\nValueError: backend down")
    assert rec.status == "no_answer" and not rec.correct and rec.sample == 1
    assert rec.judge["rationale"].endswith("ValueError: backend down")
