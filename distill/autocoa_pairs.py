"""AutoCoA's CoT+A ("when to act") pairs and CoT-only data, built from our world problems and teacher trajectories.

A pair is one question, a shared assistant prefix, and two continuations that differ at the trigger, the point
where the model decides to act or to answer:
- info_missing: the needed fact is not in the context yet. Chosen = the teacher's decision think + its tool
  call (`<think>Search "Ludoria".</think><web_search>Ludoria</web_search>`); rejected = a hallucinated answer
  (the scripted oracle's wrong_answer mistake: `The answer seems to be <distractor>.` + that answer).
- info_present: the fact is in the context. Two sources: (a) in a teacher trajectory, right after the last
  observation: chosen = the teacher's own answer (its final think + suggested_answer), rejected = an
  unnecessary call (the teacher's decision think + call of the last hop again); (b) on the facts-given variant
  of the problem (`facts_given_problem`: the findings are written into the question): chosen = the CoT answer,
  rejected = the teacher's first decision + call, which is unnecessary there.
Both continuations are real text: the teacher's segments, the oracle's mistake template, the world's findings.
Only tool calls that follow the problem's solution become chosen (a teacher's wrong-entity search is not
taught as the right action). Answering branches stop at `<suggested_answer>`: the decision is what is learned;
the double_check that follows in a trajectory is stage 2's business.

CoT-only data (SFT stage 2 mixes it with CoA): `cot_trajectory(facts_given_problem(p))` answers without a tool,
so whether to act is a real decision for the student.

Pairs are stored as rendered text (`PairRecord.prefix/chosen/rejected`), `tags` saying how to tokenize it
("afm": our tags; "plain": foreign text such as AutoCoA's release, distill/autocoa_import.py).

Usage:
    pairs = trajectory_pairs(traj, problem) + [facts_given_pair(traj, problem)]
    write_pairs("pairs.jsonl", pairs); pairs = read_pairs("pairs.jsonl")
    chosen, rejected = pair_examples(tokenizer, pairs[0], system_prompt)     # for training/pairwise_loss.py
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from transformers import PreTrainedTokenizerBase

from models.format import TOOL_TAGS, Segment, Trajectory, render_segments, validate_trajectory
from problems.records import Problem
from training.pairwise_loss import TagStyle, continuation_example
from training.sft_data import SFTExample

CASES = ("info_missing", "info_present")
T = TypeVar("T")


class PairFormatError(ValueError):
    """A malformed pair row or file; the message names file and line."""


@dataclass
class PairRecord:
    """One when-to-act pair: `question` is the user turn, `prefix` the shared assistant text (not learned),
    `chosen` / `rejected` the two continuations (learned, contrasted)."""

    id: str
    question: str
    prefix: str
    chosen: str
    rejected: str
    case: str  # info_missing (chosen acts) | info_present (chosen answers) | "" when unknown (imported)
    tags: TagStyle = "afm"
    metadata: dict[str, Any] = field(default_factory=dict)  # problem_id, trajectory_id, source, trigger index, ...

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PairRecord":
        return cls(id=str(data["id"]), question=data["question"], prefix=data["prefix"], chosen=data["chosen"],
                   rejected=data["rejected"], case=data["case"], tags=data.get("tags", "afm"),
                   metadata=dict(data.get("metadata") or {}))


def _solution(problem: Problem) -> dict:
    if "solution" not in problem.metadata:
        raise ValueError(f"problem {problem.id!r}: no metadata['solution'] (only generated world problems have one)")
    return problem.metadata["solution"]


def _hallucination(problem: Problem) -> list[Segment]:
    """The oracle's wrong_answer mistake: a distractor stated as the answer without looking it up."""
    distractor = _solution(problem)["distractors"][0]
    return [Segment("think", f"The answer seems to be {distractor}."), Segment("suggested_answer", distractor)]


def _decisions(traj: Trajectory, problem: Problem) -> list[int]:
    """Indices i where segments[i] is a think followed by a tool call that follows the solution (the teacher
    decided to act, rightly)."""
    wanted = {(s["tool"], s["argument"]) for s in _solution(problem)["steps"]}
    segs = traj.segments
    return [i for i in range(len(segs) - 1)
            if segs[i].tag == "think" and segs[i + 1].tag in TOOL_TAGS and (segs[i + 1].tag, segs[i + 1].text) in wanted]


def _final_answer_start(traj: Trajectory) -> int:
    """Index of the think that opens the teacher's answer: the last think before the first suggested_answer
    after the last observation."""
    segs = traj.segments
    last_obs = max(i for i, s in enumerate(segs) if s.tag == "observation")
    suggest = next(i for i in range(last_obs, len(segs)) if segs[i].tag == "suggested_answer")
    if segs[suggest - 1].tag != "think":
        raise ValueError(f"trajectory {traj.id!r}: no think right before the suggested answer at segment {suggest}")
    return suggest - 1


def _pair(pid: str, question: str, prefix: list[Segment], chosen: list[Segment], rejected: list[Segment],
          case: str, **metadata: Any) -> PairRecord:
    return PairRecord(pid, question, render_segments(prefix), render_segments(chosen), render_segments(rejected),
                      case, "afm", metadata)


