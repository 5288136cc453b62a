"""The tool interface shared by the teacher MAS, RL rollouts and evaluation.

A tool is anything with a `name` (equal to its CoA tag: web_search, wiki_search, crawl_page, code),
a one-paragraph `description` for system prompts, and `run(argument) -> ToolResult`.
`run` never raises for a tool-level failure: it returns a ToolResult whose `status` says what went wrong,
so the caller can render the observation and keep the rollout going.

    result = tool.run("Kato Rimu birthplace")
    if result.status != "ok": ...
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass
class ToolResult:
    """Observation text plus an explicit status: "ok" or a failure kind such as "error", "timeout",
    "refused", "not_found", "truncated", "memory", "unsupported_type"."""

    text: str
    status: str


class Tool(Protocol):
    name: str
    description: str

    def run(self, argument: str) -> ToolResult: ...


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and the tail of `text` (errors usually sit at the end, context at the start)."""
    if len(text) <= max_chars:
        return text
    marker = f"\n... [{len(text) - max_chars} chars truncated] ...\n"
    keep = max(max_chars - len(marker), 0)
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head):]
