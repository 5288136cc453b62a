"""RL problem selection: keep the hard problems, i.e. drop those a direct-answer (no-tool) baseline solves.

The paper drops web queries a strong LLM answers directly with > 30% accuracy. Here the baseline is the teacher
backend called as agent `direct` with the question only, `attempts` times; a problem is dropped when the share of
correct direct answers exceeds `max_direct_accuracy`.
- OpenAI-compatible backend: the real LLM answering without tools.
- Scripted oracle (offline default): its `direct` role does NOT use the solution; it answers from the question
  text alone (the first capitalised name, or the largest number), i.e. what a model that never saw the invented
  world could do. It only ever "solves" problems whose answer is written in the question (e.g. some comparisons),
  which is exactly the leakage this stage should remove.

Concurrent and resumable (thousands of LLM calls in real use): problems are asked from a thread pool of
`concurrency` workers (default: the backend's `max_concurrency`; the endpoint's own semaphore bounds it too),
and each finished problem is appended to `results_path` (JSONL, flushed per line) with a fingerprint of the
baseline (backend name, attempts). A re-run after a crash re-uses every result with the same fingerprint and
asks only the rest; a failure does not stop finished calls from being saved, and is raised after them.

Usage:
    kept, stats = select_rl_problems(problems, backend, RLSelectionConfig(), results_path=out / "rl_selection.jsonl")
    write_problems(path, kept)
"""
from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

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
    concurrency: int | None = Field(None, ge=1, description="Problems asked at once; None = the backend's "
                                                            "max_concurrency (1 for the oracle)")


def direct_accuracy(problem: Problem, backend: LLMBackend, attempts: int) -> float:
    messages = [{"role": "system", "content": DIRECT_PROMPT}, {"role": "user", "content": f"Question: {problem.question}"}]
    correct = sum(answer_matches(backend.complete("direct", messages, None).text.strip(), problem.answers)
                  for _ in range(attempts))
    return correct / attempts


def load_results(path: Path | None, fingerprint: str) -> dict[str, float]:
    """{problem id: direct accuracy} saved by an earlier run of the same baseline; a line cut by a crash is
    skipped (that problem is asked again)."""
    if path is None or not path.exists():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("baseline") == fingerprint:
            out[row["problem_id"]] = float(row["direct_accuracy"])
    return out


def select_rl_problems(problems: list[Problem], backend: LLMBackend, cfg: RLSelectionConfig,
                       results_path: Path | None = None) -> tuple[list[Problem], dict]:
    fingerprint = f"{backend.name}|attempts={cfg.attempts}"
    accuracy = load_results(results_path, fingerprint)
    reused = sum(1 for p in problems if p.id in accuracy)
    todo = [p for p in problems if p.id not in accuracy]
    lock, errors = threading.Lock(), []
    out = open(results_path, "a", encoding="utf-8") if results_path is not None else None
    try:
        with ThreadPoolExecutor(max_workers=cfg.concurrency or backend.max_concurrency) as pool:
            futures = {pool.submit(direct_accuracy, p, backend, cfg.attempts): p for p in todo}
            for future in as_completed(futures):
                problem = futures[future]
                try:
                    acc = future.result()
                except Exception as exc:  # noqa: BLE001 - save what finished, then raise the first failure
                    errors.append(exc)
                    for f in futures:
                        f.cancel()
                    continue
                with lock:
                    accuracy[problem.id] = acc
                    if out is not None:
                        out.write(json.dumps({"problem_id": problem.id, "baseline": fingerprint,
                                              "direct_accuracy": acc}) + "\n")
                        out.flush()
    finally:
        if out is not None:
            out.close()
    if errors:
        raise errors[0]
    kept = [Problem(p.id, p.question, p.answers, p.family, p.split, p.source,
                    {**p.metadata, "direct_accuracy": accuracy[p.id]})
            for p in problems if accuracy[p.id] <= cfg.max_direct_accuracy]
    return kept, {"in": len(problems), "out": len(kept), "dropped_direct_solved": len(problems) - len(kept),
                  "reused": reused, "asked": len(todo)}
