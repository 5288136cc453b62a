"""When-to-act metrics (evaluation/when_to_act.py): pair preference of a policy (the pairwise loss's P̄ margin,
packed as in training, equal to one unpacked forward per branch), and acted-when-needed / abstained-when-not
rates from evaluation records.

    .venv/bin/python -m pytest tests/autocoa/test_when_to_act.py -q
"""
from __future__ import annotations

import pytest
import torch

from distill.autocoa_pairs import cot_trajectory, facts_given_pair, facts_given_problem, pair_examples, trajectory_pairs
from evaluation.records import EvalRecord
from evaluation.when_to_act import action_rates, pair_margins, when_to_act_accuracy
from models.format import TOOL_TAGS, Segment, parse_segments, render_segments
from models.policy import save_policy
from training.pairwise_loss import collate_pairs, pairwise_loss
from training.sft_data import IGNORE_INDEX


@pytest.fixture(scope="module")
def short_pairs(teacher_runs):
    """The three shortest pairs of each case (a packed batch stays a few hundred tokens)."""
    pairs = [p for problem, traj in teacher_runs for p in trajectory_pairs(traj, problem) + [facts_given_pair(traj, problem)]
             if p is not None]
    pairs.sort(key=lambda p: len(p.question + p.prefix + p.chosen + p.rejected))
    return [p for p in pairs if p.case == "info_missing"][:3] + [p for p in pairs if p.case == "info_present"][:3]


def _mean_logp_unpacked(model, example) -> float:
    ids = torch.tensor([example.input_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    labels = torch.tensor(example.labels[1:])
    keep = labels != IGNORE_INDEX
    return logp[keep].gather(-1, labels[keep][:, None]).mean().item()


def test_margins_equal_one_unpacked_forward_per_branch(tiny_model, tokenizer, short_pairs):
    margins = pair_margins(tiny_model, tokenizer, short_pairs, batch_size=4)  # two batches: 4 + 2 pairs
    with torch.no_grad():
        for pair, margin in zip(short_pairs, margins):
            chosen, rejected = pair_examples(tokenizer, pair)
            assert margin == pytest.approx(_mean_logp_unpacked(tiny_model, chosen) - _mean_logp_unpacked(tiny_model, rejected),
                                           abs=1e-4)


def test_accuracy_rises_to_one_after_pairwise_steps(tiny_model, tokenizer, short_pairs, tmp_path):
    before = when_to_act_accuracy(save_policy(tiny_model, tokenizer, tmp_path / "before"), short_pairs)
    torch.manual_seed(0)
    batch = collate_pairs([pair_examples(tokenizer, p) for p in short_pairs])
    opt = torch.optim.Adam(tiny_model.parameters(), lr=1e-2)
    for _ in range(5):
        opt.zero_grad()
        pairwise_loss(tiny_model.train(), batch, alpha=0.2).loss.backward()
        opt.step()
    after = when_to_act_accuracy(save_policy(tiny_model, tokenizer, tmp_path / "after"), short_pairs)
    assert after["n"] == 6 and after["info_missing"]["n"] == after["info_present"]["n"] == 3
    assert after["accuracy"] == after["info_missing"]["accuracy"] == after["info_present"]["accuracy"] == 1.0
    assert after["margin_mean"] > before["margin_mean"] and before["accuracy"] < 1.0
    with pytest.raises(ValueError, match="no pairs"):
        when_to_act_accuracy(tmp_path / "after", [])


def _record(problem, segments, tool_calls: int) -> EvalRecord:
    answer = next((s.text for s in reversed(segments) if s.tag in ("answer", "suggested_answer")), "")
    return EvalRecord(model="m", problem_set="s", problem_id=problem.id, question=problem.question,
                      golden=problem.answers, prediction=answer, judge={"correct": True, "rationale": ""}, em=1.0,
                      f1=1.0, steps=1, tokens=1, tool_calls=tool_calls, status="answered", failure="correct", sample=0,
                      transcript=render_segments(segments))


def test_action_rates_on_teacher_cot_and_mistaken_branches(teacher_runs):
    """Records of the teacher's CoA runs (acting), CoT answers on facts-given problems (abstaining), each case's
    rejected branch (a hallucinated answer; an unnecessary call), and a guess-then-search episode: the rates count
    exactly the right ones."""
    records, problems = [], []
    for problem, traj in teacher_runs:
        given = facts_given_problem(problem)
        problems += [problem, given]
        records.append(_record(problem, traj.segments, traj.tool_calls))
        cot = cot_trajectory(given)
        records.append(_record(given, cot.segments, 0))
        pair = facts_given_pair(traj, problem)
        unnecessary = parse_segments(pair.rejected)
        records.append(_record(given, unnecessary, sum(s.tag in TOOL_TAGS for s in unnecessary)))
        act = trajectory_pairs(traj, problem)[0]
        hallucinated = parse_segments(act.rejected)
        records.append(_record(problem, hallucinated, 0))
        # guessed first, then the check failed and it searched: acted, but not before its first answer
        guessed = hallucinated + [Segment("double_check", "score: 2.")] + parse_segments(act.chosen)
        records.append(_record(problem, guessed, 1))
    rates = action_rates(records, problems)
    n = len(teacher_runs)
    assert rates["needs_tool_episodes"] == 3 * n and rates["facts_given_episodes"] == 2 * n
    assert rates["acted_when_needed"] == pytest.approx(2 / 3) and rates["abstained_when_not"] == 0.5
    teacher_guessed_first = sum(next(s.tag for s in traj.segments if s.tag in TOOL_TAGS + ("suggested_answer",))
                                == "suggested_answer" for _, traj in teacher_runs)
    assert rates["acted_before_first_answer"] == pytest.approx((n - teacher_guessed_first) / (3 * n))
    assert action_rates([], problems)["acted_when_needed"] is None
    with pytest.raises(ValueError, match="problem not given"):
        action_rates(records, problems[:1])
