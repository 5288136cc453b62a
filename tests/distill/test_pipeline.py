"""distill_dataset end to end on a tiny config: files, counts, valid trajectories in problem order, RL problems."""
from __future__ import annotations

import json

import pytest

from distill.pipeline import DistillConfig, distill_dataset
from models.format import read_jsonl, validate_trajectory
from problems.records import read_problems

pytestmark = pytest.mark.integration


def test_distill_dataset_tiny(ray_session, tmp_path):
    cfg = DistillConfig(n_worlds=2, multihop_per_world=8, n_computation=4, rl_multihop_per_world=4,
                        rl_computation=2, rollout={"show_progress": False, "batch_size": 1})
    result = distill_dataset(cfg, tmp_path)
    trajs = list(read_jsonl(result.sft_path))
    assert trajs and len(trajs) == result.counts["sft_trajectories"]
    for t in trajs:
        validate_trajectory(t)
        assert t.interactions >= cfg.filters.min_interactions and t.metadata["verified"]
    assert result.counts["problems"] == 20 and result.counts["rollouts_new"] == 20
    assert [r["stage"] for r in result.filter_report] == ["conversion", "complexity", "quality", "reflection",
                                                          "upsampling"]
    assert result.filter_report[0]["in"] == 20 and result.counts["parse_failures_total"] == 0  # the oracle parses
    rl = read_problems(result.rl_problems_path)
    assert rl and all("solution" in p.metadata for p in rl)
    sft_problems = [json.loads(line) for line in (tmp_path / "problems.jsonl").read_text().splitlines()]
    # in problem order, whatever order the actors finished in (batch_size 1: one shard per log, numbered as the
    # two actors finish; unordered, this failed): one config, one byte-identical dataset
    problem_ids = [p["id"] for p in sft_problems]
    positions = [problem_ids.index(t.id.split("#")[0]) for t in trajs]
    assert positions == sorted(positions)
    sft_questions = {p["question"] for p in sft_problems}
    assert not sft_questions & {p.question for p in rl}
    assert sum(1 for _ in open(result.corpus_path)) > 0
