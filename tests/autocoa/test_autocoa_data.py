"""AutoCoA's data files cut from a distilled dataset directory (distill/autocoa_data.py): held-out split, pair cap,
CoT mixing, ReAct file, world-model examples, facts-given eval problems, determinism and file:line errors.

    .venv/bin/python -m pytest tests/autocoa/test_autocoa_data.py -q
"""
from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest

from distill.autocoa_data import AutoCoADataConfig, write_autocoa_data
from distill.autocoa_pairs import read_pairs
from distill.react import react_trajectory
from evaluation.world_model import read_observation_examples
from models.format import TrajectoryError, read_jsonl
from problems.records import read_problems
from training.pairwise_loss import build_pair_examples, read_pair_dicts

FILES = ("pairs.jsonl", "pairs_heldout.jsonl", "coa_cot.jsonl", "react.jsonl", "observations_heldout.jsonl",
         "eval_facts_given.jsonl")


@pytest.fixture(scope="module")
def written(dataset_dir, tmp_path_factory):
    cfg = AutoCoADataConfig(heldout_fraction=0.25, max_pairs_per_trajectory=2, cot_per_coa=0.5, seed=0)
    out = tmp_path_factory.mktemp("autocoa")
    return cfg, out, write_autocoa_data(dataset_dir, out, cfg)


def _problem_of_pair(pair, trajectories):
    return trajectories[pair.metadata["trajectory_id"]].metadata["problem_id"]


def test_heldout_problems_are_never_trained_on(written, dataset_dir):
    cfg, out, counts = written
    trajectories = {t.id: t for t in read_jsonl(dataset_dir / "train.jsonl")}
    train_pairs, held_pairs = list(read_pairs(out / "pairs.jsonl")), list(read_pairs(out / "pairs_heldout.jsonl"))
    held = set(json.loads((out / "autocoa_data.json").read_text())["heldout_problem_ids"])
    assert len(held) == counts["heldout_problems"] == round(0.25 * len(trajectories))
    assert {_problem_of_pair(p, trajectories) for p in held_pairs} <= held
    assert held.isdisjoint(_problem_of_pair(p, trajectories) for p in train_pairs)
    for name in ("coa_cot.jsonl", "react.jsonl"):
        trained = {t.metadata["problem_id"] for t in read_jsonl(out / name)}
        assert held.isdisjoint(trained)
        assert not any(pid.removesuffix("-given") in held for pid in trained)  # nor their facts-given variants
    examples = list(read_observation_examples(out / "observations_heldout.jsonl"))
    assert len(examples) == counts["observations_heldout.jsonl"] > 0
    assert {e.metadata["problem_id"] for e in examples} <= held
    assert all(e.fact in e.observation for e in examples)


def test_computation_problems_give_no_pairs_and_no_cot(written, dataset_dir, computation_runs):
    """A computation always needs its code: no facts-given variant, so neither a pair nor CoT data from it; its
    CoA trajectory is still stage-2 data (unless held out)."""
    _, out, _ = written
    computation = {p.id for p, _ in computation_runs}
    held = set(json.loads((out / "autocoa_data.json").read_text())["heldout_problem_ids"])
    for name in ("pairs.jsonl", "pairs_heldout.jsonl"):
        assert not {p.metadata["problem_id"].removesuffix("-given") for p in read_pairs(out / name)} & computation
    mixed = list(read_jsonl(out / "coa_cot.jsonl"))
    assert not any(t.metadata["problem_id"].removesuffix("-given") in computation for t in mixed if t.metadata.get("cot_only"))
    assert {t.metadata["problem_id"] for t in mixed if not t.metadata.get("cot_only")} & computation == computation - held
    assert len(read_problems(out / "eval_facts_given.jsonl")) == len(read_problems(dataset_dir / "eval_heldout.jsonl")) - 1


