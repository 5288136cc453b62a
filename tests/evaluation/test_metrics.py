"""pass@k against hand-computed values, TTS curves, majority vote, best-of-n and failure categories."""
from __future__ import annotations

import math

import pytest

from evaluation.metrics import (
    accuracy, best_of_n_by_judge, best_of_n_by_majority, failure_breakdown, failure_category, majority_at_k_curve,
    majority_vote, pass_at_k, pass_at_k_curve,
)
from tests.evaluation.helpers import make_record


def lower_strip(text: str) -> str:
    return text.lower().strip(" .")


@pytest.mark.parametrize("n,c,k,expected", [
    (5, 2, 3, 1 - 1 / 10),        # C(3,3)/C(5,3) = 1/10
    (5, 2, 1, 2 / 5),
    (10, 3, 2, 1 - 21 / 45),      # C(7,2)/C(10,2)
    (5, 0, 3, 0.0),
    (5, 5, 1, 1.0),
    (4, 2, 3, 1.0),               # fewer than k wrong samples: every draw of 3 holds a correct one
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_stable_for_large_n_matches_exact_binomials():
    n, c, k = 500, 7, 100
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match="k=4"):
        pass_at_k(3, 1, 4)


def test_pass_at_k_curve_averages_over_problems_and_is_monotone():
    # p1: 1 of 3 correct; p2: 0 of 3; p3: 3 of 3.
    records = [make_record("m", "p1", s == 2, sample=s) for s in range(3)]
    records += [make_record("m", "p2", False, sample=s) for s in range(3)]
    records += [make_record("m", "p3", True, sample=s) for s in range(3)]
    curve = pass_at_k_curve(records, ks=[1, 2, 3])
    assert curve[1] == pytest.approx((1 / 3 + 0 + 1) / 3)
    assert curve[2] == pytest.approx((2 / 3 + 0 + 1) / 3)   # p1: 1 - C(2,2)/C(3,2) = 2/3
    assert curve[3] == pytest.approx((1 + 0 + 1) / 3)
    assert curve[1] <= curve[2] <= curve[3]
    assert accuracy(records) == pytest.approx(curve[1])


def test_majority_vote_normalizes_and_keeps_first_spelling():
    assert majority_vote(["Paris", "lyon", "paris.", "Lyon", "PARIS"], lower_strip) == "Paris"
    assert majority_vote(["b", "a", "a", "b"], lower_strip) == "b"          # tie: first seen form wins
    assert majority_vote(["", " . "], lower_strip) is None                   # empty answers do not vote


def test_best_of_n_selectors():
    samples = [make_record("m", "p", False, 0, "Lyon"), make_record("m", "p", True, 1, "Paris"),
               make_record("m", "p", True, 2, "paris"), make_record("m", "p", False, 3, "Nice")]
    assert best_of_n_by_judge(samples).sample == 1
    assert best_of_n_by_majority(samples, lower_strip).sample == 1
    wrong_majority = [make_record("m", "p", False, 0, "Lyon"), make_record("m", "p", False, 1, "lyon"),
                      make_record("m", "p", True, 2, "Paris")]
    assert best_of_n_by_majority(wrong_majority, lower_strip).correct is False
    assert best_of_n_by_judge(wrong_majority).correct is True


def test_majority_at_k_curve():
    # k=1 takes the first sample (wrong); k=3 the majority of Paris, Paris, Lyon (right).
    recs = [make_record("m", "p", False, 0, "Lyon"), make_record("m", "p", True, 1, "Paris"),
            make_record("m", "p", True, 2, "Paris")]
    assert majority_at_k_curve(recs, [1, 3], lower_strip) == {1: 0.0, 3: 1.0}
    with pytest.raises(ValueError, match="only 3 samples"):
        majority_at_k_curve(recs, [4], lower_strip)


def test_failure_categories():
    assert failure_category("answered", True) == "correct"
    assert failure_category("answered", False) == "wrong_answer"
    assert failure_category("max_turns", False) == "max_turns"
    with pytest.raises(ValueError, match="unknown episode status 'exploded'"):
        failure_category("exploded", False)
    recs = [make_record("m", "a", True), make_record("m", "b", False, status="format_error"),
            make_record("m", "c", False), make_record("m", "d", False, status="format_error")]
    shares = failure_breakdown(recs)
    assert shares["format_error"] == 0.5 and shares["correct"] == 0.25 and shares["wrong_answer"] == 0.25
    assert sum(shares.values()) == pytest.approx(1.0)
