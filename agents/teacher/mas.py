"""The teacher multi-agent loop: the thinking agent coordinates, the others act, everything goes to a MASLog.

Loop (one agent call per step, stopped by a verified answer or `max_steps`):
    thinking -> NEXT planning   : planning writes / rewrites the plan
             -> NEXT search|crawl|code : the tool agent turns the thought (intent) into a call, the ToolBox runs
                                  it, the agent reads the result
             -> NEXT reflection : reflection scores the latest step; any "poor" -> planning re-plans at once
             -> NEXT answer     : the suggested answer goes to verification; score >= 3 -> final answer,
                                  <= 2 -> planning re-plans
This mirrors the AFM prompt rules (after a suggested answer only a double_check; poor reflection or a low
double_check score -> re-plan), so a log converts into a valid Chain-of-Agents trajectory.
A role reply that does not parse (agents.teacher.protocol) is re-asked up to `parse_retries[role]` times; the
re-asks count toward `max_steps`. Still unparseable: no NEXT -> the coordinator is asked again next turn, no
score -> not verified (re-plan), no aspect -> no re-plan; each counted in `MASLog.parse_failures`.

Usage:
    cfg = TeacherConfig()
    backend = ScriptedOracleBackend(OracleKnowledge(problems), cfg.mistake_rate, cfg.reflection_rate, seed=0)
    log = run_mas(problem, backend, toolbox, cfg, log_id="p1#0")
(`distill.rollout_work.RolloutWorker` builds the backend the config names for each rollout.)
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from afm.config import Config
from agents.teacher.agents import (
    CodeAgent, CrawlAgent, PlanningAgent, ReflectionAgent, SearchAgent, ThinkingAgent, ToolAgent, VerificationAgent,
)
from agents.teacher.backends import Completion, LLMBackend, OpenAIClientConfig
from agents.teacher.log import MASEvent, MASLog, ToolCall
from agents.teacher.protocol import canonical_reply, check_passes, reflection_wants_replan, reply_parses
from problems.records import Problem


class TeacherConfig(Config):
    """The teacher MAS and its LLM backend."""

    max_steps: int = Field(40, ge=3, description="Agent-call budget per problem (re-asks included), checked before "
                                                 "each coordinator turn (one turn makes at most 3 calls plus their "
                                                 "re-asks, so a run may end that much over)")
    observation_chars: int = Field(400, ge=20, description="Observation characters shown to agents in the state")
    backend: Literal["oracle", "openai", "local"] = Field(
        "oracle", description="oracle: scripted solver for generated families (offline); openai: any "
                              "OpenAI-compatible endpoint (vLLM, Ray Serve, a hosted API); local: the model at "
                              "model_path through models.engines.HFEngine")
    mistake_rate: float = Field(0.35, ge=0.0, le=1.0,
                                description="Oracle: probability that a rollout contains one realistic mistake")
    reflection_rate: float = Field(0.3, ge=0.0, le=1.0,
                                   description="Oracle: probability of a reflection after a tool result that "
                                               "looked fine (after a bad one it always reflects)")
    endpoint: str = Field("http://127.0.0.1:8000/v1", description="openai: base URL of the chat endpoint")
    model: str = Field("teacher", description="openai: model name sent to the endpoint")
    model_path: str = Field("", description="local: save_pretrained directory or s3:// artifact of the model")
    api_key_env: str = Field("OPENAI_API_KEY", description="openai: env var holding the API key ('EMPTY' if unset)")
    temperature: float = Field(0.7, ge=0.0, description="openai/local: sampling temperature")
    max_tokens: int = Field(512, ge=8, description="openai/local: completion token cap per agent call")
    client: OpenAIClientConfig = Field(default_factory=OpenAIClientConfig,
                                       description="openai: timeouts, retries, concurrency per endpoint, "
                                                   "structured output, API key source")
    parse_retries: dict[str, int] = Field(
        default_factory=lambda: {"thinking": 2, "verification": 1, "reflection": 1},
        description="Re-asks per call when a role's reply does not parse (thinking: no known NEXT agent; "
                    "verification: no score; reflection: no aspect scored). Retries are agent calls and count "
                    "toward max_steps and the token counts; what is still unparseable is counted in the log")
    seed: int = Field(0, description="Base seed; each (problem, sample) derives its own")


class _Run:
    """The mutable state of one MAS run: the agents and the event log."""

    def __init__(self, problem: Problem, backend: LLMBackend, cfg: TeacherConfig):
        q, n = problem.question, cfg.observation_chars
        self.thinking = ThinkingAgent(backend, q, n)
        self.planning = PlanningAgent(backend, q, n)
        self.reflection = ReflectionAgent(backend, q, n)
        self.verification = VerificationAgent(backend, q, n)
        self.tools: dict[str, ToolAgent] = {"search": SearchAgent(backend, q, n), "crawl": CrawlAgent(backend, q, n),
                                            "code": CodeAgent(backend, q, n)}
        self.events: list[MASEvent] = []
        self.retries = cfg.parse_retries
        self.parse_retries: dict[str, int] = {}  # role -> re-asks used
        self.parse_failures: dict[str, int] = {}  # role -> replies still unparseable after the re-asks

    def count_protocol(self, role: str, text: str, retries_used: int) -> None:
        if retries_used:
            self.parse_retries[role] = self.parse_retries.get(role, 0) + retries_used
        if not reply_parses(role, text):
            self.parse_failures[role] = self.parse_failures.get(role, 0) + 1

    def record(self, agent: str, role: str, content: str, completion: Completion | None,
               tool_call: ToolCall | None = None, observation: str | None = None) -> MASEvent:
        event = MASEvent(step=len(self.events), agent=agent, role=role, content=content, tool_call=tool_call,
                         observation=observation,
                         prompt_tokens=completion.prompt_tokens if completion else 0,
                         completion_tokens=completion.completion_tokens if completion else 0)
        self.events.append(event)
        return event

    def plan(self) -> None:
        completion, _ = self.planning.run(self.events)
        self.record("planning", "planning", completion.text.strip(), completion)

    def ask_role(self, agent: ReflectionAgent | VerificationAgent) -> str:
        """Run a scored role agent (within its retry budget), record its reply, return the reply text."""
        completion, used = agent.run(self.events, self.retries.get(agent.name, 0))
        self.count_protocol(agent.name, completion.text, used)
        self.record(agent.name, agent.name, canonical_reply(agent.name, completion.text), completion)
        return completion.text

    def last_observation(self) -> str:
        for ev in reversed(self.events):
            if ev.observation is not None:
                return ev.observation
        return ""

    def agent_calls(self) -> int:
        # a re-asked reply is one event but several calls: each attempt counts toward the budget
        return sum(1 for e in self.events if e.prompt_tokens or e.completion_tokens) + sum(self.parse_retries.values())


def run_mas(problem: Problem, backend: LLMBackend, toolbox, cfg: TeacherConfig, log_id: str | None = None,
            sample_idx: int = 0) -> MASLog:
    """Solve `problem` with the agent team; `toolbox.call(tag, argument) -> ToolResult` runs the tools."""
    run = _Run(problem, backend, cfg)
    suggested, verified = "", False
    while run.agent_calls() < cfg.max_steps:
        completion, decision, used = run.thinking.decide(run.events, run.retries.get("thinking", 0))
        run.count_protocol("thinking", completion.text, used)
        run.record("thinking", "thinking", decision.thought, completion)
        nxt = decision.next_agent
        if nxt == "planning":
            run.plan()
        elif nxt in run.tools:
            agent = run.tools[nxt]
            call_completion, call = agent.make_call(decision.thought, run.last_observation())
            result = toolbox.call(call.tag, call.argument)
            agent.read(result.text)
            run.record(nxt, nxt, call_completion.text.strip(), call_completion, tool_call=call,
                       observation=result.text)
        elif nxt == "reflection":
            if reflection_wants_replan(run.ask_role(run.reflection)):
                run.plan()
        elif nxt == "answer":
            suggested = (decision.answer or decision.thought).strip()
            run.record("thinking", "answer", suggested, None)  # tokens already counted on the thought
            # an unparseable score (after the retries) is not a verification: counted, then re-planned
            if check_passes(run.ask_role(run.verification)):
                run.record("answer", "answer", suggested, None)
                verified = True
                break
            run.plan()
        # An unparseable NEXT (after the retries) leaves only the thought in the log, counted in parse_failures;
        # the coordinator is asked again.
    return MASLog(
        log_id=log_id or problem.id, problem_id=problem.id, question=problem.question, family=problem.family,
        events=run.events, final_answer=suggested, verified=verified, teacher=backend.name, sample_idx=sample_idx,
        parse_retries=run.parse_retries, parse_failures=run.parse_failures,
    )
