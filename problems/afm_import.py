"""Import AFM-style released SFT trajectories (ShareGPT `conversations` or OpenAI `messages` rows) as Trajectories.

The AFM release writes a trajectory with the CoA tags verbatim (`<think>`, `<plan>`, `<web_search>`, ...,
`<answer>`). Two layouts occur and both are read:
  * one assistant message holding the whole trajectory, observations inline as `<observation>...</observation>`
    (what SFT masks from `<observation` to `observation>\\n\\n`);
  * several assistant turns with the tool outputs as separate messages (ShareGPT `from: observation|function|tool`,
    OpenAI `role: tool`), each becoming an `<observation>` segment.
Inline observations are normalized to the canonical rendering, the text is split with `models.format.parse_segments`
and the result is checked with `validate_trajectory`. A row that does not parse is reported (file:line + reason),
never dropped silently.

Usage:
    report = import_afm_trajectories("AFM-WebAgent-SFT.jsonl", family="afm_web")
    write_jsonl("trajectories.jsonl", report.trajectories); print(len(report.errors), "rows skipped")
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from models.format import (
    OBSERVATION_CLOSE, OBSERVATION_OPEN, Trajectory, TrajectoryError, parse_segments, validate_trajectory,
)
from problems.loaders import RowError, iter_rows

_USER_ROLES = ("human", "user")
_ASSISTANT_ROLES = ("gpt", "assistant")
_TOOL_ROLES = ("observation", "function", "tool", "ipython")
_INLINE_OBSERVATION = re.compile(r"\s*<observation>\s*(.*?)\s*</observation>\s*", re.S)


@dataclass
class ImportReport:
    trajectories: list[Trajectory] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _messages(row: dict) -> list[tuple[str, str]]:
    """(role, text) pairs from a ShareGPT or OpenAI-messages row."""
    if isinstance(row.get("conversations"), list):
        raw, role_key, text_key = row["conversations"], "from", "value"
    elif isinstance(row.get("messages"), list):
        raw, role_key, text_key = row["messages"], "role", "content"
    else:
        raise RowError("no 'conversations' (ShareGPT) or 'messages' (OpenAI) list in the row")
    out = []
    for i, msg in enumerate(raw):
        if not (isinstance(msg, dict) and isinstance(msg.get(role_key), str) and isinstance(msg.get(text_key), str)):
            raise RowError(f"message {i} lacks a string '{role_key}' and '{text_key}'")
        out.append((msg[role_key], msg[text_key]))
    return out


def _canonical_observations(text: str) -> str:
    """Inline `<observation>` blocks with any surrounding whitespace -> the canonical rendering parse_segments reads."""
    return _INLINE_OBSERVATION.sub(lambda m: OBSERVATION_OPEN + m.group(1) + OBSERVATION_CLOSE, text)


def row_to_trajectory(row: dict, row_id: str, family: str) -> Trajectory:
    """One released row as a validated Trajectory; raises RowError saying what does not fit."""
    messages = _messages(row)
    users = [text for role, text in messages if role in _USER_ROLES]
    if not users:
        raise RowError("no user/human message to take the question from")
    known = _USER_ROLES + _ASSISTANT_ROLES + _TOOL_ROLES + ("system",)
    unknown = sorted({role for role, _ in messages if role not in known})
    if unknown:
        raise RowError(f"unknown message role(s) {unknown}")
    # Everything after the first user message is the trajectory: assistant text plus tool outputs as observations.
    first_user = next(i for i, (role, _) in enumerate(messages) if role in _USER_ROLES)
    parts = []
    for role, text in messages[first_user + 1:]:
        if role in _ASSISTANT_ROLES:
            parts.append(_canonical_observations(text))
        elif role in _TOOL_ROLES:
            parts.append(OBSERVATION_OPEN + text.strip() + OBSERVATION_CLOSE)
        elif role in _USER_ROLES:
            raise RowError("a second user message: multi-question dialogues are not CoA trajectories")
    try:
        segments = parse_segments("".join(parts))
    except TrajectoryError as exc:
        raise RowError(f"assistant text does not split into CoA segments: {exc}") from None
    answers = [s.text.strip() for s in segments if s.tag == "answer"]
    system = next((text for role, text in messages if role == "system"), "")
    traj = Trajectory(
        id=str(row.get("id") or row_id), question=users[0].strip(), family=family, segments=segments,
        answer=answers[-1] if answers else "",
        metadata={"source": "afm_release", "data_source": row.get("data_source", ""), "system_prompt": system},
    )
    try:
        validate_trajectory(traj)
    except TrajectoryError as exc:
        raise RowError(str(exc)) from None
    return traj


def import_afm_trajectories(path: str | Path, family: str = "afm_sft", limit: int | None = None) -> ImportReport:
    """Read a JSONL / JSON-array / Parquet file of released trajectories; bad rows go to `errors` as
    `file:line: why`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; pass the released SFT JSONL or Parquet file")
    report = ImportReport()
    for location, row in iter_rows(path, str(path)):
        if limit is not None and len(report.trajectories) >= limit:
            break
        try:
            if isinstance(row, RowError):
                raise row
            if not isinstance(row, dict):
                raise RowError(f"a row must be a JSON object, got {type(row).__name__}")
            row_id = f"{path.stem}-{location.rsplit(':', 1)[-1].strip().replace(' ', '')}"
            report.trajectories.append(row_to_trajectory(row, row_id, family))
        except RowError as exc:
            report.errors.append(f"{location}: {exc}")
    return report
