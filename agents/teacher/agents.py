"""The teacher's agents: role agents (thinking, planning, reflection, verification) and tool agents (search,
crawl, code). Each is a small class with its own system prompt and its own message history; every call goes
through an `LLMBackend` with the agent's name, so a backend can answer in role.

Message protocol (what each agent asks for and how its reply is parsed):
- Every state snapshot is rendered by `render_events` as one line per event: `[role] text`, with tool calls as
  `[search] web_search "<json argument>"` and observations as `[observation] "<json text>"` (JSON keeps
  multi-line code and tool output on one parseable line).
- thinking: reply `<thought>` then a line `NEXT: planning|search|crawl|code|reflection|answer`; with
  `NEXT: answer` a line `ANSWER: <answer>`. The thought is the intent handed to a tool agent.
- planning: a short numbered plan.  reflection: `information conflict: good|average|poor; tool effectiveness: ...;
  trajectory monitoring: ...` plus a comment; any poor -> re-plan.  verification: `score: 1-4` plus a comment;
  <= 2 -> re-plan, >= 3 -> answer.
- search: the query only.  crawl: one or more URLs separated by `|`.  code: one ```python fenced block.
Replies are read by `agents.teacher.protocol` (tolerant of markdown, case, prose, fences and JSON; or JSON the
server enforced when the backend's `structured` flag is on). A role reply that does not parse is re-asked
within the role's retry budget (`Agent.ask_parsed`).

Usage: see `agents.teacher.mas.run_mas`, which wires these together.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from agents.teacher.backends import Completion, LLMBackend
from agents.teacher.log import MASEvent, ToolCall
from agents.teacher.protocol import (
    JSON_INSTRUCTIONS, RETRY_HINTS, ROLE_SCHEMAS, ThinkDecision, one_line, parse_think, reply_parses,
)

EVENT_LINE_TAGS = {
    "thinking": "think", "planning": "plan", "reflection": "reflection", "verification": "double_check",
    "answer": "suggested_answer", "search": "search", "crawl": "crawl", "code": "code",
}

_FENCE_RE = re.compile(r"```(?:python|py)[ \t]*\n.*?```", re.S)


def render_events(events: list[MASEvent], observation_chars: int) -> str:
    """The state as agents read it: one line per event (tool calls and observations JSON-quoted)."""
    lines = []
    for ev in events:
        tag = EVENT_LINE_TAGS[ev.role]
        if ev.tool_call is not None:
            lines.append(f"[{tag}] {ev.tool_call.tag} {json.dumps(ev.tool_call.argument)}")
            lines.append(f"[observation] {json.dumps(ev.observation[:observation_chars])}")
        else:
            lines.append(f"[{tag}] {one_line(ev.content)}")
    return "\n".join(lines)


class Agent:
    """One agent: a name, a system prompt and its own message history, sent in full on every call.

    Prompts are append-only: the system prompt (fixed per role and backend) comes first and every call adds
    turns at the end, so a server's prefix cache reuses everything sent before (vLLM automatic prefix caching,
    hosted prompt caching). Agents of one role share the same system prompt across problems."""

    name = ""
    system_prompt = ""

    def __init__(self, backend: LLMBackend):
        self.backend = backend
        prompt = self.system_prompt
        if backend.structured and self.name in JSON_INSTRUCTIONS:
            prompt += " " + JSON_INSTRUCTIONS[self.name]
        self.messages: list[dict[str, str]] = [{"role": "system", "content": prompt}]

    def ask(self, user_text: str, stop: list[str] | None = None) -> Completion:
        self.messages.append({"role": "user", "content": user_text})
        completion = self.backend.complete(self.name, list(self.messages), stop, schema=ROLE_SCHEMAS.get(self.name))
        self.messages.append({"role": "assistant", "content": completion.text})
        return completion

    def ask_parsed(self, user_text: str, retries: int) -> tuple[Completion, int]:
        """Ask, and re-ask up to `retries` times while the reply does not parse for this role. Returns the last
        reply with the tokens of every attempt (they were all spent) and the number of retries used. The failed
        replies stay in the history: the model sees what it wrote and why it is asked again."""
        completion, used = self.ask(user_text), 0
        while used < retries and not reply_parses(self.name, completion.text):
            used += 1
            again = self.ask(RETRY_HINTS[self.name])
            completion = Completion(again.text, completion.prompt_tokens + again.prompt_tokens,
                                    completion.completion_tokens + again.completion_tokens)
        return completion, used


class ThinkingAgent(Agent):
    name = "thinking"
    system_prompt = (
        "You are the thinking agent, the coordinator of a team that answers questions with tools. You keep the "
        "state and decide who acts next. Write one short thought (copy exact names from the question and the "
        "observations), then a line 'NEXT: <agent>' with agent one of planning, search, crawl, code, reflection, "
        "answer. For search write the query in double quotes; for crawl write the URL; with 'NEXT: answer' add a "
        "line 'ANSWER: <answer>'."
    )

    def __init__(self, backend: LLMBackend, question: str, observation_chars: int):
        super().__init__(backend)
        self.question = question
        self.observation_chars = observation_chars
        self.seen = 0  # events already shown to this agent

    def decide(self, events: list[MASEvent], retries: int) -> tuple[Completion, ThinkDecision, int]:
        # Only events it has not seen; its own thoughts are already in its history as assistant turns.
        new = [e for e in events[self.seen:] if e.role != "thinking"]
        self.seen = len(events)
        if len(self.messages) == 1:
            user = f"Question: {self.question}\nWhat next?"
        else:
            user = f"New events:\n{render_events(new, self.observation_chars)}\nWhat next?"
        completion, used = self.ask_parsed(user, retries)
        return completion, parse_think(completion.text), used


class StateAgent(Agent):
    """A role agent that reads a snapshot of the whole state (question + every event) on each call."""

    request = ""

    def __init__(self, backend: LLMBackend, question: str, observation_chars: int):
        super().__init__(backend)
        self.question = question
        self.observation_chars = observation_chars

    def run(self, events: list[MASEvent], retries: int = 0) -> tuple[Completion, int]:
        state = render_events(events, self.observation_chars)
        return self.ask_parsed(f"Question: {self.question}\nState:\n{state}\n{self.request}", retries)


class PlanningAgent(StateAgent):
    name = "planning"
    system_prompt = ("You are the planning agent. Decompose the question into short numbered steps (one tool "
                     "action each, naming an entity only once it is known), ending with the answer step. If a plan exists, "
                     "re-plan from what is known. Be brief.")
    request = "Write the plan."


class ReflectionAgent(StateAgent):
    name = "reflection"
    system_prompt = ("You are the reflection agent. Check the latest tool result against the question and the "
                     "earlier findings. Score each of information conflict, tool effectiveness and trajectory "
                     "monitoring as good, average or poor, as 'aspect: score;', then one short sentence.")
    request = "Reflect on the latest step."


class VerificationAgent(StateAgent):
    name = "verification"
    system_prompt = ("You are the verification agent. Double-check the suggested answer against the question and "
                     "the observations. Reply 'score: N.' with N from 1 (wrong) to 4 (certain), then one short "
                     "sentence. 3 or more means the answer is final.")
    request = "Double-check the suggested answer."


class ToolAgent(Agent):
    """Turns the coordinator's intent into one tool call and keeps the results it read in its history."""

    tag = ""

    def __init__(self, backend: LLMBackend, question: str, observation_chars: int):
        super().__init__(backend)
        self.question = question
        self.observation_chars = observation_chars

    def make_call(self, intent: str, context: str) -> tuple[Completion, ToolCall]:
        user = f"Question: {self.question}\nIntent: {intent}"
        if context:
            user += f"\nLatest observation: {json.dumps(context[:self.observation_chars])}"
        completion = self.ask(user + f"\nWrite the {self.tag} argument only.")
        return completion, ToolCall(self.tag, self.argument_from(completion.text))

    def read(self, observation: str) -> None:
        # The agent keeps what it saw: its next call (a retry, say) is made knowing this result.
        self.messages.append({"role": "user", "content": f"Result: {observation[:self.observation_chars]}"})
        self.messages.append({"role": "assistant", "content": "Noted."})

    def argument_from(self, text: str) -> str:
        # A chatty model wraps the query: a fence, a "Query:" label, quotes or bold. Keep the query only.
        fenced = re.search(r"```[\w-]*\s*\n?(.*?)```", text, re.S)
        line = one_line(fenced.group(1) if fenced else text)
        line = re.sub(r"^[*_`#\s]*(?:search\s+)?query[*_`\s]*:[*_`\s]*", "", line, flags=re.I)
        return line.strip().strip("*`").strip().strip('"')


class SearchAgent(ToolAgent):
    name = "search"
    tag = "web_search"
    system_prompt = "You are the search agent. Turn the intent into one short web search query. Reply with the query only."


class CrawlAgent(ToolAgent):
    name = "crawl"
    tag = "crawl_page"
    system_prompt = ("You are the crawl agent. Turn the intent into the URL(s) of the page(s) to read, separated "
                     "by '|'. Reply with the URLs only.")

    def argument_from(self, text: str) -> str:
        urls = re.findall(r"https?://[^\s|\"')\]]+", text)
        return "|".join(dict.fromkeys(u.rstrip(".,;") for u in urls)) if urls else one_line(text)


class CodeAgent(ToolAgent):
    name = "code"
    tag = "code"
    system_prompt = ("You are the code agent. Write Python that computes what the intent asks and prints the "
                     "result. Reply with exactly one ```python fenced block.")

    def argument_from(self, text: str) -> str:
        m = _FENCE_RE.search(text)
        return m.group(0) if m else f"```python\n{text.strip()}\n```"
