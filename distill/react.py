"""The ReAct baseline of issue #23: a teacher's CoA trajectory reduced to think / act / observe, then answer.

Chain-of-Agents trajectories interleave role segments (plan, reflection, suggested_answer + double_check) with the
thinks, tool calls and observations. ReAct (Yao et al.) has only thought -> action -> observation steps and a
final answer, so the baseline trains on the SAME teacher logs with the role segments taken out:
- `plan`, `reflection` and `double_check` are dropped;
- every `suggested_answer` is dropped: the last one is re-stated by `<answer>` anyway, and an earlier one was
  rejected by its double_check, so the think that proposed it goes too (with neither the suggestion nor the
  check, it would be a hallucinated answer followed by an unexplained change of course);
- consecutive thinks (left behind where a reflection or plan stood between them) are joined into one thought,
  as ReAct writes one thought per step;
- thinks, tool calls, observations and the final `<answer>` are kept verbatim.
The result is a valid trajectory (models/format.py's validate), so the SFT trainer reads it unchanged.

Usage:
    react = react_trajectory(traj)       # None if nothing of a ReAct trajectory is left (no answer)
    .venv/bin/python -m pytest tests/autocoa/test_react.py -q
"""
from __future__ import annotations

from models.format import Segment, Trajectory, TrajectoryError, validate_trajectory

REACT_TAGS = ("think", "web_search", "crawl_page", "wiki_search", "code", "visual_inspector", "observation", "answer")


def _rejected_suggestion_thinks(segments: list[Segment]) -> set[int]:
    """Indices of the thinks that proposed a suggested answer other than the last one (answers its check rejected)."""
    suggestions = [i for i, s in enumerate(segments) if s.tag == "suggested_answer"]
    return {i - 1 for i in suggestions[:-1] if i > 0 and segments[i - 1].tag == "think"}


def react_trajectory(traj: Trajectory) -> Trajectory | None:
    """`traj` as a ReAct trajectory (think, tool call, observation, ..., think, answer), or None when the
    reduction leaves no valid trajectory (no final answer, say)."""
    dropped = _rejected_suggestion_thinks(traj.segments)
    segments: list[Segment] = []
    for i, seg in enumerate(traj.segments):
        if seg.tag not in REACT_TAGS or i in dropped:
            continue
        if seg.tag == "think" and segments and segments[-1].tag == "think":
            segments[-1] = Segment("think", f"{segments[-1].text} {seg.text}")
            continue
        segments.append(Segment(seg.tag, seg.text))
    react = Trajectory(id=f"react-{traj.id}", question=traj.question, family=traj.family, segments=segments,
                       answer=traj.answer, metadata={**traj.metadata, "react": True, "source_trajectory_id": traj.id})
    try:
        validate_trajectory(react)
    except TrajectoryError:
        return None
    return react
