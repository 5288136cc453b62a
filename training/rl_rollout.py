"""Multi-turn Chain-of-Agents rollouts for agentic RL: G episodes per prompt, real tools, token-in/token-out.

One episode: the policy generates from `prompt_ids + response_ids` until it closes a tool call (`</code>`,
`</web_search>`, ...) or `</answer>`; on a tool call the tool runs (`ToolBox.call(tag, argument)` with the text
inside the LAST open tag of that turn) and its observation ids (`encode_observation`: trusted observation
tags around untrusted tool text) are appended with loss mask 0; repeat until an answer, `max_turns` turns or
the response token budget. The training sequence is exactly prompt + generated ids + inserted observation
ids — text is never re-tokenized — with the sampler's logprob for every generated token.

Batching: episodes generate together in one `engine.generate` call (`max_batch_size` splits it when memory is
tight; 1 gives naive one-at-a-time generation for benchmarks), and their tool calls run concurrently on
`tool_workers` threads: sandboxed programs and crawls wait on subprocesses and sockets, and a looping student
program costs its timeout once, not once per call in a row. With `async_turns` (default) there is no per-turn
barrier: an episode whose tool call returned generates again with the other ready episodes while slow calls
still run (`_run_async_turns`); without it, every turn waits for its slowest call (`_run_barrier_turns`; also
the simulated environment, which has no tool to wait for). Sampling is seeded per episode and turn
(`episode_seed`), so both schedules give the same episodes, and so does any split of a step's problems among
rollout actors (`prompt_indices`: the problems' indices in the step). Concurrent sandboxes share the sandbox
user's process limit: a fork bomb in one call can make another concurrent call fail to start; that call returns
a tool error like any other.

Simulated environment (AutoCoA's RL stage 1, `simulated_env=True`): no tool runs. When the policy closes a
tool call, the SAME engine continues the sequence after the observation's open tag and writes the observation
itself, up to `</observation>` (its implicit world model, learned in SFT stage 3). Those imagined tokens are
appended like a real observation: loss mask 0 and logprob 0.0, so they get no loss and no advantage. The calls
are recorded with status "simulated" (so real tool calls can be counted apart). All simulated observations of a
turn are generated in one batched call.

Safety: tool calls are parsed only from the text the policy generated in that turn, so tags or instructions
inside observations are never executed or counted as the model's answer; `Episode.model_text` (what rewards
score) holds generated text only. This does NOT stop a page from persuading the policy in plain words.

Usage:
    episodes = run_rollouts(engine, tokenizer, toolbox, problems, RolloutConfig(group_size=4), seed=0)
    imagined = run_rollouts(engine, tokenizer, toolbox, problems, RolloutConfig(simulated_env=True), seed=0)
    actor_share = run_rollouts(engine, tokenizer, toolbox, problems[4:8], cfg, seed=0, prompt_indices=range(4, 8))
    episodes[0].response_ids, episodes[0].loss_mask, episodes[0].status
"""
from __future__ import annotations

import hashlib
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from pydantic import Field
from transformers import PreTrainedTokenizerBase

from afm.config import Config
from agents.tools.base import ToolResult
from models.engines.base import Generation, GenerationEngine
from models.format import (
    OBSERVATION_CLOSE, OBSERVATION_OPEN, STOP_STRINGS, TOOL_TAGS, Segment, TrajectoryError, parse_segments,
)
from models.tokenizer import check_token_roundtrip, decode, encode_observation, encode_prompt
from problems.records import Problem

STATUSES = ("answered", "max_turns", "token_budget", "format_error")
_TOOL_CLOSE = {f"</{tag}>": tag for tag in TOOL_TAGS}
OBSERVATION_STOP = OBSERVATION_CLOSE.strip()  # "</observation>": where a simulated observation ends


class ToolCaller(Protocol):
    """What a rollout needs from `agents.tools.ToolBox`."""

    def call(self, tag: str, argument: str) -> ToolResult: ...


