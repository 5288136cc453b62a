"""Summary rows, the printed table, markdown and plots from hand-built records."""
from __future__ import annotations

import pytest

from evaluation.report import (
    efficiency_rows, format_action_table, format_summary_table, save_plots, summary_markdown, summary_rows, tts_curves,
)
from tests.evaluation.helpers import make_record


def records():
    recs = []
    for s in range(3):
        recs.append(make_record("teacher", "p1", True, s, tokens=1000, tool_calls=4))
        recs.append(make_record("teacher", "p2", True, s, tokens=800, tool_calls=2))
        recs.append(make_record("rl", "p1", s == 0, s, tokens=150, tool_calls=1))
        recs.append(make_record("rl", "p2", False, s, tokens=50, tool_calls=0, status="format_error"))
    return recs


def test_summary_rows_values():
    rows = summary_rows(records(), ks=[1, 3, 4])
    rl = next(r for r in rows if r["model"] == "rl")
    assert rl["problems"] == 2 and rl["samples"] == 3
    assert rl["accuracy"] == pytest.approx(1 / 6, abs=1e-4) and rl["pass@1"] == pytest.approx(1 / 6, abs=1e-4)
    assert rl["pass@3"] == 0.5 and rl["pass@4"] is None      # k above the samples: not estimated
    assert rl["tokens/problem"] == 100.0 and rl["format_error_rate"] == 0.5
    assert rl["failure.wrong_answer"] == pytest.approx(2 / 6, abs=1e-4)


def test_table_markdown_and_efficiency():
    recs = records()
    rows = summary_rows(recs, ks=[1, 3])
    eff = efficiency_rows(recs, teacher="teacher")
    assert eff == [{"model": "rl", "common_solved": 1, "tokens_per_solved": 150.0, "teacher_tokens_per_solved": 1000.0,
                    "token_reduction_pct": -85.0, "tool_calls_per_solved": 1.0,
                    "teacher_tool_calls_per_solved": 4.0, "tool_call_reduction_pct": -75.0}]
    table = format_summary_table(rows, eff)
    header = table.splitlines()[0].split()
    assert header == ["model", "set", "problems", "samples", "accuracy", "pass@3", "tokens/problem",
                      "tool_calls/problem", "format_error_rate"]
    assert "-85.0" in table and "teacher" in table
    md = summary_markdown(rows, eff)
    assert md.count("| rl |") == 2 and "| teacher | multihop |" in md


def test_save_plots_writes_pngs(tmp_path):
    recs = records()
    rows = summary_rows(recs, ks=[1, 3])
    figures = save_plots(rows, efficiency_rows(recs, "teacher"), tts_curves(recs, max_k=3), tmp_path)
    for name in ("accuracy.png", "tts.png", "efficiency.png"):
        assert name in figures and (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_tts_curves_pass_and_majority():
    recs = [make_record("m", "p", False, 0, "Lyon"), make_record("m", "p", True, 1, "Paris"),
            make_record("m", "p", True, 2, "the paris")]
    curves = tts_curves(recs, max_k=5)["m"]           # capped at the 3 samples there are
    assert list(curves["pass@k"]) == [1, 2, 3]
    assert curves["pass@k"][1] == pytest.approx(2 / 3) and curves["pass@k"][2] == 1.0
    assert curves["majority@k"] == {1: 0.0, 2: 0.0, 3: 1.0}   # k=2: Lyon vs Paris tie -> first seen (Lyon)


def test_action_table_rows_follow_the_eval_order():
    rates = {"react": {"acted_when_needed": 1.0, "abstained_when_not": 0.26, "needs_tool_episodes": 300.0,
                       "facts_given_episodes": 72.0},
             "sft12": {"acted_when_needed": 1.0, "abstained_when_not": 0.875, "needs_tool_episodes": 300.0,
                       "facts_given_episodes": 72.0, "acted_before_first_answer": 1.0}}
    lines = format_action_table(rates, ["untrained", "sft12"]).splitlines()
    assert lines[0].split() == ["model", "acted_when_needed", "abstained_when_not", "needs_tool_episodes",
                                "facts_given_episodes"]
    assert [line.split()[0] for line in lines[2:]] == ["sft12", "react"]
    assert lines[2].split()[1:3] == ["1.000", "0.875"]
