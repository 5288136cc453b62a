"""GPU checks: FSDP SFT on one GPU (torch + transformers only), and agentic RL (needs vLLM).

`--check sft` (the default; what the lent GPU machine can run: it has torch + transformers, no Ray, MLflow,
vLLM or flash-attn) trains a randomly initialised Qwen2.5-0.5B-shaped model (24 layers, hidden 896, 151,936
vocab, ~494M parameters) with the SFT trainer's own functions (`run_sft_worker`, no Ray, no MLflow) under FSDP2
on a one-process NCCL group, bf16 compute, packed 4,096-token rows of synthetic CoA trajectories, with and
without activation checkpointing. Records tokens/s, MFU (6 x parameters x tokens/s over the GPU's dense bf16
peak; attention FLOPs and recomputation not counted) and peak allocated memory; runs varlen attention (torch's flash varlen) with and without activation checkpointing,
then the per-example sdpa loop. ~3 minutes. Device command (the varlen/sdpa agreement test first):
    python3 -m pytest -q -p no:cacheprovider tests/sft/test_varlen_attention.py tests/sft/test_sft_loss.py &&
    python3 bench/gpu_check.py --results $OUT/gpu_check.jsonl
`--dry-run` runs the same code on CPU (gloo) with a tiny model and prints the rows without recording them.
The trainer's config classes need pydantic, which that machine lacks: carry its wheels (pydantic,
pydantic-core, annotated-types, typing-inspection for cp312; the device README's `.whl` recipe).

`--check rl`, for a machine with CUDA and vLLM; what it measures, on the same policy and prompts:
  1. multi-turn rollout throughput, transformers (HFEngine on cuda) vs vLLM (VLLMEngine), generated tokens/s;
  2. one full RL step on GPU through `train_rl` (vLLM rollouts, CUDA learner, weight push into vLLM),
     checking that the weights changed and that vLLM's logprobs agree with the learner's (temperature 1).
Results are appended to bench/results/gpu_check.jsonl as {"bench","metric","value","target","unit","detail"}.

Policy: `--policy DIR --problems FILE`, else the addition-task demo policy (tests/rl/addition_task.py) SFT'd
here on the GPU in a few seconds. Budget: under 5 minutes (vLLM start ~1 min, the rest well under that).

Run:  python bench/gpu_check.py [--check sft|rl] [--dry-run] [--results FILE] [--policy DIR --problems FILE]
Without CUDA (and without --dry-run) it prints "SKIP: ..." and exits 0 without writing anything.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results" / "gpu_check.jsonl"
# Dense bf16 tensor-core peaks (FLOP/s, no sparsity) by device-name substring, for MFU.
BF16_PEAK = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362e12}
# Qwen2.5-0.5B's shapes (its config.json), randomly initialised: nothing can be downloaded on the GPU machine.
QWEN25_05B = dict(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True)
DRY_SHAPE = dict(vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, tie_word_embeddings=True)
results_path: Path | None = RESULTS  # None: print only (--dry-run)


def record(metric: str, value: float, target: float | None, unit: str, detail: dict) -> None:
    row = {"bench": "gpu_check", "metric": metric, "value": round(value, 4), "target": target, "unit": unit,
           "detail": detail}
    if results_path is not None:
        results_path.parent.mkdir(parents=True, exist_ok=True)
        with open(results_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def sft_check(dry_run: bool) -> None:
    """FSDP SFT of a random 0.5B Qwen2 on one GPU (or the tiny CPU dry run): tokens/s, MFU, peak memory."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from models.format import render_segments, write_jsonl
    from models.policy import save_policy
    from models.tokenizer import train_tokenizer
    from training.parallel import single_process_group
    from training.sft_trainer import MetricsHistory, SFTConfig, run_sft_worker, worker_device
    from training.synthetic_coa import synthetic_trajectories
    from training.varlen_attention import VARLEN_ATTENTION, packed_attention_for

    shape, max_len, steps, warmup = (DRY_SHAPE, 512, 4, 1) if dry_run else (QWEN25_05B, 4096, 24, 4)
    with tempfile.TemporaryDirectory(prefix="gpu-check-sft-") as tmp:
        work = Path(tmp)
        trajectories = synthetic_trajectories(200 if dry_run else 3000, seed=0)
        tokenizer = train_tokenizer([t.question + render_segments(t.segments) for t in trajectories], vocab_size=1024)
        data = work / "train.jsonl"
        write_jsonl(data, trajectories)
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(**shape, max_position_embeddings=max_len, bos_token_id=None,
                                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
        n_params = sum(p.numel() for p in model.parameters())
        policy = save_policy(model, tokenizer, work / "policy")
        del model
        # varlen attention with and without activation checkpointing, then the sdpa loop for comparison
        for checkpointing, choice in ((True, "auto"), (False, "auto"), (True, "sdpa")):
            cfg = SFTConfig(model_path=str(policy), dataset=str(data), max_len=max_len, micro_batch=4, lr=1e-4,
                            max_steps=steps, warmup_ratio=0.0, parallelism="fsdp", use_gpu=not dry_run, bf16=True,
                            activation_checkpointing=checkpointing, packed_attention=choice, checkpoint_every=10_000,
                            report_every=10_000, output_dir=str(work / f"run-{checkpointing}-{choice}"),
                            log_system_metrics=False)
            device = worker_device(cfg)
            attention = "varlen" if packed_attention_for(device, cfg.bf16, choice) == VARLEN_ATTENTION else "sdpa_loop"
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            history = MetricsHistory()
            started = time.perf_counter()
            with single_process_group("nccl" if device.type == "cuda" else "gloo"):
                outcome = run_sft_worker(cfg, 0, 1, device, history)
            tokens_per_s = statistics.median(list(history.series("tokens_per_s").values())[warmup:])
            peak = BF16_PEAK.get(next((k for k in BF16_PEAK if k in torch.cuda.get_device_name()), ""), 0.0) \
                if device.type == "cuda" else 0.0
            detail = {"params": n_params, "shape": shape, "max_len": max_len, "micro_batch": cfg.micro_batch,
                      "activation_checkpointing": checkpointing, "steps": outcome.steps, "final_loss": round(outcome.final_loss, 4),
                      "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                      "attention": attention, "wall_s": round(time.perf_counter() - started, 1)}
            suffix = f"{'ac' if checkpointing else 'no_ac'}_{attention}"
            record(f"sft_fsdp_tokens_per_s_{suffix}", tokens_per_s, None, "tokens/s", detail)
            if peak:
                record(f"sft_fsdp_mfu_{suffix}", 6 * n_params * tokens_per_s / peak, 0.30, "fraction",
                       {**detail, "peak_flops": peak})
            if device.type == "cuda":
                record(f"sft_fsdp_peak_memory_{suffix}", torch.cuda.max_memory_allocated() / 2**30, None, "GiB", detail)


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
    global results_path
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", choices=["sft", "rl"], default="sft")
    parser.add_argument("--dry-run", action="store_true", help="sft: tiny model on CPU, rows printed, not recorded")
    parser.add_argument("--results", type=Path, default=RESULTS, help="JSONL file the rows are appended to")
    parser.add_argument("--policy")
    parser.add_argument("--problems")
    parser.add_argument("--prompts", type=int, default=64, help="prompts in the throughput comparison (x group 8)")
    args = parser.parse_args()
    results_path = None if args.dry_run else args.results
    if not torch.cuda.is_available() and not (args.check == "sft" and args.dry_run):
        print(f"SKIP: no CUDA device here; `--check {args.check}` needs a GPU (rl: and vLLM).")
        return
    if args.check == "sft":
        sft_check(args.dry_run)
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
