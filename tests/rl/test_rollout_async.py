"""Asynchronous per-episode turns (training/rl_rollout.py `async_turns`): the same episodes as the per-turn
barrier, and an episode really goes on while another episode's tool call is still running.

    .venv/bin/python -m pytest tests/rl/test_rollout_async.py -q
"""
from __future__ import annotations

import threading

import pytest

from agents.tools.base import ToolResult
from agents.tools.toolbox import ToolboxConfig, build_toolbox
from models.engines.base import Generation
from models.engines.hf import HFEngine
from models.policy import load_policy
from models.tokenizer import decode
from tests.rl.addition_task import addition_problem
from training.rl_rollout import RolloutConfig, run_rollouts

PROBLEMS = [addition_problem(a, b) for a, b in [(2, 3), (4, 4), (7, 1), (5, 6)]]
CFG = RolloutConfig(group_size=3, max_turns=3, max_new_tokens=40, token_budget=200)


# --- scripted engine and tools: the schedule itself, in milliseconds -------------------------------------------

class ScriptedEngine:
    """Plays the policy: a `code` call first, then an answer once an observation is in context. Records each
    call's (question, turn) pairs and sets `fast_went_on` when the 4 + 4 episode generates its second turn."""

    def __init__(self, tokenizer):
        self.tok, self.calls, self.fast_went_on = tokenizer, [], threading.Event()

    def _gen(self, text: str, stop: str) -> Generation:
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        return Generation(ids, [-0.5] * len(ids), text, "stop", stop)

    def generate(self, prompts, *, max_new_tokens, temperature=1.0, top_p=1.0, stop=(), seed=None):
        assert isinstance(seed, list) and len(seed) == len(prompts)  # one seed per episode
        out, call = [], []
        for ids in prompts:
            text = decode(self.tok, ids)
            a, b = (int(x) for x in text.split("What is ")[1].split("?")[0].split(" plus "))
            if "<observation>" in text:
                call.append((a, b, 2))
                if (a, b) == (4, 4):
                    self.fast_went_on.set()
                out.append(self._gen(f"<answer>{a + b}</answer>", "</answer>"))
            else:
                call.append((a, b, 1))
                out.append(self._gen(f"<code>print({a}+{b})</code>", "</code>"))
        self.calls.append(call)
        return out


class SlowFirstProblemTools:
    """`print(2+3)` blocks until the engine has generated the 4 + 4 episode's next turn (or `patience` s pass);
    every other call returns at once. Deterministic observations."""

    def __init__(self, engine: ScriptedEngine, patience: float):
        self.engine, self.patience = engine, patience
        self.released_by_progress: bool | None = None

    def call(self, tag, argument):
        if argument == "print(2+3)":
            self.released_by_progress = self.engine.fast_went_on.wait(timeout=self.patience)
        return ToolResult(str(eval(argument.removeprefix("print")) if argument.startswith("print") else "?"), "ok")


def _run(tok, async_turns: bool, patience: float):
    engine = ScriptedEngine(tok)
    tools = SlowFirstProblemTools(engine, patience)
    cfg = RolloutConfig(group_size=1, max_turns=3, token_budget=200, tool_workers=4, async_turns=async_turns)
    return run_rollouts(engine, tok, tools, PROBLEMS[:2], cfg, seed=0), engine, tools


def test_a_fast_episode_goes_on_while_a_slow_tool_call_is_pending(addition_tokenizer):
    episodes, engine, tools = _run(addition_tokenizer, async_turns=True, patience=10)
    assert tools.released_by_progress is True  # the slow call was still blocked when 4 + 4 generated again
    assert engine.calls == [[(2, 3, 1), (4, 4, 1)], [(4, 4, 2)], [(2, 3, 2)]]
    assert [e.status for e in episodes] == ["answered", "answered"]
    assert [e.model_text for e in episodes] == ["<code>print(2+3)</code><answer>5</answer>",
                                                "<code>print(4+4)</code><answer>8</answer>"]
    # the slow episode's wait is in its tool_s, not the fast one's (it was answered before the call returned)
    assert episodes[0].tool_s > episodes[1].tool_s


