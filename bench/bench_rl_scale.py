"""Distributed-RL benchmark on CPU (issue #22): rollout episodes/s with 2 rollout actors vs 1, and the seconds
one weight sync (learner weights -> every rollout actor, through Ray's object store) takes per step.

Both pool sizes run in one Ray session, side by side, on the same problems, seeds and synced weights; each
rollout actor is one engine replica with ONE torch thread (the CPU stand-in for "one GPU per replica"), tools
run on one CPU tool actor. Policy: the tiny addition-task policy of bench/bench_rl.py (real sandboxed `code`
tool). Sync: the tiny policy, and a 12-layer x 768 Qwen2-shaped model (76M parameters with tied embeddings, fp32) built from config.
One-step off-policy vs synchronous RL: mean step seconds of a short train_rl run in each mode (1 rollout actor,
1 learner), same seeds. Writes bench/results/rl_scale.jsonl; takes ~5 min on 2 cores.

Run:  .venv/bin/python bench/bench_rl_scale.py [--prompts 16] [--repeats 2]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_quality import record as record_row  # noqa: E402
from bench_rl import demo_policy  # noqa: E402
from agents.tools.toolbox import ToolboxConfig  # noqa: E402
from models.policy import load_policy  # noqa: E402
from problems.records import read_problems  # noqa: E402
from training.rl_pool import PoolConfig, RolloutPool  # noqa: E402
from training.rl_rollout import RolloutConfig  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "rl_scale.jsonl"


def record(metric: str, value: float, target: float | None, unit: str, detail: dict) -> dict:
    return record_row(metric, value, target, unit, detail, results=RESULTS)


def episodes_per_s(pool: RolloutPool, problems, rollout: RolloutConfig, repeats: int) -> tuple[float, dict]:
    """Best-of-`repeats` episodes/s of one step's rollouts (different seeds each repeat)."""
    best, detail = 0.0, {}
    for r in range(repeats):
        started = time.perf_counter()
        episodes = pool.rollout(problems, list(range(len(problems))), rollout, seed=100 + r)
        wall = time.perf_counter() - started
        if len(episodes) / wall > best:
            best = len(episodes) / wall
            detail = {"episodes": len(episodes), "wall_s": round(wall, 2),
                      "generated_tokens": sum(sum(ep.loss_mask) for ep in episodes)}
    return best, detail


def bench_actors(policy: Path, problems_path: Path, prompts: int, repeats: int, tool_cache: Path) -> None:
    problems = read_problems(problems_path)[:prompts]
    rollout = RolloutConfig(group_size=4, max_turns=3, max_new_tokens=40, token_budget=200)
    toolbox = ToolboxConfig(tools=["code"], code_timeout_s=5, cache_dir=tool_cache)
    model, _ = load_policy(policy)
    rates = {}
    # Warm the tool cache first, so neither pool size pays for the first run of a program.
    for workers in (1, 2, 1, 2):
        pool = RolloutPool(PoolConfig(rollout_workers=workers, threads_per_worker=1), policy, toolbox)
        try:
            pool.sync(model.state_dict())
            rate, detail = episodes_per_s(pool, problems, rollout, repeats)
        finally:
            pool.shutdown()
        rates[workers] = max(rates.get(workers, (0.0, {}))[0], rate), detail
    for workers in (1, 2):
        record(f"rollout_episodes_per_s_{workers}_actors", rates[workers][0], None, "episodes/s",
               {**rates[workers][1], "threads_per_actor": 1, "prompts": prompts, "group_size": rollout.group_size})
    record("rollout_episodes_per_s_2_over_1_actors", rates[2][0] / rates[1][0], 1.7, "x",
           {"prompts": prompts, "repeats": repeats, "cores": os.cpu_count(),
            "note": "one torch thread per actor; tool calls on 1 CPU tool actor (cached programs)"})