class RolloutConfig(Config):
    """How episodes are sampled."""

    group_size: int = Field(4, ge=1, description="Episodes per prompt (GRPO group size G; 8 on GPU as in AFM).")
    max_turns: int = Field(6, ge=1, description="Generation turns per episode (AFM: 25 web, 8 code).")
    max_new_tokens: int = Field(96, ge=1, description="Tokens one turn may generate before it is cut.")
    token_budget: int = Field(384, ge=1, description="Response tokens per episode, generated + observations.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (1.0 keeps rollout logprobs = policy logprobs).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_batch_size: int = Field(0, ge=0, description="Most sequences per generate call; 0 = all live episodes at once.")
    system_prompt: str | None = Field(None, description="System prompt; must be the one the policy was SFT'd with.")
    tool_workers: int = Field(4, ge=1, description="Threads running tool calls concurrently (1: one at a time).")
    check_roundtrip: bool = Field(False, description="Strict mode: raise if an answered episode's ids differ from re-tokenizing its text "
                                                     "(not for simulated_env: imagined observations are generated ids, not tokenized text).")
    async_turns: bool = Field(True, description="Each episode goes on as soon as its own tool call returns (no per-turn "
                                                "barrier waiting for the slowest call); False: every turn waits for all.")
    simulated_env: bool = Field(False, description="AutoCoA's simulated environment: no tool runs; the policy writes each observation "
                                                   "itself (up to </observation>, at most max_new_tokens), masked out of loss and advantages.")


@dataclass
class ToolCall:
    tag: str
    argument: str
    status: str
    seconds: float


@dataclass
class Episode:
    """One sampled episode. `response_ids`, `loss_mask` and `rollout_logprobs` are aligned (observation tokens:
    mask 0, logprob 0.0)."""

    problem: Problem
    prompt_index: int  # which prompt of the batch: the GRPO group
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)
    model_text: str = ""  # generated text only: what rewards read
    segments: list[Segment] = field(default_factory=list)  # generated turns parsed + observations, when parseable
    tool_calls: list[ToolCall] = field(default_factory=list)
    turns: int = 0
    status: str = ""  # one of STATUSES once finished
    generation_s: float = 0.0  # this episode's share of batched generation time
    tool_s: float = 0.0  # this episode's share of the wall time spent waiting on tool calls (tools run concurrently;
    # barrier: the turns' tool phases; async_turns: time blocked with no episode ready, split among the waiting)
    parse_ok: bool = True  # every generated turn parsed as CoA segments
    pieces: list[str] = field(default_factory=list, repr=False)  # decoded turns and observations, in order

    @property
    def response_text(self) -> str:
        """The decoded response, observations included (for logs and verl-style scoring)."""
        return "".join(self.pieces)


def _tool_argument(turn_text: str, tag: str) -> str | None:
    """Text inside the last `<tag>...</tag>` of a turn; None if the call was never opened. (The close tag is
    searched, not assumed to be the last characters: with a tokenizer whose tags are plain text the token
    that completes `</tag>` may carry a few more characters.)"""
    body = turn_text[: turn_text.rfind(f"</{tag}>")]
    start = body.rfind(f"<{tag}>")
    return None if start < 0 else body[start + len(tag) + 2:]


def _append_generated(ep: Episode, tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], logprobs: Sequence[float]) -> str:
    text = decode(tokenizer, ids)
    ep.response_ids += list(ids)
    ep.loss_mask += [1] * len(ids)
    ep.rollout_logprobs += list(logprobs)
    ep.model_text += text
    ep.pieces.append(text)
    if ep.parse_ok:
        try:
            ep.segments += parse_segments(text)
        except TrajectoryError:
            ep.parse_ok = False
    return text


def _append_observation(ep: Episode, tokenizer: PreTrainedTokenizerBase, observation: str, ids: list[int]) -> None:
    ep.response_ids += ids
    ep.loss_mask += [0] * len(ids)
    ep.rollout_logprobs += [0.0] * len(ids)
    ep.pieces.append(decode(tokenizer, ids))
    ep.segments.append(Segment("observation", observation))


