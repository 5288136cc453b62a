"""Asynchronous per-episode turns vs the per-turn barrier (issue #22): rollout episodes/s on a mix of fast and
slow tool calls, both schedules side by side on the same policy, problems, seeds and tools.

Policies: tiny 2-layer Qwen2 policies on the addition task of tests/rl/addition_task.py, solved with the real
sandboxed `code` tool (programs cached after a warm-up run, so both schedules pay the same sandbox cost):
  - "checks" (the headline): SFT'd on trajectories that compute the sum with one `code` call and then check it
    with 0, 1 or 2 more calls (a third each), so sampled episodes make 1-3 tool calls: multi-turn, like AFM;
  - "single": bench/bench_rl.py's demo policy (one `code` call, then the answer), where a barrier costs at most
    one slow call per episode, so asynchrony can gain less.
Tool latency: every call first sleeps a seeded draw, 90% of calls 0.02 s and 10% 1.0 s (a slow crawl or a long
program); the n-th call of a run sleeps the n-th draw in both schedules (which episode gets a slow call differs,
since the calls come in another order). The sleeps are synthetic; the sandboxed programs are real. Sampling is
seeded per episode and turn, so both schedules sample the same episodes; only the waiting differs. Rounds
alternate barrier/async and the best of each is kept (2 shared cores).

Writes JSON lines to bench/results/rl_async.jsonl: {"bench": "rl_async", "metric", "value", "target", "unit",
"detail"}; the headline metric is "async_over_barrier_episodes_per_s" (target 1.3). Takes ~1-4 min on 2 cores
(mostly the two brief SFTs).

Run:  .venv/bin/python bench/bench_rl_async.py [--prompts 16] [--repeats 3] [--workloads checks single]
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_quality import record as record_row  # noqa: E402
from bench_rl import demo_policy  # noqa: E402
from agents.tools.toolbox import ToolboxConfig, build_toolbox  # noqa: E402
from models.engines.hf import HFEngine  # noqa: E402
from models.format import Segment  # noqa: E402
from models.policy import load_policy, save_policy  # noqa: E402
from models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from problems.records import read_problems, write_problems  # noqa: E402
from tests.rl.addition_task import ALL_PAIRS, addition_problem, addition_tokenizer, addition_trajectory, sft_briefly  # noqa: E402
from training.rl_rollout import RolloutConfig, rollout_stats, run_rollouts  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "rl_async.jsonl"
FAST_S, SLOW_S, SLOW_SHARE = 0.02, 1.0, 0.10
TOOL_WORKERS = 16


def checking_trajectory(a: int, b: int, checks: int):
    """The addition trajectory, plus `checks` more code calls that recompute the sum before answering."""
    t = addition_trajectory(a, b)
    first, answer = t.segments[:3], t.segments[3:]
    extra = []
    for k in range(checks):
        x, y = (b, a) if k % 2 == 0 else (a, b)
        extra += [Segment("think", "Check it."), Segment("code", f"```py\nprint({x}+{y})\n```"),
                  Segment("observation", f"[RESULT:SUCCESS]\n{a + b}\n")]
    return dataclasses.replace(t, segments=first + extra + answer)


def checking_policy(work: Path) -> Path:
    """bench_rl.demo_policy's model and recipe, SFT'd on trajectories with 1-3 tool calls."""
    tok = addition_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                             intermediate_size=128), tok)
    sft_briefly(model, tok, [checking_trajectory(a, b, c) for a, b in ALL_PAIRS for c in range(3)], steps=280)
    return save_policy(model, tok, work / "checking-policy")


class MixedLatencyTools:
    """The real toolbox, each call preceded by a seeded fast-or-slow sleep (the n-th call of a run sleeps the
    n-th draw, in either schedule)."""

    def __init__(self, toolbox, seed: int):
        self.toolbox, self.rng, self.lock = toolbox, random.Random(seed), threading.Lock()

    def call(self, tag, argument):
        with self.lock:
            delay = SLOW_S if self.rng.random() < SLOW_SHARE else FAST_S
        time.sleep(delay)
        return self.toolbox.call(tag, argument)


def compare(workload: str, policy: Path, problems_path: Path, prompts: int, repeats: int, work: Path) -> float:
    model, tok = load_policy(policy)
    problems = read_problems(problems_path)[:prompts]
    toolbox = build_toolbox(ToolboxConfig(tools=["code"], code_timeout_s=5, cache_dir=work / f"tool-cache-{workload}"))
    cfg = RolloutConfig(group_size=4, max_turns=4, max_new_tokens=40, token_budget=300, tool_workers=TOOL_WORKERS)
    run_rollouts(HFEngine(model, tok), tok, toolbox, problems, cfg, seed=0)  # warm the program cache
    best: dict[str, float] = {"barrier": 0.0, "async": 0.0}
    detail: dict[str, dict] = {}
    for r in range(repeats):
        for name in ("barrier", "async"):
            tools = MixedLatencyTools(toolbox, seed=r)
            started = time.perf_counter()
            episodes = run_rollouts(HFEngine(model, tok), tok, tools, problems,
                                    cfg.model_copy(update={"async_turns": name == "async"}), seed=0)
            wall = time.perf_counter() - started
            rate = len(episodes) / wall
            if rate > best[name]:
                stats = rollout_stats(episodes)
                best[name] = rate
                detail[name] = {"episodes": len(episodes), "wall_s": round(wall, 2),
                                "tool_calls_per_episode": round(stats.tool_calls_per_episode, 2),
                                "generation_s": round(stats.generation_s, 2), "tool_wait_s": round(stats.tool_s, 2),
                                "statuses": stats.status_counts}
    suffix = "" if workload == "checks" else f"_{workload}"
    for name in ("barrier", "async"):
        record_row(f"rollout_episodes_per_s_{name}{suffix}", best[name], None, "episodes/s", detail[name],
                   results=RESULTS)
    ratio = best["async"] / best["barrier"]
    record_row(f"async_over_barrier_episodes_per_s{suffix}", ratio, 1.3 if workload == "checks" else None, "x",
               {"workload": workload, "prompts": prompts, "group_size": cfg.group_size, "max_turns": cfg.max_turns,
                "repeats": repeats, "tool_workers": TOOL_WORKERS,
                "tools": f"real sandboxed code tool (cached) after a synthetic sleep: {SLOW_SHARE:.0%} of calls "
                         f"{SLOW_S} s, the rest {FAST_S} s",
                "note": "best of the alternating rounds; tool_wait_s: rollout wall time blocked on tools", **detail},
               results=RESULTS)
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16, help="problems per rollout (x group 4 episodes)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per schedule, alternating (best kept)")
    parser.add_argument("--workloads", nargs="+", default=["checks", "single"], choices=["checks", "single"])
    args = parser.parse_args()
    torch.set_num_threads(1)  # 2 shared cores; the tool threads need the other
    with tempfile.TemporaryDirectory(prefix="bench-rl-async-") as tmp:
        work = Path(tmp)
        problems = work / "addition.jsonl"
        write_problems(problems, [addition_problem(a, b) for a, b in ALL_PAIRS])
        policies = {}
        if "checks" in args.workloads:
            policies["checks"] = checking_policy(work)
        if "single" in args.workloads:
            policies["single"], _ = demo_policy(work)
        for workload in args.workloads:
            compare(workload, policies[workload], problems, args.prompts, args.repeats, work)


if __name__ == "__main__":
    main()
