"""Reply parsing, answer matching, and the oracle answering each agent in role from its messages."""
from __future__ import annotations

import pytest

from agents.teacher.agents import parse_check_score, parse_reflection, parse_think, reflection_wants_replan
from agents.teacher.answers import answer_matches
from agents.teacher.oracle import OracleKnowledge, ScriptedOracleBackend


def test_parse_think_reads_next_agent_and_answer():
    d = parse_think('Need Kell Brin. Search "Kell Brin".\nNEXT: search')
    assert (d.thought, d.next_agent, d.answer) == ('Need Kell Brin. Search "Kell Brin".', "search", None)
    d = parse_think("So it is 42.\nNEXT: answer\nANSWER: 42")
    assert (d.next_agent, d.answer) == ("answer", "42")
    assert parse_think("no routing line").next_agent is None
    assert parse_think("x\nNEXT: dance").next_agent is None


def test_reflection_and_check_scores():
    text = "information conflict: good; tool effectiveness: poor; trajectory monitoring: average. Missed."
    assert parse_reflection(text)["tool effectiveness"] == "poor" and reflection_wants_replan(text)
    assert not reflection_wants_replan("information conflict: good; tool effectiveness: good")
    assert parse_check_score("score: 4. fine") == 4 and parse_check_score("looks fine") == 1


def test_answer_matching():
    assert answer_matches("The Kell Brin.", ["Kell Brin"])
    assert answer_matches("x | 42.0", ["42"])
    assert not answer_matches("4.2", ["42"])
    assert not answer_matches("", ["x"])


def test_oracle_answers_agents_in_role(world_setup):
    p = next(p for p in world_setup.problems if p.family == "multihop")
    backend = ScriptedOracleBackend(OracleKnowledge(world_setup.problems), 0.0, 0.0, 0)
    first = backend.complete("thinking", [{"role": "system", "content": "s"},
                                          {"role": "user", "content": f"Question: {p.question}\nWhat next?"}], None)
    assert first.text.endswith("NEXT: planning") and first.prompt_tokens > 0
    arg = p.metadata["solution"]["steps"][0]["argument"]
    search = backend.complete("search", [{"role": "user", "content": f'Question: {p.question}\nIntent: Search "{arg}".'}], None)
    assert search.text == arg
    plan = backend.complete("planning", [{"role": "user", "content": f"Question: {p.question}\nState:\n\nWrite the plan."}], None)
    assert plan.text.startswith("1. search ") and plan.text.endswith("answer.")
    with pytest.raises(ValueError, match="no known 'Question"):
        backend.complete("thinking", [{"role": "user", "content": "Question: who am I?"}], None)


def test_plan_names_only_entities_already_shown(world_setup):
    """A multi-hop plan must not name a later hop's entity before a search found it, nor schedule crawls."""
    backend = ScriptedOracleBackend(OracleKnowledge(world_setup.problems), 0.0, 0.0, 0)
    p = next(p for p in world_setup.problems if p.family == "multihop" and p.metadata["solution"]["kind"] == "bridge"
             and len({s["argument"] for s in p.metadata["solution"]["steps"] if s["tool"] == "web_search"}) > 1)
    searches = [s["argument"] for s in p.metadata["solution"]["steps"] if s["tool"] == "web_search"]
    later = [a for a in searches if a not in p.question]
    assert later, "fixture problem should have an entity that is not in the question"
    plan = backend.complete("planning", [{"role": "user", "content": f"Question: {p.question}\nState:\n\nWrite the plan."}],
                            None).text
    assert plan.startswith(f"1. search {searches[0]}.") and "search the name found" in plan
    assert not any(a in plan for a in later) and "read " not in plan
