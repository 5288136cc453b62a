"""MAS log -> one Chain-of-Agents trajectory.

Mapping (events in order, every tool call and observation kept):
    thinking -> <think>, planning -> <plan>, reflection -> <reflection>, verification -> <double_check>,
    search/crawl/code -> <web_search>/<crawl_page>/<wiki_search>/<code> (the call's own tag) + <observation>,
    answer events -> <suggested_answer> for every one but the last, <answer> for the last (the verified answer).
Metadata: teacher, source_log_id, problem_id, sample_idx, MAS token counts, tool-call count, verified,
reflective (has a reflection) and erred_and_corrected (a reflection scored poor or a double_check scored <= 2,
and the run still ended verified), parse_failures (role replies still unparseable after their retries).
`protocol_counts` sums the logs' parse retries and failures for the distill report.

Usage:
    traj = mas_log_to_trajectory(log)           # raises ConversionError for a log without a final answer
    trajs, failures = convert_logs(logs)        # failures: Counter of reasons
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable

from agents.teacher.protocol import check_passes, reflection_wants_replan
from agents.teacher.log import MASLog
from models.format import Segment, Trajectory, TrajectoryError, validate_trajectory

ROLE_TAGS = {"thinking": "think", "planning": "plan", "reflection": "reflection", "verification": "double_check"}


class ConversionError(ValueError):
    """A MAS log that cannot become a valid trajectory; the message names the log and why."""


def erred_and_corrected(log: MASLog) -> bool:
    if not log.verified:
        return False
    for ev in log.events:
        if ev.role == "reflection" and reflection_wants_replan(ev.content):
            return True
        if ev.role == "verification" and not check_passes(ev.content):
            return True
    return False


def mas_log_to_trajectory(log: MASLog) -> Trajectory:
    events = log.events
    if not events or events[-1].role != "answer":
        raise ConversionError(f"MAS log {log.log_id!r}: no final answer (verified={log.verified}); the run hit its "
                              "step budget or never answered")
    segments: list[Segment] = []
    last = len(events) - 1
    for i, ev in enumerate(events):
        if ev.tool_call is not None:
            segments.append(Segment(ev.tool_call.tag, ev.tool_call.argument))
            segments.append(Segment("observation", ev.observation or ""))
        elif ev.role == "answer":
            segments.append(Segment("answer" if i == last else "suggested_answer", ev.content))
        elif ev.content.strip():  # an empty thought (a reply with only NEXT:) adds nothing to learn
            segments.append(Segment(ROLE_TAGS[ev.role], ev.content))
    traj = Trajectory(
        id=log.log_id, question=log.question, family=log.family, segments=segments, answer=events[-1].content,
        metadata={
            "teacher": log.teacher, "source_log_id": log.log_id, "problem_id": log.problem_id,
            "sample_idx": log.sample_idx, "mas_prompt_tokens": log.prompt_tokens,
            "mas_completion_tokens": log.completion_tokens,
            "mas_total_tokens": log.prompt_tokens + log.completion_tokens, "tool_calls": log.tool_calls,
            "verified": log.verified, "reflective": any(s.tag == "reflection" for s in segments),
            "erred_and_corrected": erred_and_corrected(log), "parse_failures": sum(log.parse_failures.values()),
        },
    )
    try:
        validate_trajectory(traj)
    except TrajectoryError as exc:
        raise ConversionError(f"MAS log {log.log_id!r}: converted trajectory is invalid: {exc}") from exc
    return traj


def convert_logs(logs: Iterable[MASLog]) -> tuple[list[Trajectory], Counter]:
    """Convert every log; those that cannot be converted are counted by reason instead of raising."""
    out, failures = [], Counter()
    for log in logs:
        try:
            out.append(mas_log_to_trajectory(log))
        except ConversionError as exc:
            failures["no_final_answer" if "no final answer" in str(exc) else "invalid_format"] += 1
    return out, failures


def protocol_counts(logs: Iterable[MASLog]) -> dict:
    """Role-reply parse retries and failures over all logs (converted or not): never silent, in report.json."""
    retries, failures, logs_with_failures = Counter(), Counter(), 0
    for log in logs:
        retries.update(log.parse_retries)
        failures.update(log.parse_failures)
        logs_with_failures += bool(log.parse_failures)
    return {"logs_with_parse_failures": logs_with_failures, "parse_failures": dict(failures),
            "parse_retries": dict(retries)}