def test_pairs_are_capped_per_trajectory_and_read_by_the_trainer(written, tokenizer):
    cfg, out, counts = written
    pairs = list(read_pairs(out / "pairs.jsonl"))
    assert len(pairs) == counts["pairs.jsonl"] > 0
    per_traj = Counter(p.metadata["trajectory_id"] for p in pairs)
    assert max(per_traj.values()) == cfg.max_pairs_per_trajectory
    for traj_id in per_traj:  # both cases kept where the trajectory had both
        assert {p.case for p in pairs if p.metadata["trajectory_id"] == traj_id} == {"info_missing", "info_present"}
    held = list(read_pairs(out / "pairs_heldout.jsonl"))
    assert {p.case for p in held} == {"info_missing", "info_present"}
    assert max(Counter(p.metadata["trajectory_id"] for p in held).values()) > cfg.max_pairs_per_trajectory  # uncapped
    examples, report = build_pair_examples(read_pair_dicts(out / "pairs.jsonl"), tokenizer, None, max_len=100_000)
    assert len(examples) == len(pairs) and report.dropped_too_long == 0


def test_coa_cot_mixes_cot_into_the_coa_trajectories_and_react_mirrors_them(written):
    cfg, out, counts = written
    mixed = list(read_jsonl(out / "coa_cot.jsonl"))  # validated trajectories
    cot = [t for t in mixed if t.metadata.get("cot_only")]
    coa = [t for t in mixed if not t.metadata.get("cot_only")]
    assert len(coa) == counts["coa_trajectories"] and len(cot) == counts["cot_trajectories"] == round(0.5 * len(coa))
    assert all(t.tool_calls == 0 and t.question.startswith("Facts: ") for t in cot)
    assert all(t.tool_calls > 0 for t in coa)
    positions = [i for i, t in enumerate(mixed) if t.metadata.get("cot_only")]
    assert positions != list(range(len(coa), len(mixed)))  # shuffled in, not appended
    react = list(read_jsonl(out / "react.jsonl"))
    by_id = {t.id: t for t in coa}
    assert {r.metadata["source_trajectory_id"] for r in react} <= set(by_id)
    assert all(r == react_trajectory(by_id[r.metadata["source_trajectory_id"]]) for r in react)
    assert len(react) + counts["react_dropped"] == len(coa)


def test_eval_facts_given_problems_need_no_tool(written, dataset_dir):
    _, out, counts = written
    given = read_problems(out / "eval_facts_given.jsonl")
    source = {p.id: p for p in read_problems(dataset_dir / "eval_heldout.jsonl") if p.family == "multihop"}
    assert len(given) == counts["eval_facts_given.jsonl"] == len(source)
    for p in given:
        original = source[p.metadata["source_problem_id"]]
        assert p.metadata["facts_given"] and p.answers == original.answers and p.question.endswith(original.question)


def test_deterministic_for_a_seed(written, dataset_dir, tmp_path):
    cfg, out, counts = written
    assert write_autocoa_data(dataset_dir, tmp_path / "again", cfg) == counts
    for name in FILES:
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name
    other = write_autocoa_data(dataset_dir, tmp_path / "other", cfg.model_copy(update={"seed": 1}))
    assert (tmp_path / "other" / "pairs_heldout.jsonl").read_bytes() != (out / "pairs_heldout.jsonl").read_bytes()
    assert json.loads((out / "autocoa_data.json").read_text())["counts"] == counts and other["pairs.jsonl"] > 0


def test_bad_input_names_file_and_line(dataset_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(dataset_dir, bad)
    lines = (bad / "train.jsonl").read_text().splitlines()
    record = json.loads(lines[2])
    record["metadata"]["problem_id"] = "no-such-problem"
    (bad / "train.jsonl").write_text("\n".join(lines[:2] + [json.dumps(record)] + lines[3:]) + "\n")
    with pytest.raises(ValueError, match=rf"train.jsonl:3: trajectory .*'no-such-problem' is not in"):
        write_autocoa_data(bad, tmp_path / "out", AutoCoADataConfig())
    record["segments"] = record["segments"][:-1]  # no final answer: not a valid trajectory
    (bad / "train.jsonl").write_text("\n".join(lines[:2] + [json.dumps(record)] + lines[3:]) + "\n")
    with pytest.raises(TrajectoryError, match=r"train.jsonl:3: not a valid trajectory record: .*must end with <answer>"):
        write_autocoa_data(bad, tmp_path / "out", AutoCoADataConfig())
    (bad / "problems.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="problems.jsonl does not exist"):
        write_autocoa_data(bad, tmp_path / "out", AutoCoADataConfig())