def take_turn(ep: Episode, gen: Generation, tokenizer: PreTrainedTokenizerBase,
              cfg: RolloutConfig) -> tuple[str, str] | None:
    """Append one turn's generation to an episode; finish it, or return the (tag, argument) of its tool call."""
    remaining = cfg.token_budget - len(ep.response_ids)
    ids, logprobs = gen.token_ids[:remaining], gen.logprobs[:remaining]
    cut = len(ids) < len(gen.token_ids)
    text = _append_generated(ep, tokenizer, ids, logprobs)
    ep.turns += 1
    if cut:
        ep.status = "token_budget"
        return None
    if gen.stop == "</answer>":
        ep.status = "answered"
        return None
    if len(ep.response_ids) >= cfg.token_budget:
        ep.status = "token_budget"
        return None
    if gen.stop not in _TOOL_CLOSE:
        # Length cut within the turn, or eos without an answer.
        ep.status = "token_budget" if gen.finish_reason == "length" else "format_error"
        return None
    tag = _TOOL_CLOSE[gen.stop]
    argument = _tool_argument(text, tag)
    if argument is None:
        ep.status = "format_error"
        return None
    if ep.turns >= cfg.max_turns:
        ep.status = "max_turns"
        return None
    return tag, argument.strip()


def timed_tool_call(toolbox: ToolCaller, tag: str, argument: str) -> tuple[ToolResult, float]:
    started = time.perf_counter()
    result = toolbox.call(tag, argument)
    return result, time.perf_counter() - started


def append_tool_result(ep: Episode, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig, tag: str, argument: str,
                       result: ToolResult, seconds: float) -> None:
    """Record a tool call and append its observation (masked), unless it overflows the token budget."""
    ep.tool_calls.append(ToolCall(tag, argument, result.status, seconds))
    observation_ids = encode_observation(tokenizer, result.text)
    if len(ep.response_ids) + len(observation_ids) >= cfg.token_budget:
        ep.status = "token_budget"  # the tool ran, but its observation does not fit the episode's budget
        return
    _append_observation(ep, tokenizer, result.text, observation_ids)


def episode_seed(seed: int, ep: Episode, stream: str = "turn") -> int:
    """The sampling seed of an episode's next turn (or its next simulated observation, `stream="observation"`):
    a function of (seed, the problem's index in the step, the sample's index, the turn) only, so an episode
    samples the same tokens whichever batch, rollout actor or chunk it runs in."""
    key = f"{seed}/{ep.prompt_index}/{ep.sample_index}/{ep.turns}/{stream}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def simulate_observations(engine: GenerationEngine, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig,
                          calls: Sequence[tuple[Episode, tuple[str, str]]], seed: int) -> None:
    """The policy writes each call's observation: one batched generation from each episode's sequence plus the
    observation open tag, stopped at `</observation>`. Appended with mask 0 like a real one; an observation cut
    by `max_new_tokens` is closed with the full close tag so the sequence keeps the trajectory format."""
    if not calls:
        return
    open_ids = tokenizer(OBSERVATION_OPEN, add_special_tokens=False)["input_ids"]  # our own text: trusted
    gens = engine.generate(
        [ep.prompt_ids + ep.response_ids + open_ids for ep, _ in calls], max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature, top_p=cfg.top_p, stop=(OBSERVATION_STOP,),
        seed=[episode_seed(seed, ep, "observation") for ep, _ in calls],
    )
    for (ep, (tag, argument)), gen in zip(calls, gens):
        ep.tool_calls.append(ToolCall(tag, argument, "simulated", 0.0))
        imagined = decode(tokenizer, gen.token_ids)
        closed = gen.stop == OBSERVATION_STOP
        # the close tag's tail ("\n\n" after </observation>) is ours to add, as after a real observation
        tail = OBSERVATION_CLOSE[OBSERVATION_CLOSE.index(OBSERVATION_STOP) + len(OBSERVATION_STOP):] if closed else OBSERVATION_CLOSE
        ids = open_ids + list(gen.token_ids) + tokenizer(tail, add_special_tokens=False)["input_ids"]
        if len(ep.response_ids) + len(ids) >= cfg.token_budget:
            ep.status = "token_budget"
            continue
        body = imagined[:imagined.rfind(OBSERVATION_STOP)].removesuffix("\n") if closed else imagined
        _append_observation(ep, tokenizer, body, ids)


def advance_episode(
    ep: Episode, gen: Generation, tokenizer: PreTrainedTokenizerBase, toolbox: ToolCaller, cfg: RolloutConfig,
) -> None:
    """Apply one turn's generation to an episode: finish it or run its tool call."""
    call = take_turn(ep, gen, tokenizer, cfg)
    if call is not None:
        append_tool_result(ep, tokenizer, cfg, *call, *timed_tool_call(toolbox, *call))


