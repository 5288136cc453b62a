"""RL selection with the oracle's no-tool baseline: only problems whose answer leaks into the question drop."""
from __future__ import annotations

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
