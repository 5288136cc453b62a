"""GPU check for agentic RL (prepared for a machine with CUDA and vLLM; skips cleanly without CUDA).

What it measures, on the same policy and prompts:
  1. multi-turn rollout throughput, transformers (HFEngine on cuda) vs vLLM (VLLMEngine), generated tokens/s;
  2. one full RL step on GPU through `train_rl` (vLLM rollouts, CUDA learner, weight push into vLLM),
     checking that the weights changed and that vLLM's logprobs agree with the learner's (temperature 1).
Results are appended to bench/results/gpu_check.jsonl as {"bench","metric","value","target","unit","detail"}.

Policy: `--policy DIR --problems FILE`, else the addition-task demo policy (tests/rl/addition_task.py) SFT'd
here on the GPU in a few seconds. Budget: under 5 minutes (vLLM start ~1 min, the rest well under that).

Run:  python bench/gpu_check.py [--policy DIR --problems FILE] [--prompts 64]
Without CUDA it prints "SKIP: ..." and exits 0 without writing anything.
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

RESULTS = ROOT / "bench" / "results" / "gpu_check.jsonl"


def record(metric: str, value: float, target: float | None, unit: str, detail: dict) -> None:
    row = {"bench": "gpu_check", "metric": metric, "value": round(value, 4), "target": target, "unit": unit,
           "detail": detail}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def demo_policy_on_gpu(work: Path) -> tuple[Path, Path]:
    from models.policy import save_policy
    from models.tiny import TinyModelConfig, build_tiny_model
    from problems.records import write_problems
    from tests.rl.addition_task import ALL_PAIRS, addition_problem, addition_tokenizer, addition_trajectory, sft_briefly

    tok = addition_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                             intermediate_size=128), tok)
    sft_briefly(model, tok, [addition_trajectory(a, b) for a, b in ALL_PAIRS], steps=280)
    problems = work / "addition.jsonl"
    write_problems(problems, [addition_problem(a, b) for a, b in ALL_PAIRS])
    return save_policy(model, tok, work / "sft-policy"), problems


def rollout_throughput(engine, tok, problems, rollout, toolbox, name: str) -> dict:
    from training.rl_rollout import rollout_stats, run_rollouts

    run_rollouts(engine, tok, toolbox, problems[:2], rollout, seed=1)  # warm-up (CUDA graphs, kernels)
    started = time.perf_counter()
    stats = rollout_stats(run_rollouts(engine, tok, toolbox, problems, rollout, seed=0))
    detail = {"engine": name, "episodes": stats.episodes, "generated_tokens": stats.generated_tokens,
              "generation_s": round(stats.generation_s, 3), "tool_s": round(stats.tool_s, 3),
              "wall_s": round(time.perf_counter() - started, 3)}
    record(f"rollout_tokens_per_s_{name}", stats.generated_tokens / stats.generation_s, None, "tokens/s", detail)
    return detail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy")
    parser.add_argument("--problems")
    parser.add_argument("--prompts", type=int, default=64, help="prompts in the throughput comparison (x group 8)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device here; bench/gpu_check.py needs a GPU machine with vLLM installed.")
        return

    from agents.tools.toolbox import ToolboxConfig, build_toolbox
    from models.engines.hf import HFEngine
    from models.engines.vllm_engine import VLLMEngine
    from models.policy import load_policy
    from problems.records import read_problems
    from training.rl_rollout import RolloutConfig
    from training.rl_trainer import RLConfig, train_rl

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        os.environ["AFM_HOME"] = str(work / "afm_home")
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        policy, problems_path = (Path(args.policy), Path(args.problems)) if args.policy else demo_policy_on_gpu(work)
        problems = read_problems(problems_path)[: args.prompts]
        rollout = RolloutConfig(group_size=8, max_turns=4, max_new_tokens=128, token_budget=512)
        toolbox = build_toolbox(ToolboxConfig(tools=["code"], code_timeout_s=5, cache_dir=work / "tool-cache"))

        model, tok = load_policy(policy, device="cuda")
        hf = rollout_throughput(HFEngine(model, tok), tok, problems, rollout, toolbox, "transformers")
        del model
        torch.cuda.empty_cache()
        vllm_engine = VLLMEngine(str(policy), max_model_len=1024, gpu_memory_utilization=0.3)
        vl = rollout_throughput(vllm_engine, tok, problems, rollout, toolbox, "vllm")
        record("rollout_vllm_over_transformers",
               (vl["generated_tokens"] / vl["generation_s"]) / (hf["generated_tokens"] / hf["generation_s"]),
               None, "x", {"prompts": len(problems), "group_size": rollout.group_size})
        del vllm_engine
        torch.cuda.empty_cache()

        cfg = RLConfig(policy=str(policy), problems_path=str(problems_path), output_dir=str(work / "rl"), steps=1,
                       prompts_per_step=16, rollout=rollout, lr=1e-4, engine="vllm", use_gpu=True, micro_batch_size=32,
                       toolbox=ToolboxConfig(tools=["code"], code_timeout_s=5), mlflow_experiment="gpu-check",
                       registered_model_name="gpu-check")
        started = time.perf_counter()
        result = train_rl(cfg)
        step = result.history[0]
        before, _ = load_policy(policy)
        after, _ = load_policy(result.model_dir)
        changed = any(not torch.equal(a, b) for a, b in zip(before.state_dict().values(), after.state_dict().values()))
        record("rl_step_gpu_s", time.perf_counter() - started, None, "s",
               {k: step.get(k) for k in ("time_generation_s", "time_tools_s", "time_training_s", "groups_kept",
                                         "reward_mean", "rollout_logprob_abs_diff")} | {"weights_changed": changed})


if __name__ == "__main__":
    main()