def run_rollouts(
    engine: GenerationEngine,
    tokenizer: PreTrainedTokenizerBase,
    toolbox: ToolCaller,
    problems: Sequence[Problem],
    cfg: RolloutConfig,
    seed: int,
    prompt_indices: Sequence[int] | None = None,
) -> list[Episode]:
    """Sample `cfg.group_size` episodes for each problem; returns them grouped (prompt-major order).
    `prompt_indices`: the problems' indices in the whole step (default 0..n-1), kept as `Episode.prompt_index`.
    Every episode's sampling is seeded by (seed, prompt index, sample index, turn) (`episode_seed`): the
    episodes do not depend on which other problems share the call (up to float effects of batch shape)."""
    indices = list(prompt_indices) if prompt_indices is not None else list(range(len(problems)))
    if len(indices) != len(problems):
        raise ValueError(f"{len(indices)} prompt_indices for {len(problems)} problems")
    episodes: list[Episode] = []
    for p_index, problem in zip(indices, problems):
        prompt_ids = encode_prompt(tokenizer, problem.question, cfg.system_prompt)
        episodes += [Episode(problem, p_index, s, list(prompt_ids)) for s in range(cfg.group_size)]
    with ThreadPoolExecutor(max_workers=cfg.tool_workers, thread_name_prefix="rollout-tools") as pool:
        if cfg.async_turns and not cfg.simulated_env:
            _run_async_turns(engine, tokenizer, toolbox, episodes, cfg, seed, pool)
        else:
            _run_barrier_turns(engine, tokenizer, toolbox, episodes, cfg, seed, pool)
    if cfg.check_roundtrip:
        for ep in episodes:
            if ep.status == "answered" and ep.parse_ok:
                check_token_roundtrip(tokenizer, ep.prompt_ids, ep.response_ids, ep.segments)
    return episodes


def _generate_turn(engine: GenerationEngine, batch: Sequence[Episode], cfg: RolloutConfig, seed: int) -> list[Generation]:
    """One batched generation of the next turn of `batch`, each episode with its own seed for this turn."""
    return engine.generate(
        [ep.prompt_ids + ep.response_ids for ep in batch],
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
        stop=STOP_STRINGS, seed=[episode_seed(seed, ep) for ep in batch],
    )


def _run_barrier_turns(engine: GenerationEngine, tokenizer: PreTrainedTokenizerBase, toolbox: ToolCaller,
                       episodes: list[Episode], cfg: RolloutConfig, seed: int, pool: ThreadPoolExecutor) -> None:
    """The per-turn barrier (`async_turns=False`, and every simulated-env rollout): each turn, all live episodes
    generate (in `max_batch_size` chunks), then that chunk's tool calls run concurrently and the next turn
    waits for the slowest of them. `tool_s`: each episode's share of the chunk's tool-phase wall time."""
    while live := [ep for ep in episodes if not ep.status]:
        chunk = cfg.max_batch_size or len(live)
        for start in range(0, len(live), chunk):
            batch = live[start:start + chunk]
            started = time.perf_counter()
            gens = _generate_turn(engine, batch, cfg, seed)
            generated = time.perf_counter()
            # Only the tool calls run on the pool; tokenizer work stays on this thread. With encode and
            # decode on the pool too, the full test suite saw episodes differ from a serial run (a shared
            # fast tokenizer is not guaranteed thread-safe).
            calls = [(ep, call) for ep, gen in zip(batch, gens) if (call := take_turn(ep, gen, tokenizer, cfg))]
            if cfg.simulated_env:
                simulate_observations(engine, tokenizer, cfg, calls, seed=seed)
            else:
                results = list(pool.map(lambda item: timed_tool_call(toolbox, *item[1]), calls))
                for (ep, call), (result, seconds) in zip(calls, results):
                    append_tool_result(ep, tokenizer, cfg, *call, result, seconds)
            gen_share = (generated - started) / len(batch)
            tool_share = (time.perf_counter() - generated) / len(batch)
            for ep in batch:
                ep.generation_s += gen_share
                ep.tool_s += tool_share


