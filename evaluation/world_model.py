"""World-model fidelity (issue #23, item 4): how well a policy writes the observation of a tool call itself.

AutoCoA's SFT stage 3 learns observation tokens, so the policy can imagine tool results (its RL stage 1 runs
on them). This measures what it imagines on held-out tool calls of teacher trajectories:
- an example is the question, the assistant text up to and including one tool call (`context`), the REAL
  observation the tool returned in the teacher's log, and the answer-bearing fact of that hop (the world
  solution step's `finding`, e.g. "The capital of Ludoria is Vazoma.");
- only calls that follow the problem's solution and whose real observation contains that fact are used (so
  the fact is what the call is for): searches and crawls, and a computation's code call (its finding is the
  printed value; a multi-hop problem's comparison code prints no finding sentence and is left out);
- the policy generates greedily after the context and the observation open tag, up to `</observation>` (the
  same prompt the simulated-environment rollout gives it, training/rl_rollout.py) with the HF engine;
- scores: `token_f1` (SQuAD-normalised token F1 of predicted vs real observation), `fact_present` (the
  normalised fact is a substring of the normalised prediction), `exact` (identical text), `closed` (the
  prediction closed the observation within `max_new_tokens`). Each also per tool, and split by `seen_call`:
  whether the same (tool, argument) call occurs in the training trajectories, since in one world a held-out
  problem's search can repeat a training one (then the result can be recalled, not inferred).

Usage:
    examples = observation_examples(heldout_runs, training_calls(train_trajectories))
    write_observation_examples("observations_heldout.jsonl", examples)
    world_model_fidelity("runs/sft3/policy", read_observation_examples("observations_heldout.jsonl"))
    .venv/bin/python -m pytest tests/autocoa/test_world_model.py -q
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from transformers import PreTrainedTokenizerBase

from distill.autocoa_pairs import read_records, write_records
from models.engines.hf import HFEngine
from models.format import OBSERVATION_OPEN, TOOL_TAGS, Trajectory, parse_segments, render_segments
from models.policy import load_policy
from models.tokenizer import decode, encode_prompt, encode_segments
from problems.records import Problem
from training.rl_rollout import OBSERVATION_STOP
from training.scoring import normalize_answer


@dataclass
class ObservationExample:
    """One held-out tool call: what the model sees (`question`, `context`) and what the tool really returned."""

    id: str
    question: str
    context: str  # rendered assistant text up to and including the tool call (models.format.render_segments)
    tool: str
    argument: str
    observation: str  # the real observation text of the teacher log
    fact: str  # the answer-bearing finding of the hop (contained in `observation`)
    seen_call: bool  # the same (tool, argument) call is in a training trajectory
    metadata: dict[str, Any] = field(default_factory=dict)  # problem_id, trajectory_id, segment index, hop

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ObservationExample":
        return cls(**{**data, "metadata": dict(data.get("metadata") or {})})


def training_calls(trajectories: Iterable[Trajectory]) -> set[tuple[str, str]]:
    """Every (tool tag, argument) called in `trajectories`."""
    return {(s.tag, s.text) for t in trajectories for s in t.segments if s.tag in TOOL_TAGS}


def observation_examples(runs: Iterable[tuple[Trajectory, Problem]],
                         seen: set[tuple[str, str]] = frozenset()) -> list[ObservationExample]:
    """The examples of (trajectory, its problem) pairs: every solution-following call of the trajectory whose
    real observation holds the hop's finding, first occurrence per call. `seen`: the training calls."""
    examples = []
    for traj, problem in runs:
        findings = {(s["tool"], s["argument"]): s for s in problem.metadata.get("solution", {}).get("steps", [])}
        done: set[tuple[str, str]] = set()
        segs = traj.segments
        for i, seg in enumerate(segs[:-1]):
            step = findings.get((seg.tag, seg.text))
            if step is None or (seg.tag, seg.text) in done or segs[i + 1].tag != "observation":
                continue
            if normalize_answer(step["finding"]) not in normalize_answer(segs[i + 1].text):
                continue
            done.add((seg.tag, seg.text))
            examples.append(ObservationExample(
                id=f"{traj.id}:obs{i + 1}", question=traj.question, context=render_segments(segs[:i + 1]),
                tool=seg.tag, argument=seg.text, observation=segs[i + 1].text, fact=step["finding"],
                seen_call=(seg.tag, seg.text) in seen,
                metadata={"problem_id": problem.id, "trajectory_id": traj.id, "segment": i + 1,
                          "hop": step.get("hop")}))
    return examples


