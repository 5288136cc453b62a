"""The Chain-of-Agents trajectory format: tags, records, JSONL (de)serialization, validation and rendering.

A trajectory is one question plus an ordered list of role-tagged segments, exactly as the AFM release writes
them (tags verbatim). Rendered, the whole trajectory is ONE assistant sequence:

    <think>...</think><plan>...</plan><web_search>query</web_search>
    <observation>
    ...tool output...
    </observation>

    <reflection>...</reflection>...<answer>...</answer>

Usage:
    traj = Trajectory(id="t1", question="...", family="multihop", segments=[Segment("think", "...")], answer="x")
    validate_trajectory(traj)            # raises TrajectoryError naming what and where
    text = render_segments(traj.segments)
    write_jsonl(path, [traj]); list(read_jsonl(path))
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

# Tags verbatim from the AFM release; `wiki_search` is the MHQA variant; `visual_inspector` is reserved.
TAGS = (
    "think", "plan", "web_search", "crawl_page", "wiki_search", "code", "observation",
    "reflection", "double_check", "suggested_answer", "answer", "visual_inspector",
)
TOOL_TAGS = ("web_search", "crawl_page", "wiki_search", "code", "visual_inspector")
# Roles the model itself plays (everything but the environment's observation).
MODEL_TAGS = tuple(t for t in TAGS if t != "observation")
# Generation stops when the model closes a tool call (the tool runs, an observation is appended) or answers.
STOP_STRINGS = tuple(f"</{t}>" for t in TOOL_TAGS) + ("</answer>",)

OBSERVATION_OPEN = "\n<observation>\n"
OBSERVATION_CLOSE = "\n</observation>\n\n"

# After `X`, only these may follow (AFM prompt rules); tags absent from the table may be followed by anything.
ALLOWED_NEXT: dict[str, tuple[str, ...]] = {
    "suggested_answer": ("double_check",),
    "plan": TOOL_TAGS + ("suggested_answer", "think"),
    **{t: ("observation",) for t in TOOL_TAGS},
}


class TrajectoryError(ValueError):
    """A trajectory that breaks the format; the message says what is wrong and at which segment."""


@dataclass
class Segment:
    tag: str
    text: str


@dataclass
class Trajectory:
    """One Chain-of-Agents trajectory (a training example or a rollout)."""

    id: str
    question: str
    family: str  # problem family: "multihop", "computation", "humaneval", "hotpotqa", ...
    segments: list[Segment]
    answer: str  # the final answer the trajectory gives (text inside <answer>)
    metadata: dict[str, Any] = field(default_factory=dict)  # teacher, source_log_id, token/tool-call counts, ...

    @property
    def tool_calls(self) -> int:
        return sum(1 for s in self.segments if s.tag in TOOL_TAGS)

    @property
    def interactions(self) -> int:
        """Segments the model produced (role turns + tool calls); the paper's complexity filter counts these."""
        return sum(1 for s in self.segments if s.tag != "observation")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trajectory":
        segments = [Segment(tag=s["tag"], text=s["text"]) for s in data["segments"]]
        return cls(
            id=str(data["id"]), question=data["question"], family=data["family"], segments=segments,
            answer=data["answer"], metadata=dict(data.get("metadata") or {}),
        )