def test_the_barrier_waits_for_the_slowest_call_and_gives_the_same_episodes(addition_tokenizer):
    flowing, _, _ = _run(addition_tokenizer, async_turns=True, patience=10)
    episodes, engine, tools = _run(addition_tokenizer, async_turns=False, patience=0.3)
    assert tools.released_by_progress is False  # nothing moved until the slow call gave up waiting
    assert engine.calls == [[(2, 3, 1), (4, 4, 1)], [(2, 3, 2), (4, 4, 2)]]
    for a, b in zip(flowing, episodes):
        assert (a.response_ids, a.loss_mask, a.rollout_logprobs, a.status, a.turns) == \
               (b.response_ids, b.loss_mask, b.rollout_logprobs, b.status, b.turns)
        assert [(c.tag, c.argument, c.status) for c in a.tool_calls] == [(c.tag, c.argument, c.status) for c in b.tool_calls]


def test_async_turns_respect_max_batch_size(addition_tokenizer):
    engine = ScriptedEngine(addition_tokenizer)
    tools = SlowFirstProblemTools(engine, patience=10)
    cfg = RolloutConfig(group_size=3, max_turns=3, token_budget=200, tool_workers=8, max_batch_size=2)
    episodes = run_rollouts(engine, addition_tokenizer, tools, PROBLEMS[:2], cfg, seed=0)
    assert all(len(call) <= 2 for call in engine.calls)
    assert sum(len(call) for call in engine.calls) == 12  # 6 episodes x 2 turns
    assert [e.status for e in episodes] == ["answered"] * 6 and tools.released_by_progress is True


# --- the SFT'd tiny policy with the real sandboxed code tool -----------------------------------------------------

@pytest.fixture(scope="module")
def policy(sft_policy_dir):
    return load_policy(sft_policy_dir)


@pytest.mark.slow
def test_async_and_barrier_turns_give_the_same_episodes(policy, tmp_path):
    model, tok = policy
    toolbox = build_toolbox(ToolboxConfig(tools=["code"], code_timeout_s=5, cache_dir=tmp_path / "cache"))
    barrier = run_rollouts(HFEngine(model, tok), tok, toolbox, PROBLEMS, CFG.model_copy(update={"async_turns": False}), seed=4)
    flowing = run_rollouts(HFEngine(model, tok), tok, toolbox, PROBLEMS, CFG, seed=4)
    assert [e.response_ids for e in flowing] == [e.response_ids for e in barrier]
    assert [e.loss_mask for e in flowing] == [e.loss_mask for e in barrier]
    assert [e.status for e in flowing] == [e.status for e in barrier]
    assert sum(len(e.tool_calls) for e in flowing) > 0
    assert len({tuple(e.response_ids) for e in flowing}) > 1  # sampled at temperature 1, not greedy


class GenerateCounter:
    """An engine that signals once it has been asked to generate a second time."""

    def __init__(self, engine):
        self.engine, self.calls, self.second = engine, 0, threading.Event()

    def generate(self, prompts, **kwargs):
        self.calls += 1
        if self.calls >= 2:
            self.second.set()
        return self.engine.generate(prompts, **kwargs)


class FirstCallWaits:
    """The first tool call blocks until the engine generates again (or `patience` s pass); the others run at once."""

    def __init__(self, toolbox, counter: GenerateCounter, patience: float):
        self.toolbox, self.counter, self.patience = toolbox, counter, patience
        self.count, self.lock = 0, threading.Lock()
        self.released_by_progress: bool | None = None

    def call(self, tag, argument):
        with self.lock:
            self.count += 1
            first = self.count == 1
        if first:
            self.released_by_progress = self.counter.second.wait(timeout=self.patience)
        return self.toolbox.call(tag, argument)


@pytest.mark.slow
@pytest.mark.parametrize("async_turns", [True, False])
def test_episodes_go_on_while_a_slow_tool_call_runs(policy, tmp_path, async_turns):
    model, tok = policy
    counter = GenerateCounter(HFEngine(model, tok))
    slow = FirstCallWaits(build_toolbox(ToolboxConfig(tools=["code"], code_timeout_s=5)), counter,
                          patience=20 if async_turns else 2)
    episodes = run_rollouts(counter, tok, slow, PROBLEMS, CFG.model_copy(update={"async_turns": async_turns}), seed=4)
    assert all(e.status for e in episodes)
    # async: other episodes generated their next turn while the first call was blocked; barrier: nothing moved
    # until the blocked call gave up waiting
    assert slow.released_by_progress is async_turns