def write_observation_examples(path: str | Path, examples: Iterable[ObservationExample]) -> int:
    """One JSON object per line, atomic; returns the count."""
    return write_records(path, examples)


def read_observation_examples(path: str | Path) -> Iterator[ObservationExample]:
    """Examples from `write_observation_examples`; a malformed line raises ValueError naming file and line."""
    return read_records(path, ObservationExample.from_dict, "an observation example")


def observation_f1(predicted: str, real: str) -> float:
    """SQuAD token F1 of two observation texts (normalised: lowercase, no punctuation or articles)."""
    pred, gold = normalize_answer(predicted).split(), normalize_answer(real).split()
    common = sum((Counter(pred) & Counter(gold)).values())
    if not common:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def observation_prompt(tokenizer: PreTrainedTokenizerBase, ex: ObservationExample, system_prompt: str | None) -> list[int]:
    """Chat prompt + the context's segments (tokenized as in SFT and RL) + the observation open tag."""
    open_ids = tokenizer(OBSERVATION_OPEN, add_special_tokens=False)["input_ids"]  # our own text: trusted
    return (encode_prompt(tokenizer, ex.question, system_prompt)
            + encode_segments(tokenizer, parse_segments(ex.context)).input_ids + open_ids)


def predict_observations(engine: HFEngine, examples: Sequence[ObservationExample], max_new_tokens: int,
                         system_prompt: str | None = None, batch_size: int = 16) -> list[tuple[str, bool]]:
    """(predicted observation text, closed) per example: greedy, from `observation_prompt`."""
    tokenizer = engine.tokenizer
    prompts = [observation_prompt(tokenizer, ex, system_prompt) for ex in examples]
    out = []
    for start in range(0, len(prompts), batch_size):
        gens = engine.generate(prompts[start:start + batch_size], max_new_tokens=max_new_tokens, temperature=0.0,
                               stop=(OBSERVATION_STOP,))
        for gen in gens:
            text = decode(tokenizer, gen.token_ids)
            closed = gen.stop == OBSERVATION_STOP
            out.append((text[:text.rfind(OBSERVATION_STOP)].strip("\n") if closed else text, closed))
    return out


def _scores(rows: list[dict]) -> dict[str, float]:
    n = len(rows)
    return {"n": n, **{k: sum(r[k] for r in rows) / n if n else 0.0
                       for k in ("token_f1", "fact_present", "exact", "closed")}}


def fidelity_scores(examples: Sequence[ObservationExample], predictions: Sequence[tuple[str, bool]]) -> tuple[dict, list[dict]]:
    """(summary, per-example rows) of predictions against the real observations."""
    rows = [{"id": ex.id, "seen_call": ex.seen_call, "token_f1": observation_f1(pred, ex.observation),
             "fact_present": float(normalize_answer(ex.fact) in normalize_answer(pred)),
             "exact": float(pred.strip() == ex.observation.strip()), "closed": float(closed), "predicted": pred}
            for ex, (pred, closed) in zip(examples, predictions)]
    summary = {**_scores(rows), "seen_call": _scores([r for r in rows if r["seen_call"]]),
               "unseen_call": _scores([r for r in rows if not r["seen_call"]]),
               **{tool: _scores([r for r, ex in zip(rows, examples) if ex.tool == tool])
                  for tool in sorted({ex.tool for ex in examples})}}
    return summary, rows


def world_model_fidelity(model_dir: str | Path, examples: Sequence[ObservationExample], max_new_tokens: int = 256,
                         system_prompt: str | None = None, device: str = "cpu", batch_size: int = 16,
                         predictions_path: str | Path | None = None) -> dict:
    """Fidelity of the policy at `model_dir` on `examples`: {n, token_f1, fact_present, exact, closed,
    skipped_too_long, seen_call: {...}, unseen_call: {...}, <tool>: {...} per tool called}. Examples whose prompt plus `max_new_tokens` exceed
    the model's positions are skipped (counted). `predictions_path`: per-example JSONL (predicted text, scores)."""
    model, tokenizer = load_policy(model_dir, device=device)
    engine = HFEngine(model, tokenizer, max_batch_size=batch_size)
    limit = getattr(model.config, "max_position_embeddings", None)
    kept = [ex for ex in examples
            if limit is None or len(observation_prompt(tokenizer, ex, system_prompt)) + max_new_tokens <= limit]
    summary, rows = fidelity_scores(kept, predict_observations(engine, kept, max_new_tokens, system_prompt, batch_size))
    if predictions_path is not None:
        Path(predictions_path).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                          encoding="utf-8")
    return {**summary, "skipped_too_long": len(examples) - len(kept)}