# How long ready episodes may wait for more tool calls to return before they generate without them: a batch of
# one per returning call would lose batching (the rollout's speed on CPU), a long wait would be a barrier again.
ASYNC_BATCH_WAIT_S = 0.05


def _run_async_turns(engine: GenerationEngine, tokenizer: PreTrainedTokenizerBase, toolbox: ToolCaller,
                     episodes: list[Episode], cfg: RolloutConfig, seed: int, pool: ThreadPoolExecutor) -> None:
    """Run `episodes` to the end without a per-turn barrier (`async_turns`): whichever episodes are ready (new,
    or their tool call returned) generate together, at most `max_batch_size` per call, while the other
    episodes' tool calls still run on `pool`; their calls are submitted as futures, and when no episode is
    ready the loop blocks until at least one call returns (FIRST_COMPLETED). Ready episodes generate at once
    when they fill a batch or are at least as many as the calls still running, else after waiting at most
    ASYNC_BATCH_WAIT_S for more calls to return. Sampling is seeded per episode and turn, so the episodes are
    those of the barrier loop; only the order of work differs. Tokenizer work stays on this thread (only
    `toolbox.call` runs on the pool). `tool_s`: the wall time this loop was blocked on tool calls, split among
    the episodes whose calls were running, so the rollout's generation_s + tool_s still sum to about its wall
    time, as with the barrier; each call's own duration is `ToolCall.seconds`."""
    ready: list[Episode] = list(episodes)
    pending: dict[Future, tuple[Episode, tuple[str, str]]] = {}
    ready_since = time.perf_counter()
    while ready or pending:
        chunk = cfg.max_batch_size or len(ready) or 1
        waited = time.perf_counter() - ready_since
        if ready and (len(ready) >= min(chunk, len(pending)) or waited >= ASYNC_BATCH_WAIT_S):
            batch, ready = ready[:chunk], ready[chunk:]
            started = time.perf_counter()
            gens = _generate_turn(engine, batch, cfg, seed)
            share = (time.perf_counter() - started) / len(batch)
            for ep, gen in zip(batch, gens):
                ep.generation_s += share
                if call := take_turn(ep, gen, tokenizer, cfg):
                    pending[pool.submit(timed_tool_call, toolbox, *call)] = (ep, call)
            if not ready:
                ready_since = time.perf_counter()
            continue
        blocked = time.perf_counter()
        timeout = max(ASYNC_BATCH_WAIT_S - waited, 0.0) if ready else None
        done, _ = wait(list(pending), timeout=timeout, return_when=FIRST_COMPLETED)
        share = (time.perf_counter() - blocked) / len(pending)
        for ep, _call in pending.values():
            ep.tool_s += share
        for future in done:
            ep, call = pending.pop(future)
            result, seconds = future.result()
            append_tool_result(ep, tokenizer, cfg, *call, result, seconds)
            if not ep.status:
                if not ready:
                    ready_since = time.perf_counter()
                ready.append(ep)


@dataclass
class RolloutStats:
    episodes: int
    generated_tokens: int
    observation_tokens: int
    generation_s: float
    tool_s: float
    tool_calls_per_episode: float  # every call the policy made, simulated ones included (its action rate)
    status_counts: dict[str, int]
    real_tool_calls: int = 0  # calls a tool actually ran for (not simulated_env's imagined ones): the tool cost
    real_tool_calls_per_episode: float = 0.0


def rollout_stats(episodes: Sequence[Episode]) -> RolloutStats:
    """Totals for logging: token counts, time split, tool calls (all, and real ones) and finish statuses."""
    generated = sum(sum(ep.loss_mask) for ep in episodes)
    total = sum(len(ep.response_ids) for ep in episodes)
    real = sum(call.status != "simulated" for ep in episodes for call in ep.tool_calls)
    return RolloutStats(
        episodes=len(episodes),
        generated_tokens=generated,
        observation_tokens=total - generated,
        generation_s=sum(ep.generation_s for ep in episodes),
        tool_s=sum(ep.tool_s for ep in episodes),
        tool_calls_per_episode=sum(len(ep.tool_calls) for ep in episodes) / max(len(episodes), 1),
        status_counts={s: sum(ep.status == s for ep in episodes) for s in STATUSES},
        real_tool_calls=real,
        real_tool_calls_per_episode=real / max(len(episodes), 1),
    )
