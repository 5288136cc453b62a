"""Efficiency accounting: tokens and tool calls per problem solved by both, and the reduction in percent."""
from __future__ import annotations

import pytest

from evaluation.efficiency import compare_efficiency, reduction_pct
from tests.evaluation.helpers import make_record


def test_compare_efficiency_counts_only_commonly_solved_problems():
    model = [
        make_record("rl", "p1", True, 0, tokens=100, tool_calls=2),
        make_record("rl", "p1", True, 1, tokens=300, tool_calls=4),    # p1 cost: mean of correct = 200 / 3
        make_record("rl", "p1", False, 2, tokens=9999, tool_calls=99),  # wrong samples do not count
        make_record("rl", "p2", True, 0, tokens=50, tool_calls=1),      # teacher failed p2: excluded
        make_record("rl", "p3", False, 0, tokens=10, tool_calls=1),
    ]
    teacher = [
        make_record("teacher", "p1", True, 0, tokens=1000, tool_calls=5),
        make_record("teacher", "p2", False, 0, tokens=800, tool_calls=5),
        make_record("teacher", "p3", True, 0, tokens=700, tool_calls=4),  # model failed p3: excluded
    ]
    cmp = compare_efficiency(model, teacher)
    assert cmp.common_solved == 1
    assert cmp.model_tokens_per_solved == 200 and cmp.teacher_tokens_per_solved == 1000
    assert cmp.token_reduction_pct == pytest.approx(-80.0)
    assert cmp.model_tool_calls_per_solved == 3 and cmp.tool_call_reduction_pct == pytest.approx(-40.0)
    assert cmp.to_row()["token_reduction_pct"] == -80.0


def test_reduction_pct_matches_paper_style_claim():
    assert reduction_pct(154, 1000) == pytest.approx(-84.6)
    assert reduction_pct(5, 0) is None


def test_no_commonly_solved_problem_reports_no_reduction():
    cmp = compare_efficiency([make_record("rl", "p1", False, tokens=10)],
                             [make_record("teacher", "p1", True, tokens=99)])
    row = cmp.to_row()
    assert row["common_solved"] == 0 and row["token_reduction_pct"] is None and row["tokens_per_solved"] is None


def test_compare_efficiency_rejects_mixed_models():
    with pytest.raises(ValueError, match="one model"):
        compare_efficiency([make_record("a", "p", True), make_record("b", "p", True)], [])
