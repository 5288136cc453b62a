"""MAS log -> CoA trajectory: tag mapping, order, metadata, validity, render/parse round trip."""
from __future__ import annotations

import pytest

from agents.teacher.log import MASEvent, MASLog, ToolCall
from agents.teacher.mas import TeacherConfig, run_mas
from agents.teacher.oracle import OracleKnowledge, ScriptedOracleBackend
from distill.conversion import ConversionError, convert_logs, mas_log_to_trajectory
from models.format import Trajectory, parse_segments, render_segments, validate_trajectory


def _log(events, verified=True):
    return MASLog("l1", "p1", "Who?", "multihop", events, "Kell Brin", verified, "test")


def test_hand_built_log_maps_every_event_in_order():
    events = [
        MASEvent(0, "thinking", "thinking", "Start from Zarno.", prompt_tokens=10, completion_tokens=3),
        MASEvent(1, "planning", "planning", "1. search Zarno. 2. answer.", prompt_tokens=20, completion_tokens=5),
        MASEvent(2, "thinking", "thinking", 'Search "Zarno".', prompt_tokens=30, completion_tokens=4),
        MASEvent(3, "search", "search", "Zarno", ToolCall("web_search", "Zarno"), "Zarno was directed by Kell Brin.", 9, 2),
        MASEvent(4, "reflection", "reflection", "information conflict: poor; tool effectiveness: good.",
                 prompt_tokens=40, completion_tokens=6),
        MASEvent(5, "planning", "planning", "Re-plan: 1. answer.", prompt_tokens=20, completion_tokens=5),
        MASEvent(6, "thinking", "thinking", "Answer Kell Brin.", prompt_tokens=50, completion_tokens=3),
        MASEvent(7, "thinking", "answer", "Kell Brin"),
        MASEvent(8, "verification", "verification", "score: 4. fine.", prompt_tokens=60, completion_tokens=4),
        MASEvent(9, "answer", "answer", "Kell Brin"),
    ]
    traj = mas_log_to_trajectory(_log(events))
    assert [s.tag for s in traj.segments] == ["think", "plan", "think", "web_search", "observation", "reflection",
                                               "plan", "think", "suggested_answer", "double_check", "answer"]
    assert traj.segments[4].text == "Zarno was directed by Kell Brin."
    m = traj.metadata
    assert (m["tool_calls"], m["mas_prompt_tokens"], m["mas_completion_tokens"]) == (1, 239, 32)
    assert m["erred_and_corrected"] and m["reflective"] and m["verified"] and m["source_log_id"] == "l1"


def test_log_without_final_answer_is_rejected():
    events = [MASEvent(0, "thinking", "thinking", "hm", prompt_tokens=1, completion_tokens=1)]
    with pytest.raises(ConversionError, match="no final answer"):
        mas_log_to_trajectory(_log(events, verified=False))
    trajs, failures = convert_logs([_log(events, verified=False)])
    assert trajs == [] and failures["no_final_answer"] == 1


def test_real_logs_convert_and_round_trip(world_setup, toolbox):
    knowledge = OracleKnowledge(world_setup.problems)
    for i, p in enumerate(world_setup.problems):
        log = run_mas(p, ScriptedOracleBackend(knowledge, 0.6, 0.5, seed=i), toolbox, TeacherConfig())
        traj = mas_log_to_trajectory(log)
        validate_trajectory(traj)
        assert traj.tool_calls == log.tool_calls
        assert [s for s in traj.segments if s.tag == "observation"] and all(
            s.text == e.observation for s, e in zip([s for s in traj.segments if s.tag == "observation"],
                                                    [e for e in log.events if e.tool_call]))
        assert parse_segments(render_segments(traj.segments)) == traj.segments
        assert Trajectory.from_dict(traj.to_dict()) == traj
