"""CoT+A pair construction from teacher trajectories and world problems: shared prefix, branches that differ at
the trigger, chosen/rejected right for the info-missing and info-present cases; facts-given CoT data.

    .venv/bin/python -m pytest tests/autocoa/test_pairs.py -q
"""
from __future__ import annotations

import pytest

from distill.autocoa_pairs import (
    PairFormatError, cot_trajectory, facts_given_pair, facts_given_problem, pair_examples, read_pairs,
    trajectory_pairs, write_pairs,
)
from models.format import TOOL_TAGS, parse_segments, render_segments
from training.sft_data import IGNORE_INDEX


def _acts(text: str) -> bool:
    return any(s.tag in TOOL_TAGS for s in parse_segments(text))


def _all_pairs(teacher_runs):
    pairs = []
    for problem, traj in teacher_runs:
        pairs += trajectory_pairs(traj, problem)
        given = facts_given_pair(traj, problem)
        pairs += [given] if given else []
    return pairs


def test_pairs_share_the_prefix_and_differ_at_the_trigger(teacher_runs):
    by_id = {traj.id: (problem, traj) for problem, traj in teacher_runs}
    pairs = _all_pairs(teacher_runs)
    assert {p.case for p in pairs} == {"info_missing", "info_present"}
    for pair in pairs:
        problem, traj = by_id[pair.metadata["trajectory_id"]]
        chosen, rejected = parse_segments(pair.chosen), parse_segments(pair.rejected)
        assert chosen[0] != rejected[0]  # they part at the first continuation segment (the decision think)
        if pair.metadata["problem_id"] == problem.id:  # a trajectory pair: the prefix is the teacher's own text
            trigger = pair.metadata["trigger"]
            assert pair.prefix == render_segments(traj.segments[:trigger])
            assert parse_segments(pair.prefix + pair.chosen)[:trigger] == traj.segments[:trigger]


def test_chosen_acts_exactly_when_information_is_missing(teacher_runs):
    pairs = _all_pairs(teacher_runs)
    for pair in pairs:
        acts_chosen, acts_rejected = _acts(pair.chosen), _acts(pair.rejected)
        assert acts_chosen != acts_rejected
        assert acts_chosen == (pair.case == "info_missing")
    problems = {p.id: p for p, _ in teacher_runs}
    for pair in (p for p in pairs if p.case == "info_missing"):
        problem = problems[pair.metadata["problem_id"]]
        call = next(s for s in parse_segments(pair.chosen) if s.tag in TOOL_TAGS)
        # the chosen call is a step of the solution; the rejected branch answers a distractor (hallucination)
        assert (call.tag, call.text) in {(s["tool"], s["argument"]) for s in problem.metadata["solution"]["steps"]}
        assert parse_segments(pair.rejected)[-1].text in problem.metadata["solution"]["distractors"]
    for pair in (p for p in pairs if p.case == "info_present" and p.prefix):
        # the answer decision comes after the last observation of the trajectory: the fact is in the context
        assert "<observation>" in pair.prefix and parse_segments(pair.chosen)[-1].tag == "suggested_answer"


def test_wrong_teacher_calls_are_never_chosen(teacher_runs):
    wrong = 0
    for problem, traj in teacher_runs:
        steps = {(s["tool"], s["argument"]) for s in problem.metadata["solution"]["steps"]}
        calls = [(s.tag, s.text) for s in traj.segments if s.tag in TOOL_TAGS]
        wrong += sum(c not in steps for c in calls)
        chosen_calls = [(s.tag, s.text) for p in trajectory_pairs(traj, problem) for s in parse_segments(p.chosen)
                        if s.tag in TOOL_TAGS]
        assert set(chosen_calls) <= steps
    assert wrong > 0  # the oracle's mistakes really produced wrong calls for the filter to leave out


def test_facts_given_variant_needs_no_tool(teacher_runs):
    for problem, _ in teacher_runs:
        given = facts_given_problem(problem)
        assert given.question.endswith(problem.question) and given.answers == problem.answers
        traj = cot_trajectory(given)  # validates
        assert traj.tool_calls == 0 and traj.answer == problem.answers[0]
        decisive = traj.segments[0].text.split(" So the answer")[0]
        assert all(sentence.strip(". ") in given.question for sentence in decisive.split(". "))
    with pytest.raises(ValueError, match="not facts-given"):
        cot_trajectory(teacher_runs[0][0])


def test_pair_examples_label_only_the_continuations_and_round_trip(teacher_runs, tokenizer, tmp_path):
    pairs = _all_pairs(teacher_runs)
    path = tmp_path / "pairs.jsonl"
    assert write_pairs(path, pairs) == len(pairs)
    assert list(read_pairs(path)) == pairs
    pair = next(p for p in pairs if p.case == "info_missing" and p.prefix)
    for example, text in zip(pair_examples(tokenizer, pair), (pair.chosen, pair.rejected)):
        labelled = [t for t in example.labels if t != IGNORE_INDEX]
        assert tokenizer.decode(labelled) == text
    path.write_text(path.read_text() + '{"id": "x"}\n')
    with pytest.raises(PairFormatError, match=rf"{path}:{len(pairs) + 1}: "):
        list(read_pairs(path))


def test_world_pairs_train_with_the_pairwise_loss(teacher_runs, tokenizer, tiny_model):
    """The pieces compose: world pairs -> pair_examples -> collate_pairs -> pairwise_loss; a few Adam steps make
    the model prefer the chosen branch on these pairs (both cases in the batch)."""
    import torch

    from training.pairwise_loss import collate_pairs, pairwise_loss

    torch.manual_seed(0)
    # the shortest pairs of each case: the packed row stays a few hundred tokens (seconds on CPU)
    pairs = sorted(_all_pairs(teacher_runs), key=lambda p: len(p.question + p.prefix))
    batch_pairs = [p for p in pairs if p.case == "info_missing"][:3] + [p for p in pairs if p.case == "info_present"][:3]
    batch = collate_pairs([pair_examples(tokenizer, p) for p in batch_pairs])
    opt = torch.optim.Adam(tiny_model.parameters(), lr=1e-2)
    first = pairwise_loss(tiny_model.train(), batch, alpha=0.2)
    for _ in range(5):
        opt.zero_grad()
        pairwise_loss(tiny_model, batch, alpha=0.2).loss.backward()
        opt.step()
    with torch.no_grad():
        last = pairwise_loss(tiny_model, batch, alpha=0.2)
    margin = lambda r: (r.chosen_logp - r.rejected_logp).mean().item()  # noqa: E731
    assert last.loss < first.loss and margin(last) > margin(first)
    assert (last.chosen_logp > last.rejected_logp).all()


def test_a_computation_has_no_facts_given_variant(computation_runs):
    for problem, traj in computation_runs:
        with pytest.raises(ValueError, match="no looked-up facts to give"):
            facts_given_problem(problem)
        assert facts_given_pair(traj, problem) is None and trajectory_pairs(traj, problem) == []
