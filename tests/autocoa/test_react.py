"""The ReAct baseline data: teacher CoA trajectories reduced to think/act/observe + answer (distill/react.py).

    .venv/bin/python -m pytest tests/autocoa/test_react.py -q
"""
from __future__ import annotations

from models.format import TOOL_TAGS, Segment, Trajectory
from models.tokenizer import encode_trajectory
from distill.react import REACT_TAGS, react_trajectory


def test_react_keeps_actions_observations_and_answer_and_drops_the_roles(teacher_runs, tokenizer):
    role_segments_dropped = rejected_suggestions = 0
    for _, traj in teacher_runs:
        react = react_trajectory(traj)  # validated inside: None would mean an invalid result
        assert react is not None and react.answer == traj.answer and react.segments[-1] == traj.segments[-1]
        assert {s.tag for s in react.segments} <= set(REACT_TAGS)
        # every tool call and observation, in order and verbatim
        acts = lambda t: [s for s in t.segments if s.tag in TOOL_TAGS + ("observation",)]  # noqa: E731
        assert acts(react) == acts(traj)
        tags = [s.tag for s in react.segments]
        assert all(not (a == b == "think") for a, b in zip(tags, tags[1:]))  # one thought per step
        # the thoughts are the teacher's thinks, in order, less those that proposed a rejected answer
        suggestions = [i for i, s in enumerate(traj.segments) if s.tag == "suggested_answer"]
        rejected = {i - 1 for i in suggestions[:-1]}
        rejected_suggestions += len(rejected)
        kept = [s.text for i, s in enumerate(traj.segments) if s.tag == "think" and i not in rejected]
        assert " ".join(s.text for s in react.segments if s.tag == "think") == " ".join(kept)
        role_segments_dropped += sum(s.tag in ("plan", "reflection", "double_check", "suggested_answer")
                                     for s in traj.segments)
        encoded = encode_trajectory(tokenizer, react)  # the SFT encoding accepts it
        assert sum(encoded.loss_mask) < len(encoded.input_ids)
    assert role_segments_dropped > 0 and rejected_suggestions > 0  # the oracle's mistakes made both kinds


def test_a_trajectory_without_an_answer_has_no_react_form():
    traj = Trajectory("t", "q?", "multihop", [Segment("think", "x"), Segment("suggested_answer", "a"),
                                             Segment("double_check", "score: 4.")], "a")
    assert react_trajectory(traj) is None