def validate_trajectory(traj: Trajectory) -> None:
    """Raise TrajectoryError if tags are unknown, a tool call lacks exactly one observation right after it,
    an observation appears without a tool call, a transition rule is broken, tags leak into segment text
    (nesting), or the trajectory does not end with a non-empty answer matching `traj.answer`."""
    segs = traj.segments
    where = f"trajectory {traj.id!r}"
    if not segs:
        raise TrajectoryError(f"{where}: no segments")
    tag_re = re.compile(r"</?(" + "|".join(TAGS) + r")>")
    for i, seg in enumerate(segs):
        if seg.tag not in TAGS:
            raise TrajectoryError(f"{where}: segment {i}: unknown tag <{seg.tag}>")
        if seg.tag != "observation" and tag_re.search(seg.text):
            raise TrajectoryError(f"{where}: segment {i} <{seg.tag}>: nested tag {tag_re.search(seg.text).group(0)}")
        if seg.tag == "observation" and (i == 0 or segs[i - 1].tag not in TOOL_TAGS):
            raise TrajectoryError(f"{where}: segment {i}: <observation> without a tool call before it")
        if i + 1 < len(segs) and seg.tag in ALLOWED_NEXT and segs[i + 1].tag not in ALLOWED_NEXT[seg.tag]:
            raise TrajectoryError(
                f"{where}: segment {i + 1}: <{segs[i + 1].tag}> may not follow <{seg.tag}> "
                f"(allowed: {', '.join(ALLOWED_NEXT[seg.tag])})"
            )
        if seg.tag in TOOL_TAGS and i + 1 == len(segs):
            raise TrajectoryError(f"{where}: segment {i}: tool call <{seg.tag}> has no observation")
    answers = [i for i, s in enumerate(segs) if s.tag == "answer"]
    if not answers or answers[-1] != len(segs) - 1:
        raise TrajectoryError(f"{where}: must end with <answer> (last segment is <{segs[-1].tag}>)")
    if len(answers) > 1:
        raise TrajectoryError(f"{where}: segment {answers[0]}: more than one <answer>")
    if not segs[-1].text.strip():
        raise TrajectoryError(f"{where}: segment {len(segs) - 1}: empty <answer>")
    if segs[-1].text.strip() != traj.answer.strip():
        raise TrajectoryError(f"{where}: final <answer> {segs[-1].text.strip()!r} != answer field {traj.answer!r}")


def render_segment(seg: Segment) -> str:
    """One segment as text. Observations use AFM's RL rendering; model segments are `<tag>text</tag>`."""
    if seg.tag == "observation":
        return f"{OBSERVATION_OPEN}{seg.text}{OBSERVATION_CLOSE}"
    return f"<{seg.tag}>{seg.text}</{seg.tag}>"


def render_segments(segments: Iterable[Segment]) -> str:
    """The whole trajectory as ONE assistant message."""
    return "".join(render_segment(s) for s in segments)


_SEGMENT_RE = re.compile(
    r"<(" + "|".join(MODEL_TAGS) + r")>(.*?)</\1>|" + re.escape(OBSERVATION_OPEN) + r"(.*?)" + re.escape(OBSERVATION_CLOSE),
    re.S,
)


def parse_segments(text: str) -> list[Segment]:
    """Inverse of `render_segments` for well-formed text; text between segments is ignored.
    Raises TrajectoryError if non-whitespace text is left outside every segment (an unclosed tag, say)."""
    segments: list[Segment] = []
    pos = 0
    for m in _SEGMENT_RE.finditer(text):
        if text[pos:m.start()].strip():
            raise TrajectoryError(f"text outside any segment at char {pos}: {text[pos:m.start()][:60]!r}")
        if m.group(1):
            segments.append(Segment(m.group(1), m.group(2)))
        else:
            segments.append(Segment("observation", m.group(3)))
        pos = m.end()
    if text[pos:].strip():
        raise TrajectoryError(f"text outside any segment at char {pos}: {text[pos:][:60]!r}")
    return segments


def write_jsonl(path: str | Path, trajectories: Iterable[Trajectory]) -> int:
    """Write trajectories one JSON object per line; returns the count. Atomic: a temp file in the same
    directory is renamed over `path` at the end, so a crash never leaves a truncated file under its name."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    n = 0
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for traj in trajectories:
                f.write(json.dumps(traj.to_dict(), ensure_ascii=False) + "\n")
                n += 1
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return n


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    """Read trajectories; a malformed line raises TrajectoryError naming file and line."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Trajectory.from_dict(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise TrajectoryError(f"{path}:{lineno}: not a trajectory record: {exc}") from exc
