"""World-model fidelity (evaluation/world_model.py): examples from teacher trajectories (context up to the call,
real observation, the hop's answer-bearing fact), scoring, and a tiny policy that learned one observation
reproducing it while an untrained one does not.

    .venv/bin/python -m pytest tests/autocoa/test_world_model.py -q
"""
from __future__ import annotations

import pytest
import torch

from evaluation.world_model import (
    fidelity_scores, observation_examples, observation_f1, observation_prompt, read_observation_examples,
    training_calls, world_model_fidelity, write_observation_examples,
)
from models.format import OBSERVATION_OPEN, TOOL_TAGS, parse_segments, render_segments
from models.policy import save_policy
from models.tokenizer import encode_observation
from training.sft_data import IGNORE_INDEX


@pytest.fixture(scope="module")
def examples(teacher_runs):
    seen = training_calls(traj for _, traj in teacher_runs[:4])
    return observation_examples([(traj, problem) for problem, traj in teacher_runs[4:]], seen)


def test_examples_are_the_solution_calls_with_their_real_observation(examples, teacher_runs):
    trajectories = {traj.id: traj for _, traj in teacher_runs}
    problems = {problem.id: problem for problem, _ in teacher_runs}
    assert examples and any(e.seen_call for e in examples) and not all(e.seen_call for e in examples)
    seen = training_calls(traj for _, traj in teacher_runs[:4])
    for ex in examples:
        traj = trajectories[ex.metadata["trajectory_id"]]
        i = ex.metadata["segment"]
        assert ex.context == render_segments(traj.segments[:i]) and parse_segments(ex.context)[-1].tag == ex.tool
        assert traj.segments[i].tag == "observation" and traj.segments[i].text == ex.observation
        steps = problems[ex.metadata["problem_id"]].metadata["solution"]["steps"]
        assert {"tool": ex.tool, "argument": ex.argument, "finding": ex.fact}.items() <= \
            next(s for s in steps if (s["tool"], s["argument"]) == (ex.tool, ex.argument)).items()
        assert ex.fact in ex.observation and ex.seen_call == ((ex.tool, ex.argument) in seen)
    # every searched or crawled solution step of those trajectories that the teacher did call is an example
    called = {(t.id, s.tag, s.text) for _, t in teacher_runs[4:] for s in t.segments if s.tag in TOOL_TAGS}
    wanted = {(t.id, s["tool"], s["argument"]) for p, t in teacher_runs[4:] for s in p.metadata["solution"]["steps"]
              if s["tool"] != "code"}
    assert {(e.metadata["trajectory_id"], e.tool, e.argument) for e in examples} == called & wanted


def test_examples_round_trip_and_bad_lines_name_file_and_line(examples, tmp_path):
    path = tmp_path / "obs.jsonl"
    assert write_observation_examples(path, examples) == len(examples)
    assert list(read_observation_examples(path)) == examples
    path.write_text(path.read_text() + '{"id": 1}\n')
    with pytest.raises(ValueError, match=rf"obs.jsonl:{len(examples) + 1}: not an observation example"):
        list(read_observation_examples(path))


def test_scores_of_the_real_observations_are_perfect_and_of_others_lower(examples):
    perfect, rows = fidelity_scores(examples, [(e.observation, True) for e in examples])
    assert perfect["n"] == len(rows) == len(examples)
    assert perfect["token_f1"] == perfect["fact_present"] == perfect["exact"] == perfect["closed"] == 1.0
    shifted, _ = fidelity_scores(examples, [(e.observation, True) for e in examples[1:] + examples[:1]])
    assert shifted["token_f1"] < 1.0 and shifted["fact_present"] < 1.0
    assert shifted["seen_call"]["n"] + shifted["unseen_call"]["n"] == len(examples)
    # normalised: [capital, is, vazoma] vs [capital, of, ludoria, is, vazoma]: precision 3/3, recall 3/5
    assert observation_f1("The capital is Vazoma.", "the capital of Ludoria is Vazoma") == pytest.approx(2 * 1 * 0.6 / 1.6)


def test_a_policy_that_learned_an_observation_reproduces_it(examples, tiny_model, tokenizer, tmp_path):
    example = min(examples, key=lambda e: len(e.question + e.context + e.observation))
    untrained = world_model_fidelity(save_policy(tiny_model, tokenizer, tmp_path / "untrained"), [example],
                                     max_new_tokens=160)
    prompt = observation_prompt(tokenizer, example, None)
    target = encode_observation(tokenizer, example.observation)  # open tag + observation + close, as RL inserts it
    open_ids = tokenizer(OBSERVATION_OPEN, add_special_tokens=False)["input_ids"]
    assert prompt[-len(open_ids):] == open_ids == target[:len(open_ids)]
    ids = prompt + target[len(open_ids):]
    labels = [IGNORE_INDEX] * len(prompt) + target[len(open_ids):]
    torch.manual_seed(0)
    opt = torch.optim.Adam(tiny_model.parameters(), lr=1e-2)
    batch = torch.tensor([ids])
    for _ in range(60):  # memorise this one observation: stage 3 learns observation tokens
        opt.zero_grad()
        tiny_model.train()(input_ids=batch, labels=torch.tensor([labels])).loss.backward()
        opt.step()
    trained = world_model_fidelity(save_policy(tiny_model, tokenizer, tmp_path / "trained"), [example],
                                   max_new_tokens=160, predictions_path=tmp_path / "pred.jsonl")
    assert trained["n"] == 1 and trained["skipped_too_long"] == 0
    assert trained["fact_present"] == 1.0 and trained["closed"] == 1.0 and trained["token_f1"] > 0.9
    assert untrained["token_f1"] < 0.5 and untrained["fact_present"] == 0.0
    assert (tmp_path / "pred.jsonl").read_text().count("\n") == 1
    too_long = world_model_fidelity(tmp_path / "trained", [example], max_new_tokens=10_000)
    assert too_long["n"] == 0 and too_long["skipped_too_long"] == 1


def test_a_computation_code_call_is_an_example_of_its_printed_value(computation_runs):
    examples = observation_examples([(traj, problem) for problem, traj in computation_runs])
    assert len(examples) == len(computation_runs)  # the oracle without mistakes: one correct code call each
    for ex, (problem, _) in zip(examples, computation_runs):
        assert ex.tool == "code" and ex.fact == problem.answers[0] and ex.fact in ex.observation
