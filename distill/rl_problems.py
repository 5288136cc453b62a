"""RL problem selection: keep the hard problems, i.e. drop those a direct-answer (no-tool) baseline solves.

The paper drops web queries a strong LLM answers directly with > 30% accuracy. Here the baseline is the teacher
backend called as agent `direct` with the question only, `attempts` times; a problem is dropped when the share of
correct direct answers exceeds `max_direct_accuracy`.
- OpenAI-compatible backend: the real LLM answering without tools.
- Scripted oracle (offline default): its `direct` role does NOT use the solution; it answers from the question
  text alone (the first capitalised name, or the largest number), i.e. what a model that never saw the invented
  world could do. It only ever "solves" problems whose answer is written in the question (e.g. some comparisons),
  which is exactly the leakage this stage should remove.

Usage:
    kept, stats = select_rl_problems(problems, backend, RLSelectionConfig())
    write_problems(path, kept)
"""
from __future__ import annotations

from pydantic import Field

from afm.config import Config
from agents.teacher.answers import answer_matches
from agents.teacher.backends import LLMBackend
from problems.records import Problem

DIRECT_PROMPT = "Answer the question directly, without tools. Reply with the answer only."


class RLSelectionConfig(Config):
    attempts: int = Field(1, ge=1, description="Direct answers per problem (use > 1 with a sampling LLM)")
    max_direct_accuracy: float = Field(0.3, ge=0.0, le=1.0,
                                       description="Drop a problem the baseline answers correctly more often")


def direct_accuracy(problem: Problem, backend: LLMBackend, attempts: int) -> float:
    messages = [{"role": "system", "content": DIRECT_PROMPT}, {"role": "user", "content": f"Question: {problem.question}"}]
    correct = sum(answer_matches(backend.complete("direct", messages, None).text.strip(), problem.answers)
                  for _ in range(attempts))
    return correct / attempts


def select_rl_problems(problems: list[Problem], backend: LLMBackend,
                       cfg: RLSelectionConfig) -> tuple[list[Problem], dict]:
    kept = []
    for p in problems:
        acc = direct_accuracy(p, backend, cfg.attempts)
        if acc <= cfg.max_direct_accuracy:
            kept.append(Problem(p.id, p.question, p.answers, p.family, p.split, p.source,
                                {**p.metadata, "direct_accuracy": acc}))
    return kept, {"in": len(problems), "out": len(kept), "dropped_direct_solved": len(problems) - len(kept)}
