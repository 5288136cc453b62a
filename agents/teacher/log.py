"""The MAS log: every agent message, tool call, observation and token count of one teacher run.

One `MASLog` per (problem, sample) rollout, stored one JSON object per line. `distill.conversion` turns a log
into a single Chain-of-Agents trajectory; the token counts feed the efficiency comparison in evaluation
(tokens per solved problem, MAS vs trained model).

Schema (JSONL):
    {log_id, problem_id, question, family, events: [{step, agent, role, content, tool_call: {tag, argument} | null,
     observation: str | null, prompt_tokens, completion_tokens}], final_answer, verified, teacher, sample_idx,
     parse_retries: {role: n}, parse_failures: {role: n}}
`parse_retries` counts re-asks after a role reply that did not parse (agents.teacher.protocol); `parse_failures`
counts replies still unparseable after the role's retry budget. Logs written before these fields read as {}.

`role` is one of ROLES. Answer events: every `answer` event but the last is a *suggested* answer (always followed
by a verification event); the last one is the final answer.

Usage:
    write_mas_logs(path, logs); logs = list(read_mas_logs(path))
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

ROLES = ("thinking", "planning", "reflection", "verification", "search", "crawl", "code", "answer")
TOOL_ROLES = ("search", "crawl", "code")


class MASLogError(ValueError):
    """A malformed MAS log row; the message names file and line (or the field)."""


@dataclass
class ToolCall:
    tag: str  # the CoA tool tag: web_search, crawl_page, wiki_search, code
    argument: str


@dataclass
class MASEvent:
    step: int
    agent: str
    role: str
    content: str
    tool_call: ToolCall | None = None
    observation: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise MASLogError(f"event step {self.step}: role {self.role!r} is not one of {ROLES}")
        if (self.tool_call is None) != (self.observation is None):
            raise MASLogError(f"event step {self.step}: a tool call and its observation come together")


@dataclass
class MASLog:
    log_id: str
    problem_id: str
    question: str
    family: str
    events: list[MASEvent]
    final_answer: str
    verified: bool
    teacher: str  # backend description, e.g. "oracle(mistake_rate=0.3)" or "openai:qwen-72b"
    sample_idx: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    parse_retries: dict[str, int] = field(default_factory=dict)
    parse_failures: dict[str, int] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return sum(e.prompt_tokens for e in self.events)

    @property
    def completion_tokens(self) -> int:
        return sum(e.completion_tokens for e in self.events)

    @property
    def tool_calls(self) -> int:
        return sum(1 for e in self.events if e.tool_call is not None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MASLog":
        events = []
        for ev in data["events"]:
            call = ev.get("tool_call")
            events.append(MASEvent(
                step=int(ev["step"]), agent=ev["agent"], role=ev["role"], content=ev["content"],
                tool_call=ToolCall(call["tag"], call["argument"]) if call else None,
                observation=ev.get("observation"), prompt_tokens=int(ev.get("prompt_tokens", 0)),
                completion_tokens=int(ev.get("completion_tokens", 0)),
            ))
        return cls(
            log_id=str(data["log_id"]), problem_id=str(data["problem_id"]), question=data["question"],
            family=data["family"], events=events, final_answer=data["final_answer"], verified=bool(data["verified"]),
            teacher=data["teacher"], sample_idx=int(data.get("sample_idx", 0)), metadata=dict(data.get("metadata") or {}),
            parse_retries={str(k): int(v) for k, v in (data.get("parse_retries") or {}).items()},
            parse_failures={str(k): int(v) for k, v in (data.get("parse_failures") or {}).items()},
        )


def write_mas_logs(path: str | Path, logs: Iterable[MASLog]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for log in logs:
            f.write(json.dumps(log.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    return n


def read_mas_logs(path: str | Path) -> Iterator[MASLog]:
    """Read MAS logs; a malformed line raises MASLogError naming file and line."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield MASLog.from_dict(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, MASLogError) as exc:
                raise MASLogError(f"{path}:{lineno}: not a MAS log record: {exc}") from exc
