"""RL benchmark on CPU: batched multi-turn rollout throughput vs naive one-at-a-time generation, the learner's
GRPO pass (flat episodes, per-episode attention, LM head at response tokens only) vs a plain right-padded full
forward on distilled CoA episodes, the RL step-time breakdown, and the reward curve of a short RL run. Appends JSON lines to bench/results/rl.jsonl:
    {"bench": "rl", "metric", "value", "target", "unit", "detail"}

Policy: `--policy DIR` (e.g. the pipeline's SFT output, with `--problems` JSONL), else the hand-made addition
task of tests/rl/addition_task.py: a tiny 2-layer Qwen2 briefly SFT'd on its trajectories, solved with the
real sandboxed `code` tool. Everything is seeded; takes ~1-3 min on 2 cores.

Run:  .venv/bin/python bench/bench_rl.py [--policy DIR --problems FILE] [--rl-steps 12] [--learner-data train.jsonl]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.tools.toolbox import ToolboxConfig, build_toolbox  # noqa: E402
from bench_default import thirds  # noqa: E402
from bench_sft import distilled_trajectories  # noqa: E402
from models.engines.hf import HFEngine  # noqa: E402
from models.format import render_segments  # noqa: E402
from models.packed_attention import packed_attention  # noqa: E402
from models.policy import load_policy, save_policy  # noqa: E402
from models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from models.tokenizer import encode_trajectory, train_tokenizer  # noqa: E402
from problems.records import read_problems, write_problems  # noqa: E402
from tests.rl.addition_task import ALL_PAIRS, addition_problem, addition_tokenizer, addition_trajectory, sft_briefly  # noqa: E402
from training.grpo import logprobs_from_logits, policy_loss, token_logprobs  # noqa: E402
from training.rewards import NormalizedMatchJudge, score_response  # noqa: E402
from training.rl_rollout import RolloutConfig, rollout_stats, run_rollouts  # noqa: E402
from training.rl_trainer import RLConfig, train_rl  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "rl.jsonl"


def record(metric: str, value: float, target: float | None, unit: str, detail: dict) -> dict:
    row = {"bench": "rl", "metric": metric, "value": round(value, 4), "target": target, "unit": unit, "detail": detail}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    return row


def demo_policy(work: Path) -> tuple[Path, Path]:
    """SFT a tiny policy on the addition task; returns (policy dir, problems file)."""
    tok = addition_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                             intermediate_size=128), tok)
    sft_briefly(model, tok, [addition_trajectory(a, b) for a, b in ALL_PAIRS], steps=280)
    problems = work / "addition.jsonl"
    write_problems(problems, [addition_problem(a, b) for a, b in ALL_PAIRS])
    return save_policy(model, tok, work / "sft-policy"), problems


def bench_rollout_throughput(policy: Path, problems_path: Path, rollout: RolloutConfig, prompts: int, tool_cache: Path):
    """Generated tokens per second of generation time: all episodes batched vs one sequence per call."""
    model, tok = load_policy(policy)
    problems = read_problems(problems_path)[:prompts]
    toolbox = build_toolbox(ToolboxConfig(tools=["code"], code_timeout_s=5, cache_dir=tool_cache))
    results = {}
    for name, batch_size in (("batched", 0), ("naive", 1)):
        cfg = rollout.model_copy(update={"max_batch_size": batch_size})
        started = time.perf_counter()
        stats = rollout_stats(run_rollouts(HFEngine(model, tok), tok, toolbox, problems, cfg, seed=0))
        wall = time.perf_counter() - started
        results[name] = {"generated_tokens": stats.generated_tokens, "generation_s": round(stats.generation_s, 3),
                         "tool_s": round(stats.tool_s, 3), "wall_s": round(wall, 3),
                         "tokens_per_s": stats.generated_tokens / stats.generation_s,
                         "episodes": stats.episodes, "tool_calls_per_episode": stats.tool_calls_per_episode}
    ratio = results["batched"]["tokens_per_s"] / results["naive"]["tokens_per_s"]
    record("rollout_tokens_per_s_batched", results["batched"]["tokens_per_s"], None, "tokens/s", results["batched"])
    record("rollout_tokens_per_s_naive", results["naive"]["tokens_per_s"], None, "tokens/s", results["naive"])
    record("rollout_batched_over_naive", ratio, 5.0, "x",
           {"prompts": prompts, "group_size": rollout.group_size, "max_turns": rollout.max_turns,
            "note": "generation time only; tool time is the same sandbox calls in both"})


def bench_learner_pass(work: Path, data: Path | None, episodes_per_batch: int = 16, batches: int = 4) -> None:
    """Forward + backward of the GRPO loss over CoA episodes (4 x 128 model, fp32, 2 threads): ours vs a plain
    right-padded forward with logits at every position. Interleaved rounds, best of each kept (shared cores)."""
    torch.set_num_threads(2)
    trajectories = distilled_trajectories(work, data)[:episodes_per_batch * batches]
    tok = train_tokenizer([t.question + render_segments(t.segments) for t in trajectories], vocab_size=1024)
    model = build_tiny_model(TinyModelConfig(hidden_size=128, num_layers=4, max_position_embeddings=2048), tok)
    encoded = [encode_trajectory(tok, t) for t in trajectories]
    learner_batches = []
    for start in range(0, len(encoded), episodes_per_batch):
        chunk = encoded[start:start + episodes_per_batch]
        width = max(len(e.input_ids) for e in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        att = torch.zeros_like(ids)
        mask = torch.zeros(len(chunk), width - 1)
        for row, e in enumerate(chunk):
            ids[row, :len(e.input_ids)], att[row, :len(e.input_ids)] = torch.tensor(e.input_ids), 1
            mask[row, :len(e.input_ids) - 1] = torch.tensor(e.loss_mask[1:], dtype=torch.float)  # target t+1 written by the model
        learner_batches.append((ids, att, mask, torch.randn(len(chunk))))

    def padded_logprobs(ids, att, mask):
        return logprobs_from_logits(model(input_ids=ids, attention_mask=att).logits[:, :-1].float(), ids[:, 1:])

    def ours(ids, att, mask):
        with packed_attention(model):
            return token_logprobs(model, ids, att, mask)

    def seconds(logprobs_fn) -> float:
        started = time.perf_counter()
        for ids, att, mask, adv in learner_batches:
            lp, ent = logprobs_fn(ids, att, mask)
            loss, _ = policy_loss(lp, lp.detach() - 0.01, adv, mask, entropy=ent.detach())
            loss.backward()
            model.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    best = {"ours": float("inf"), "padded": float("inf")}
    for _ in range(2):
        best["ours"] = min(best["ours"], seconds(ours))
        best["padded"] = min(best["padded"], seconds(padded_logprobs))
    tokens = sum(len(e.input_ids) for e in encoded)
    response = sum(sum(e.loss_mask) for e in encoded)
    record("learner_pass_speedup_vs_padded", best["padded"] / best["ours"], None, "x",
           {"episodes": len(encoded), "episodes_per_batch": episodes_per_batch, "tokens": tokens,
            "response_token_share": round(response / tokens, 3), "ours_s": round(best["ours"], 3),
            "padded_s": round(best["padded"], 3), "model": "qwen2 hidden128 x4 layers", "threads": 2})
    torch.set_num_threads(1)


def greedy_accuracy(policy: Path, problems_path: Path, rollout: RolloutConfig, tool_cache: Path) -> float:
    """Fraction of all problems answered correctly with greedy decoding (the same episodes every time)."""
    model, tok = load_policy(policy)
    problems = read_problems(problems_path)
    toolbox = build_toolbox(ToolboxConfig(tools=["code"], code_timeout_s=5, cache_dir=tool_cache))
    cfg = rollout.model_copy(update={"group_size": 1, "temperature": 0.0})
    episodes = run_rollouts(HFEngine(model, tok), tok, toolbox, problems, cfg, seed=0)
    judge = NormalizedMatchJudge()
    return sum(score_response(e.problem.family, e.model_text, e.problem.answers, judge).score for e in episodes) / len(episodes)


def bench_rl_run(policy: Path, problems_path: Path, rollout: RolloutConfig, steps: int, work: Path):
    # The tool cache makes repeated identical programs free (and their observations stable).
    toolbox = ToolboxConfig(tools=["code"], code_timeout_s=5, cache_dir=work / "tool-cache")
    cfg = RLConfig(policy=str(policy), problems_path=str(problems_path), output_dir=str(work / "rl"), steps=steps,
                   prompts_per_step=8, rollout=rollout.model_copy(update={"group_size": 8}), lr=3e-4, minibatches=2,
                   micro_batch_size=16, seed=0, checkpoint_every=max(steps, 1), toolbox=toolbox,
                   mlflow_experiment="bench-rl", registered_model_name="bench-rl")
    before = greedy_accuracy(policy, problems_path, rollout, work / "tool-cache")
    started = time.perf_counter()
    result = train_rl(cfg)
    wall = time.perf_counter() - started
    after = greedy_accuracy(result.model_dir, problems_path, rollout, work / "tool-cache")
    record("rl_greedy_accuracy_gain", after - before, 0.0, "accuracy",
           {"before": round(before, 3), "after": round(after, 3), "problems": len(read_problems(problems_path))})
    hist = result.history
    parts = {k: sum(h[k] for h in hist) / len(hist) for k in ("time_generation_s", "time_tools_s", "time_training_s", "step_time_s")}
    record("rl_step_time_s", parts["step_time_s"], None, "s", {k: round(v, 3) for k, v in parts.items()} | {
        "episodes_per_step": cfg.prompts_per_step * cfg.rollout.group_size})
    curve = thirds([h["reward_mean"] for h in hist])
    record("rl_reward_rise", curve["last"] - curve["first"], 0.0, "reward",
           {"first_third_mean": round(curve["first"], 3), "last_third_mean": round(curve["last"], 3), "steps": len(hist),
            "wall_s": round(wall, 1), "curve": [round(h["reward_mean"], 3) for h in hist]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", help="policy dir (default: SFT the addition-task demo policy)")
    parser.add_argument("--problems", help="problems JSONL for --policy")
    parser.add_argument("--prompts", type=int, default=16, help="prompts in the throughput comparison")
    parser.add_argument("--rl-steps", type=int, default=60, help="steps of the RL run (0 skips it)")
    parser.add_argument("--learner-data", type=Path, default=None,
                        help="distilled train.jsonl for the learner-pass comparison (default: distill a small dataset here)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # 2 shared cores: a second thread mostly adds contention
    rollout = RolloutConfig(group_size=4, max_turns=3, max_new_tokens=40, token_budget=200)
    with tempfile.TemporaryDirectory(prefix="bench-rl-") as tmp:
        work = Path(tmp)
        os.environ["AFM_HOME"] = str(work / "afm_home")  # the RL run's MLflow store stays in the temp dir
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        if args.policy:
            policy, problems = Path(args.policy), Path(args.problems)
        else:
            policy, problems = demo_policy(work)
        bench_rollout_throughput(policy, problems, rollout, args.prompts, work / "tool-cache")
        bench_learner_pass(work, args.learner_data)
        if args.rl_steps:
            bench_rl_run(policy, problems, rollout, args.rl_steps, work)


if __name__ == "__main__":
    main()
