"""RL selection: with the oracle's no-tool baseline only problems whose answer leaks into the question drop; with
an LLM baseline the calls run concurrently and a re-run after a crash re-uses finished results."""
from __future__ import annotations

import threading
import time

import pytest

from agents.teacher.backends import Completion
from agents.teacher.oracle import OracleKnowledge, ScriptedOracleBackend
from distill.rl_problems import RLSelectionConfig, select_rl_problems
from problems.records import Problem


def test_direct_baseline_drops_leaked_answers_only(world_setup):
    leak = Problem("leak", "Which city is larger, Nonozu or Dali?", ["Nonozu"], "multihop",
                   metadata={"solution": {"steps": []}})
    problems = world_setup.problems + [leak]
    backend = ScriptedOracleBackend(OracleKnowledge(problems), 0.0, 0.0, 0)
    kept, stats = select_rl_problems(problems, backend, RLSelectionConfig())
    ids = {p.id for p in kept}
    assert "leak" not in ids and stats["in"] == len(problems)
    # an invented-world bridge answer is never in its question, so the no-tool baseline cannot solve it
    bridges = [p for p in world_setup.problems if p.metadata["solution"].get("kind") == "bridge"
               and not any(a in p.question for a in p.answers)]
    assert bridges and all(p.id in ids for p in bridges)
    assert all(p.metadata["direct_accuracy"] <= 0.3 for p in kept)


class CountingBaseline:
    """A direct-answer baseline that answers every question wrongly after a short wait, records each call and the
    most calls in flight, and can crash on its n-th call (a dead endpoint, a killed driver)."""

    name = "counting"
    structured = False

    def __init__(self, crash_on_call: int | None = None, max_concurrency: int = 4):
        self.crash_on_call, self.max_concurrency = crash_on_call, max_concurrency
        self.calls: list[str] = []
        self.started = self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()

    def complete(self, agent, messages, stop, schema=None):
        with self.lock:
            self.started += 1
            if self.started == self.crash_on_call:
                raise ConnectionError("endpoint went away")
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(0.02)
        with self.lock:
            self.in_flight -= 1
            self.calls.append(messages[-1]["content"])
        return Completion("no idea", 1, 1)


def test_selection_is_concurrent_and_resumes_after_a_crash_without_duplicate_calls(world_setup, tmp_path):
    problems, results = world_setup.problems, tmp_path / "rl_selection.jsonl"
    crashing = CountingBaseline(crash_on_call=7)
    with pytest.raises(ConnectionError):
        select_rl_problems(problems, crashing, RLSelectionConfig(), results_path=results)
    saved = len(results.read_text().splitlines())
    assert saved == len(crashing.calls) >= 6 and crashing.max_in_flight == 4  # finished calls were kept
    again = CountingBaseline()
    kept, stats = select_rl_problems(problems, again, RLSelectionConfig(), results_path=results)
    assert (stats["reused"], stats["asked"]) == (saved, len(problems) - saved)
    # every problem asked exactly once over both runs
    assert sorted(crashing.calls + again.calls) == sorted(f"Question: {p.question}" for p in problems)
    assert len(kept) == len(problems) and all(p.metadata["direct_accuracy"] == 0.0 for p in kept)
    # another baseline does not reuse these results
    other = CountingBaseline()
    other.name = "other"
    assert select_rl_problems(problems, other, RLSelectionConfig(concurrency=2), results_path=results)[1]["asked"] \
        == len(problems) and other.max_in_flight == 2