def trajectory_pairs(traj: Trajectory, problem: Problem) -> list[PairRecord]:
    """Pairs at every correct tool decision of a verified teacher trajectory (info_missing), plus one at its
    final answer (info_present). Empty for unverified trajectories or problems without distractors (no
    hallucination to contrast)."""
    if traj.metadata.get("verified") is False or not _solution(problem).get("distractors"):
        return []
    segs = traj.segments
    decisions = _decisions(traj, problem)
    pairs = [
        _pair(f"{traj.id}:act{i}", traj.question, segs[:i], segs[i:i + 2], _hallucination(problem), "info_missing",
              problem_id=problem.id, trajectory_id=traj.id, trigger=i)
        for i in decisions
    ]
    if decisions:
        start = _final_answer_start(traj)
        last = max(decisions)  # the last hop's decision: redoing it once its result is in is unnecessary
        pairs.append(_pair(f"{traj.id}:answer", traj.question, segs[:start], segs[start:start + 2], segs[last:last + 2],
                           "info_present", problem_id=problem.id, trajectory_id=traj.id, trigger=start))
    return pairs


def given_facts(problem: Problem) -> list[str]:
    """The facts the problem's solution looks up (search and crawl findings). Empty for a problem solved by code
    alone (a computation): no fact written into the question makes its tool unnecessary."""
    if "solution" not in problem.metadata:
        return []
    return [s["finding"] for s in problem.metadata["solution"].get("steps", []) if s["tool"] != "code"]


def facts_given_problem(problem: Problem) -> Problem:
    """The problem with every looked-up fact written into the question, so it needs no tool. Code steps are
    left out: their input facts are given, the small comparison is the model's to do. ValueError for a problem
    without looked-up facts (a computation still needs its code)."""
    facts = given_facts(problem)
    if not facts:
        raise ValueError(f"problem {problem.id!r}: no looked-up facts to give; it cannot be made tool-free")
    # The type sentences ("X is a painter.") of a search that was followed by a crawl are kept: harmless context.
    question = f"Facts: {' '.join(dict.fromkeys(facts))}\nQuestion: {problem.question}"
    metadata = {**problem.metadata, "facts_given": True, "source_problem_id": problem.id}
    return replace(problem, id=f"{problem.id}-given", question=question, metadata=metadata)


def _cot_answer(problem: Problem) -> list[Segment]:
    """think (the facts that decide it, then the answer, in the teacher's final-think wording) + suggested_answer."""
    steps = [s for s in _solution(problem)["steps"] if s["tool"] != "code"]
    answer = problem.answers[0]
    # a bridge's answer is in its last finding; a comparison needs every value it compares
    decisive = [s["finding"] for s in steps if s["entity"] != s["argument"]]
    reason = decisive[-1] if _solution(problem)["kind"] == "bridge" else " ".join(decisive)
    return [Segment("think", f"{reason} So the answer is {answer}."), Segment("suggested_answer", answer)]


def cot_trajectory(problem: Problem) -> Trajectory:
    """A tool-free CoT trajectory for a facts-given problem: think, suggested_answer, double_check, answer."""
    if not problem.metadata.get("facts_given"):
        raise ValueError(f"problem {problem.id!r} is not facts-given; a CoT answer without tools would be a guess")
    answer = problem.answers[0]
    traj = Trajectory(
        id=f"cot-{problem.id}", question=problem.question, family=problem.family,
        segments=_cot_answer(problem) + [Segment("double_check", f"score: 4. {answer} matches the findings."),
                                         Segment("answer", answer)],
        answer=answer, metadata={"problem_id": problem.id, "cot_only": True, "tool_calls": 0},
    )
    validate_trajectory(traj)
    return traj


def facts_given_pair(traj: Trajectory, problem: Problem) -> PairRecord | None:
    """info_present on the facts-given variant: chosen = the CoT answer, rejected = the teacher's first tool
    decision (now unnecessary). None when the trajectory has no correct tool decision or the problem has no
    looked-up facts to give."""
    decisions = _decisions(traj, problem)
    if not decisions or not given_facts(problem):
        return None
    given = facts_given_problem(problem)
    first = decisions[0]
    return _pair(f"{traj.id}:given", given.question, [], _cot_answer(given), traj.segments[first:first + 2],
                 "info_present", problem_id=given.id, trajectory_id=traj.id, trigger=0)


def pair_examples(tokenizer: PreTrainedTokenizerBase, pair: PairRecord,
                  system_prompt: str | None = None) -> tuple[SFTExample, SFTExample]:
    """(chosen, rejected) training examples: prompt and prefix masked, continuation labelled."""
    return tuple(continuation_example(tokenizer, pair.question, pair.prefix, text, system_prompt, pair.tags)
                 for text in (pair.chosen, pair.rejected))


def write_records(path: str | Path, records: Iterable[Any]) -> int:
    """Dataclass records (pairs, evaluation/world_model.py's observation examples) one JSON object per line;
    atomic (temp file renamed over `path`). Returns the count."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    n = 0
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(asdict(record), ensure_ascii=False) + "\n")
                n += 1
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return n


def read_records(path: str | Path, from_dict: Callable[[dict], T], what: str,
                 error: type[ValueError] = ValueError) -> Iterator[T]:
    """`from_dict` of every line of a `write_records` file; a malformed line raises `error` naming file and line."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield from_dict(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise error(f"{path}:{lineno}: not {what}: {exc}") from exc


def write_pairs(path: str | Path, pairs: Iterable[PairRecord]) -> int:
    """One JSON object per line; atomic (temp file renamed over `path`). Returns the count."""
    return write_records(path, pairs)


def read_pairs(path: str | Path) -> Iterator[PairRecord]:
    """Pairs from `write_pairs`; a malformed line raises PairFormatError naming file and line."""
    return read_records(path, PairRecord.from_dict, "a pair record", PairFormatError)