def bench_sync(policy: Path, tool_cache: Path, work: Path) -> None:
    """Seconds per sync (median of 4, after the actors started) of the tiny policy and a 76M-parameter model into 2 rollout actors."""
    from models.policy import save_policy
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _, tok = load_policy(policy)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                         num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=1024,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    mid = save_policy(Qwen2ForCausalLM(config), tok, work / "mid-policy")
    for name, path in (("tiny", policy), ("76m", mid)):
        model, _ = load_policy(path)
        state = model.state_dict()
        megabytes = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
        pool = RolloutPool(PoolConfig(rollout_workers=2, threads_per_worker=1), path,
                           ToolboxConfig(tools=["code"], cache_dir=tool_cache))
        try:
            times = []
            for _ in range(4):
                for tensor in state.values():
                    tensor.add_(1e-3)
                times.append(pool.sync(state))
        finally:
            pool.shutdown()
        record(f"weight_sync_s_{name}", sorted(times)[len(times) // 2], None, "s",
               {"actors": 2, "state_mb": round(megabytes, 1), "params_m": round(sum(t.numel() for t in state.values()) / 1e6, 1),
                "all_s": [round(t, 3) for t in times], "path": "ray.put once, every actor load_state_dict from the object store"})


def bench_off_policy(policy: Path, problems_path: Path, work: Path, steps: int = 8) -> None:
    """Mean step seconds (steps 1.., step 0 has nothing to overlap) of synchronous vs one-step off-policy RL."""
    from training.rl_trainer import RLConfig, train_rl

    os.environ["AFM_HOME"] = str(work / "afm_home")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    means, details = {}, {}
    for mode in ("sync", "off_policy", "sync", "off_policy"):  # interleaved, best of two each
        cfg = RLConfig(policy=str(policy), problems_path=str(problems_path), output_dir=str(work / f"rl-{mode}"),
                       steps=steps, prompts_per_step=8, resume=False, lr=3e-4, seed=0, checkpoint_every=steps,
                       rollout=RolloutConfig(group_size=4, max_turns=3, max_new_tokens=40, token_budget=200),
                       toolbox=ToolboxConfig(tools=["code"], code_timeout_s=5, cache_dir=work / "tool-cache"),
                       one_step_off_policy=mode == "off_policy", mlflow_experiment="bench-rl-scale",
                       registered_model_name="bench-rl-scale")
        history = train_rl(cfg).history
        mean = sum(h["step_time_s"] for h in history[1:]) / (len(history) - 1)
        if mean < means.get(mode, float("inf")):
            means[mode] = mean
            details[mode] = {"step_time_s": round(mean, 3),
                             "rollout_s": round(sum(h["time_rollout_s"] for h in history[1:]) / (len(history) - 1), 3),
                             "update_s": round(sum(h.get("time_training_s", 0.0) for h in history[1:]) / (len(history) - 1), 3),
                             "logprob_drift": round(sum(h.get("rollout_logprob_abs_diff", 0.0) for h in history[1:]) / (len(history) - 1), 5)}
    record("rl_step_s_sync_over_off_policy", means["sync"] / means["off_policy"], None, "x",
           {**details, "steps": steps, "episodes_per_step": 32, "cores": os.cpu_count(),
            "note": "2 cores: rollout actor and learner share them, so only tool waits and Python overheads overlap"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16, help="problems per step (x group 4 episodes)")
    parser.add_argument("--repeats", type=int, default=2, help="steps per pool size (best kept)")
    args = parser.parse_args()
    import ray

    from afm.ray_local import init_local_ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with tempfile.TemporaryDirectory(prefix="bench-rl-scale-") as tmp:
        work = Path(tmp)
        policy, problems = demo_policy(work)
        init_local_ray(num_cpus=os.cpu_count())
        try:
            bench_actors(policy, problems, args.prompts, args.repeats, work / "tool-cache")
            bench_sync(policy, work / "tool-cache", work)
            bench_off_policy(policy, problems, work)
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
