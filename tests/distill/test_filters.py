"""Progressive filters on hand-built trajectories: each stage's rule and the report."""
from __future__ import annotations

from distill.filters import (
    FilterConfig, filter_complexity, filter_quality, filter_reflection, run_filters, upsample_error_correction,
)
from models.format import Segment, Trajectory
from problems.records import Problem


def traj(tid, answer="Kell Brin", pid="p1", family="multihop", reflective=False, erred=False, verified=True,
         extra_thinks=3, observation="Zarno was directed by Kell Brin."):
    segs = [Segment("think", "t")] * extra_thinks + [Segment("web_search", "Zarno"), Segment("observation", observation)]
    if reflective:
        segs.append(Segment("reflection", "information conflict: good"))
    segs += [Segment("suggested_answer", answer), Segment("double_check", "score: 4."), Segment("answer", answer)]
    return Trajectory(tid, "Who?", family, segs, answer, {"problem_id": pid, "verified": verified,
                                                         "reflective": reflective, "erred_and_corrected": erred})


PROBLEMS = {"p1": Problem("p1", "Who?", ["Kell Brin"], "multihop"), "c1": Problem("c1", "2+2?", ["4"], "computation")}


def test_complexity_drops_short_ones():
    short, ok = traj("a", extra_thinks=0), traj("b", extra_thinks=1)  # 4 vs 5 interactions
    r = filter_complexity([short, ok], FilterConfig())
    assert [t.id for t in r.kept] == ["b"] and r.dropped_reasons == {"fewer_than_5_interactions": 1}


def test_complexity_drops_long_ones():
    r = filter_complexity([traj("long", extra_thinks=20), traj("ok")], FilterConfig(max_interactions=20))
    assert [t.id for t in r.kept] == ["ok"] and r.dropped_reasons == {"more_than_20_interactions": 1}


def test_quality_checks_reference_mas_verification_and_code_output():
    items = [traj("ok"), traj("wrong", answer="Zuzu"), traj("unverified", verified=False), traj("nop", pid="zz"),
             traj("code_ok", answer="4", pid="c1", family="computation", observation="[RESULT:SUCCESS]\n4\n"),
             traj("code_unprinted", answer="4", pid="c1", family="computation", observation="[RESULT:SUCCESS]\n5\n")]
    r = filter_quality(items, FilterConfig(), PROBLEMS)
    assert [t.id for t in r.kept] == ["ok", "code_ok"]
    assert r.dropped_reasons == {"wrong_answer": 1, "not_verified_by_mas": 1, "unknown_problem": 1,
                                 "answer_not_printed_by_code": 1}


def test_reflection_keeps_all_reflective_and_a_stable_share_of_the_rest():
    items = [traj(f"r{i}", reflective=True) for i in range(50)] + [traj(f"p{i}") for i in range(400)]
    r = filter_reflection(items, FilterConfig(plain_keep_fraction=0.5))
    kept = {t.id for t in r.kept}
    assert all(f"r{i}" in kept for i in range(50))
    assert 150 < len(kept) - 50 < 250
    assert kept == {t.id for t in filter_reflection(items, FilterConfig(plain_keep_fraction=0.5)).kept}
    assert len(filter_reflection(items, FilterConfig(plain_keep_fraction=0.0)).kept) == 50


def test_upsampling_repeats_corrected_ones():
    r = upsample_error_correction([traj("e", erred=True), traj("x")], FilterConfig(error_correction_repeat=3))
    assert [t.id for t in r.kept] == ["e", "e#up1", "e#up2", "x"]


def test_run_filters_reports_each_stage():
    items = [traj("a", reflective=True, erred=True), traj("b", extra_thinks=0), traj("c", answer="no")]
    items[2].metadata["parse_failures"] = 2  # its teacher log had two role replies that never parsed
    kept, report = run_filters(items, list(PROBLEMS.values()), FilterConfig())
    assert [t.id for t in kept] == ["a", "a#up1"]
    assert [(r["stage"], r["in"], r["out"], r["with_parse_failures"]) for r in report] == [
        ("complexity", 3, 2, 1), ("quality", 2, 1, 1), ("reflection", 1, 1, 0), ("upsampling", 1, 2, 0)]
