"""Reply parsing (a table of real-world reply shapes), answer matching, and the oracle answering each agent in
role from its messages."""
from __future__ import annotations

import re

import pytest

from agents.teacher.answers import answer_matches
from agents.teacher.oracle import OracleKnowledge, ScriptedOracleBackend
from agents.teacher.protocol import (
    ROLE_SCHEMAS, canonical_reply, check_passes, parse_check_score, parse_reflection, parse_think,
    reflection_wants_replan, reply_parses,
)

# Coordinator replies as real chat models write them: (reply, next agent, answer). None = must NOT parse.
THINK_SHAPES = [
    ('Need Kell Brin. Search "Kell Brin".\nNEXT: search', "search", None),
    ("**NEXT:** search", "search", None),
    ("Let me look it up.\n\n**NEXT:** search", "search", None),
    ("Next: search", "search", None),
    ("NEXT: search.", "search", None),
    ("NEXT: Search", "search", None),
    ("NEXT: **search**", "search", None),
    ("next: `search`", "search", None),
    ("### NEXT: planning", "planning", None),
    ("- NEXT: crawl", "crawl", None),
    ("I should read the page first, so NEXT: crawl", "crawl", None),
    ("NEXT: web_search", "search", None),
    ("Next agent: the planner", "planning", None),
    ("NEXT = code", "code", None),
    ("NEXT -> reflection", "reflection", None),
    ("NEXT: search agent", "search", None),
    ("So it is 42.\nNEXT: answer\nANSWER: 42", "answer", "42"),
    ("So it is 42.\n**NEXT:** answer\n**ANSWER:** 42", "answer", "42"),
    ("The director is Kell Brin.\nNext: answer\nFinal answer: Kell Brin.", "answer", "Kell Brin."),
    ("NEXT: answer\nAnswer: $\\boxed{17}$", "answer", "17"),
    ('```\nThought: need the page\nNEXT: crawl\n```', "crawl", None),
    ('{"thought": "look up Zarno", "next": "search", "answer": ""}', "search", None),
    ('```json\n{"thought": "done", "next": "answer", "answer": "Kell Brin"}\n```', "answer", "Kell Brin"),
    ('Here is my decision:\n{"Thought": "plan first", "Next": "Planning"}', "planning", None),
    ('{"thought": "raw\x14control", "next": "crawl", "answer": ""}', "crawl", None),  # seen from vLLM
    ("Sure! I think we should first search for the film. NEXT: search. That should help.", "search", None),
    ("no routing line", None, None),
    ("x\nNEXT: dance", None, None),
    ('{"thought": "hmm"}', None, None),
]


@pytest.mark.parametrize("reply,next_agent,answer", THINK_SHAPES)
def test_coordinator_reply_shapes(reply, next_agent, answer):
    d = parse_think(reply)
    assert (d.next_agent, d.answer) == (next_agent, answer)
    if next_agent is not None:  # the routing line is not part of the thought
        assert not re.search(r"\bnext\b[^a-z]*(?:[:=>-]|agent)", d.thought, re.I), d.thought
    assert reply_parses("thinking", reply) == (next_agent is not None)


def test_thought_keeps_the_reasoning_only():
    d = parse_think('Need Kell Brin. Search "Kell Brin".\n**NEXT:** search')
    assert d.thought == 'Need Kell Brin. Search "Kell Brin".'
    assert parse_think("Thought: plan first.\nNEXT: planning").thought == "plan first."
    assert parse_think('{"thought": "look up Zarno", "next": "search", "answer": ""}').thought == "look up Zarno"


SCORE_SHAPES = [
    ("score: 4. fine", 4), ("**Score:** 4", 4), ("Score: 4/5", 3), ("Score: 5/5", 4), ("score = 4", 4),
    ("SCORE: [3]", 3), ("The answer looks right. Score: 3.", 3), ("I'd give it a score of 2.", 2),
    ("Rating: 4", 4), ("score: 2/4", 2), ("Score: 9/10", 4), ("Score: four", 4), ("Score: 3.5", 4),
    ('{"score": 4, "comment": "ok"}', 4), ('```json\n{"score": "3"}\n```', 3), ('{"Score": "2/4"}', 2),
    ("**Score**: 1 — wrong entity", 1),
    ("looks fine", None), ("Score: 7", None), ("score: N.", None),
]


@pytest.mark.parametrize("reply,score", SCORE_SHAPES)
def test_verifier_score_shapes(reply, score):
    assert parse_check_score(reply) == score
    assert check_passes(reply) == (score is not None and score >= 3)


REFLECTION_SHAPES = [
    ("information conflict: good; tool effectiveness: poor; trajectory monitoring: average. Missed.",
     {"information conflict": "good", "tool effectiveness": "poor", "trajectory monitoring": "average"}),
    ("**Information conflict:** good\n**Tool effectiveness:** Poor\n**Trajectory monitoring:** good",
     {"information conflict": "good", "tool effectiveness": "poor", "trajectory monitoring": "good"}),
    ("- Information Conflict - bad\n- Tool_Effectiveness: fair",
     {"information conflict": "poor", "tool effectiveness": "average"}),
    ('{"information_conflict": "good", "tool_effectiveness": "good", "trajectory_monitoring": "poor", "comment": ""}',
     {"information conflict": "good", "tool effectiveness": "good", "trajectory monitoring": "poor"}),
    ("The search worked well.", {}),
]


@pytest.mark.parametrize("reply,aspects", REFLECTION_SHAPES)
def test_reflection_shapes(reply, aspects):
    assert parse_reflection(reply) == aspects
    assert reflection_wants_replan(reply) == ("poor" in aspects.values())
    assert reply_parses("reflection", reply) == bool(aspects)


def test_json_replies_are_logged_in_the_line_protocol():
    assert canonical_reply("verification", '{"score": 4, "comment": "matches the page"}') == \
        "score: 4. matches the page"
    text = canonical_reply("reflection", '{"information_conflict": "poor", "tool_effectiveness": "good", '
                                         '"trajectory_monitoring": "average", "comment": "wrong name"}')
    assert text == ("information conflict: poor; tool effectiveness: good; trajectory monitoring: average; "
                    "wrong name") and reflection_wants_replan(text)
    assert canonical_reply("verification", " score: 2. no ") == "score: 2. no"
    # every schema is strict-mode shaped: all properties required, nothing else allowed
    for schema in ROLE_SCHEMAS.values():
        assert set(schema["required"]) == set(schema["properties"]) and schema["additionalProperties"] is False


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
