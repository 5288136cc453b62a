"""ScriptedOracleBackend: an offline teacher LLM for the generated families (multihop world, computation).

It knows each problem's solution path (`problem.metadata["solution"]`) and answers every agent in role, from the
messages that agent was sent: it finds the question, replays the rendered event lines (tool calls,
observations, reflections, double_checks, suggested answers) to see how far the team got, and writes the reply
that agent's prompt asks for. It never bypasses the agents: the coordinator's thought names the entity or URL,
the search / crawl agents copy it into the call, the code agent writes the block.

Text is SHORT and templated and copies names from the question and observations, so a ~1M-parameter student can
learn to copy a name into its next query (e.g. think `Zarno was directed by Kell Brin. Search "Kell Brin".`).

Mistakes (so error-correction trajectories exist): with probability `mistake_rate` a rollout contains exactly
one, drawn from those that fit the problem:
- wrong_entity (multihop, a later hop): the coordinator searches a distractor name; reflection scores
  information conflict poor -> re-plan -> the right search.
- bad_query (multihop): the coordinator asks for a vague query without the name (the search agent copies it, so
  thought and query always agree); reflection scores tool effectiveness poor -> re-plan -> retry.
- wrong_answer (multihop): the coordinator suggests a distractor answer; double_check scores 2 -> re-plan ->
  redo the last step (re-read the page, or re-run a comparison's code) -> the right answer.
- slip (computation): the code agent writes the off-by-one variant; double_check scores 2 -> re-plan -> fixed code.
All choices are drawn from `random.Random(f"{seed}:{question}...")`, so the oracle is stateless: the same
seed, problem and state give the same reply. Give each (problem, sample) its own seed.

The `direct` agent (used by RL problem selection) is a no-tool baseline: it does NOT use the solution; it answers
with what the question text alone offers (the first capitalised name, or the largest number), which is what a
model that never saw the invented world could do.

Usage:
    knowledge = OracleKnowledge(problems)
    backend = ScriptedOracleBackend(knowledge, mistake_rate=0.3, reflection_rate=0.3, seed=7)
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field

from agents.teacher.answers import answer_matches
from agents.teacher.backends import Completion, estimate_message_tokens, estimate_tokens
from agents.teacher.protocol import check_passes
from problems.records import Problem

_QUESTION_RE = re.compile(r"^Question: (.*)$", re.M)
_LINE_RE = re.compile(r"^\[(\w+)\] (.*)$")
_QUOTED_RE = re.compile(r'Search "(.+?)"')
_INTENT_RE = re.compile(r"^Intent: (.*)$", re.M)
_URL_RE = re.compile(r"https?://[^\s|\"')\]]+")
_CAPITALISED_RE = re.compile(r"\b[A-Z][a-z]+(?: [A-Z][a-z]+)*")
_NUMBER_RE = re.compile(r"-?\d+")


class OracleKnowledge:
    """The problems the oracle can solve, indexed by question text."""

    def __init__(self, problems: list[Problem]):
        self.by_question: dict[str, Problem] = {}
        for p in problems:
            if "solution" not in p.metadata:
                raise ValueError(f"problem {p.id!r} ({p.family}): metadata has no 'solution'; the scripted oracle "
                                 "only solves generated families (multihop, computation)")
            self.by_question[p.question] = p

    def lookup(self, messages: list[dict[str, str]]) -> Problem:
        for m in messages:
            found = _QUESTION_RE.search(m["content"])
            if found and found.group(1) in self.by_question:
                return self.by_question[found.group(1)]
        raise ValueError("ScriptedOracleBackend: no known 'Question: ...' line in the messages; the oracle answers "
                         "only problems it was built with")


@dataclass
class Belief:
    """What the oracle reads from the rendered state."""

    pos: int = 0  # index of the next solution step to do
    pending_miss: str | None = None  # argument of the last call when it missed the expected step (not yet reflected)
    slipped: bool = False  # the last code call was the slip variant, not yet rejected
    has_plan: bool = False
    reflected_since_call: bool = True
    mistakes_seen: int = 0
    last_line: str = ""
    suggested: list[str] = field(default_factory=list)


def _event_lines(messages: list[dict[str, str]]) -> list[tuple[str, str]]:
    out = []
    for m in messages:
        if m["role"] != "user":
            continue
        for line in m["content"].splitlines():
            found = _LINE_RE.match(line)
            if found:
                out.append((found.group(1), found.group(2)))
    return out


@dataclass
class MistakePlan:
    kind: str | None = None  # wrong_entity | bad_query | wrong_answer | slip
    step: int = -1  # the solution step it happens at (-1: at the answer)
    distractor: str = ""


class ScriptedOracleBackend:
    def __init__(self, knowledge: OracleKnowledge, mistake_rate: float, reflection_rate: float, seed: int):
        self.knowledge = knowledge
        self.mistake_rate = mistake_rate
        self.reflection_rate = reflection_rate
        self.seed = seed
        self.name = f"oracle(mistake_rate={mistake_rate})"
        self.structured = False  # it writes the line protocol itself
        self.max_concurrency = 1  # pure Python under the GIL: threads would not make it faster

    # ------------------------------------------------------------------ the interface
    def complete(self, agent: str, messages: list[dict[str, str]], stop: list[str] | None,
                 schema: dict | None = None) -> Completion:
        problem = self.knowledge.lookup(messages)
        replies = {"thinking": self._thinking, "planning": self._planning, "reflection": self._reflection,
                   "verification": self._verification, "search": self._search, "crawl": self._crawl,
                   "code": self._code}
        if agent == "direct":
            text = _direct_answer(problem.question)
        elif agent in replies:
            text = replies[agent](problem, messages)
        else:
            raise ValueError(f"ScriptedOracleBackend: unknown agent {agent!r}; it plays {sorted(replies)} and 'direct'")
        return Completion(text, estimate_message_tokens(messages), estimate_tokens(text))

    # ------------------------------------------------------------------ state reading
    def _plan_for(self, problem: Problem) -> MistakePlan:
        rng = random.Random(f"{self.seed}:{problem.question}:mistake")
        if rng.random() >= self.mistake_rate:
            return MistakePlan()
        sol = problem.metadata["solution"]
        steps = sol["steps"]
        options: list[MistakePlan] = []
        if "slip" in sol:
            options.append(MistakePlan("slip", 0))
        # a distractor that is itself a step's entity would be a repeat, not a wrong entity
        names = [d for d in sol.get("distractors", [])
                 if not _NUMBER_RE.fullmatch(d) and d not in {s["argument"] for s in steps}]
        searches = [i for i, s in enumerate(steps) if s["tool"] == "web_search"]
        if searches:
            options.append(MistakePlan("bad_query", rng.choice(searches)))
        if names and [i for i in searches if i > 0]:
            options.append(MistakePlan("wrong_entity", rng.choice([i for i in searches if i > 0]), rng.choice(names)))
        if sol.get("distractors"):
            options.append(MistakePlan("wrong_answer", -1, rng.choice(sol["distractors"])))
        return rng.choice(options) if options else MistakePlan()

    def _belief(self, problem: Problem, messages: list[dict[str, str]]) -> Belief:
        sol = problem.metadata["solution"]
        steps, slip = sol["steps"], sol.get("slip")
        b = Belief()
        for tag, rest in _event_lines(messages):
            b.last_line = tag
            if tag in ("search", "crawl", "code"):
                tool, arg = rest.split(" ", 1)
                arg = json.loads(arg)
                step = steps[b.pos] if b.pos < len(steps) else None
                b.reflected_since_call = False
                if step and tool == step["tool"] and arg == step["argument"]:
                    b.pos, b.pending_miss, b.slipped = b.pos + 1, None, False
                elif step and slip and tool == "code" and arg == slip["argument"]:
                    b.pos, b.slipped = b.pos + 1, True
                    b.mistakes_seen += 1
                else:
                    b.pending_miss = arg
                    b.mistakes_seen += 1
            elif tag == "reflection":
                b.reflected_since_call = True
                if "poor" in rest:
                    b.pending_miss = None
            elif tag == "plan":
                b.has_plan = True
            elif tag == "suggested_answer":
                b.suggested.append(rest)
            elif tag == "double_check" and not check_passes(rest):
                # the suggested answer was wrong: go back and redo the step that produced it
                b.pos, b.slipped = max(b.pos - 1, 0), False
                b.mistakes_seen += 1
        return b

    def _rng(self, problem: Problem, messages: list[dict[str, str]], what: str) -> random.Random:
        return random.Random(f"{self.seed}:{problem.question}:{what}:{sum(len(m['content']) for m in messages)}")

    # ------------------------------------------------------------------ role agents
    def _thinking(self, problem: Problem, messages: list[dict[str, str]]) -> str:
        sol = problem.metadata["solution"]
        steps = sol["steps"]
        b = self._belief(problem, messages)
        plan = self._plan_for(problem)
        if not b.has_plan:
            first = steps[0]
            thought = f"Start from {first['argument']}." if first["tool"] == "web_search" else "Compute it with code."
            return f"{thought}\nNEXT: planning"
        if b.pending_miss is not None:
            return f"Check the result of {b.pending_miss}.\nNEXT: reflection"
        if (b.last_line == "observation" and not b.reflected_since_call
                and self._rng(problem, messages, "reflect").random() < self.reflection_rate):
            # routing only, no thought: the student learns to open <reflection> right after an observation
            return "NEXT: reflection"
        if b.pos < len(steps):
            step = steps[b.pos]
            before = steps[b.pos - 1]["finding"] + " " if b.pos > 0 else ""
            if step["tool"] == "web_search":
                target = step["argument"]
                if plan.step == b.pos and b.mistakes_seen == 0:
                    if plan.kind == "wrong_entity":
                        target = plan.distractor
                    elif plan.kind == "bad_query":
                        target = _vague_query(problem.question)
                return f'{before}Search "{target}".\nNEXT: search'
            if step["tool"] == "crawl_page":
                return f"{before}Read {step['argument']}.\nNEXT: crawl"
            if problem.family == "multihop":  # a comparison's last step: the two values go into code
                return f"{before}Compare them with code.\nNEXT: code"
            fix = f"Fix the code: {sol['slip']['why']}. " if b.mistakes_seen and "slip" in sol else ""
            return f"{fix}Write code to compute it.\nNEXT: code"
        answer = problem.answers[0]
        if b.slipped:
            answer = sol["slip"]["finding"]
        elif plan.kind == "wrong_answer" and b.mistakes_seen == 0:
            return f"The answer seems to be {plan.distractor}.\nNEXT: answer\nANSWER: {plan.distractor}"
        finding = steps[-1]["finding"] if problem.family != "computation" else f"The code printed {answer}."
        return f"{finding} So the answer is {answer}.\nNEXT: answer\nANSWER: {answer}"

    def _planning(self, problem: Problem, messages: list[dict[str, str]]) -> str:
        # No foresight: the plan names only entities the planner was shown (question, observations so far) and
        # leaves out crawls (whether a fact is only in a page's body shows once its snippet is read). Naming the
        # next hop's entity before it was found taught the student to invent names instead of reading them.
        b = self._belief(problem, messages)
        shown = messages[-1]["content"]
        items = []
        for step in problem.metadata["solution"]["steps"][b.pos:]:
            if step["tool"] == "web_search":
                known = step["argument"] in shown
                items.append(f"search {step['argument']}" if known else "search the name found")
            elif step["tool"] == "code":
                items.append("compute with code")
        items.append("answer")
        text = " ".join(f"{i}. {item}." for i, item in enumerate(items, 1))
        return f"Re-plan: {text}" if b.has_plan else text

    def _reflection(self, problem: Problem, messages: list[dict[str, str]]) -> str:
        b = self._belief(problem, messages)
        steps = problem.metadata["solution"]["steps"]
        if b.pending_miss is not None:
            expected = steps[b.pos]["argument"] if b.pos < len(steps) else problem.answers[0]
            if b.pending_miss in problem.metadata["solution"].get("distractors", []):
                return (f"information conflict: poor; tool effectiveness: good; trajectory monitoring: average. "
                        f"The result is about {b.pending_miss}, not {expected}.")
            return (f"information conflict: average; tool effectiveness: poor; trajectory monitoring: average. "
                    f"The query missed {expected}.")
        done = steps[b.pos - 1]["finding"] if b.pos > 0 else "Nothing found yet."
        return f"information conflict: good; tool effectiveness: good; trajectory monitoring: good. {done}"

    def _verification(self, problem: Problem, messages: list[dict[str, str]]) -> str:
        b = self._belief(problem, messages)
        suggested = b.suggested[-1] if b.suggested else ""
        if answer_matches(suggested, problem.answers):
            return f"score: 4. {suggested} matches the findings."
        sol = problem.metadata["solution"]
        if "slip" in sol:
            return f"score: 2. Recheck the code: {sol['slip']['why']}."
        return f"score: 2. The findings say {sol['steps'][-1]['finding']} Not {suggested}."

    # ------------------------------------------------------------------ tool agents
    def _own_intents(self, messages: list[dict[str, str]]) -> list[str]:
        found = (_INTENT_RE.search(m["content"]) for m in messages if m["role"] == "user")
        return [f.group(1) for f in found if f]

    def _search(self, problem: Problem, messages: list[dict[str, str]]) -> str:
        intent = self._own_intents(messages)[-1]
        quoted = _QUOTED_RE.search(intent)
        return quoted.group(1) if quoted else intent

    def _crawl(self, problem: Problem, messages: list[dict[str, str]]) -> str:
        urls = _URL_RE.findall(self._own_intents(messages)[-1])
        return "|".join(u.rstrip(".,;") for u in urls)

    def _code(self, problem: Problem, messages: list[dict[str, str]]) -> str:
        sol = problem.metadata["solution"]
        if self._plan_for(problem).kind == "slip" and len(self._own_intents(messages)) == 1:
            return sol["slip"]["argument"]
        return next(s["argument"] for s in sol["steps"] if s["tool"] == "code")


def _vague_query(question: str) -> str:
    """The question without its names: the kind of query that finds nothing specific."""
    words = [w for w in question.rstrip("?.").split()[1:] if not w[:1].isupper()]
    return " ".join(words) or question


def _direct_answer(question: str) -> str:
    numbers = _NUMBER_RE.findall(question)
    if numbers:
        return max(numbers, key=lambda n: int(n))
    names = _CAPITALISED_RE.findall(question.split(" ", 1)[-1])
    return names[0] if names else ""
