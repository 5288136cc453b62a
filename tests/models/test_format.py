"""CoA format: JSONL and render/parse round trips, and the validator's errors on malformed trajectories."""
from __future__ import annotations

import copy

import pytest

from models.format import (
    Segment,
    Trajectory,
    TrajectoryError,
    parse_segments,
    read_jsonl,
    render_segments,
    validate_trajectory,
    write_jsonl,
)
from tests.models.conftest import sample_trajectory


def test_jsonl_round_trip(tmp_path):
    trajs = [sample_trajectory(i) for i in range(3)]
    trajs[1].metadata = {"teacher": "scripted", "tool_calls": 2, "unicode": "Ünïcödé"}
    path = tmp_path / "t.jsonl"
    assert write_jsonl(path, trajs) == 3
    assert list(read_jsonl(path)) == trajs
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]  # no temp file left behind


def test_read_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, [sample_trajectory(0)])
    with open(path, "a") as f:
        f.write('{"id": "x", "question": "q"}\n')
    with pytest.raises(TrajectoryError, match=r"bad\.jsonl:2: not a trajectory record"):
        list(read_jsonl(path))


def test_render_parse_round_trip():
    traj = sample_trajectory(0)
    traj.segments[3] = Segment("observation", "multi\nline\n\nresult with <think> inside\n")
    text = render_segments(traj.segments)
    assert "\n<observation>\nmulti" in text and text.endswith("<answer>Alice Smith</answer>")
    assert parse_segments(text) == traj.segments
    validate_trajectory(traj)


def test_parse_rejects_text_outside_segments():
    with pytest.raises(TrajectoryError, match="text outside any segment"):
        parse_segments("<think>a</think>stray<answer>b</answer>")
    with pytest.raises(TrajectoryError, match="text outside any segment"):
        parse_segments("<think>a</think><answer>unclosed")


def _broken(edit) -> Trajectory:
    traj = copy.deepcopy(sample_trajectory(0))
    edit(traj)
    return traj


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.segments.insert(0, Segment("musing", "x")), r"segment 0: unknown tag <musing>"),
    (lambda t: t.segments.pop(3), r"segment 3: <reflection> may not follow <web_search>"),
    (lambda t: t.segments.insert(1, Segment("observation", "x")), r"segment 1: <observation> without a tool call"),
    (lambda t: t.segments.pop(), r"must end with <answer> \(last segment is <double_check>\)"),
    (lambda t: t.segments.insert(8, Segment("think", "hm")), r"segment 8: <think> may not follow <suggested_answer>"),
    (lambda t: setattr(t.segments[0], "text", "a <plan>b</plan>"), r"segment 0 <think>: nested tag <plan>"),
    (lambda t: t.segments.__delitem__(slice(3, None)), r"segment 2: tool call <web_search> has no observation"),
    (lambda t: setattr(t, "answer", "Bob"), r"final <answer> 'Alice Smith' != answer field 'Bob'"),
    (lambda t: setattr(t.segments[-1], "text", " "), r"segment 9: empty <answer>"),
    (lambda t: t.segments.insert(0, Segment("answer", "Alice Smith")), r"segment 0: more than one <answer>"),
    (lambda t: t.segments.clear(), r"no segments"),
])
def test_validator_reports_what_and_where(edit, message):
    with pytest.raises(TrajectoryError, match=r"trajectory 't0': " + message):
        validate_trajectory(_broken(edit))


def test_write_jsonl_is_atomic_on_failure(tmp_path):
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [sample_trajectory(0)])

    def crashing():
        yield sample_trajectory(1)
        raise RuntimeError("writer crashed")

    with pytest.raises(RuntimeError, match="writer crashed"):
        write_jsonl(path, crashing())
    assert [t.id for t in read_jsonl(path)] == ["t0"]  # the old complete file survives
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]
