"""GPU checks: FSDP SFT and GRPO learner / rollout / weight-sync rows on one GPU (torch + transformers), vLLM rows.

`--check sft` (the default; what the lent GPU machine can run: it has torch + transformers, no Ray, MLflow,
vLLM or flash-attn) trains a randomly initialised Qwen2.5-0.5B-shaped model (24 layers, hidden 896, 151,936
vocab, ~494M parameters) with the SFT trainer's own functions (`run_sft_worker`, no Ray, no MLflow) under FSDP2
on a one-process NCCL group, bf16 compute, packed 4,096-token rows of synthetic CoA trajectories, with and
without activation checkpointing. Records tokens/s, MFU (6 x parameters x tokens/s over the GPU's dense bf16
peak; attention FLOPs and recomputation not counted) and peak allocated memory; runs varlen attention (torch's flash varlen) with and without activation checkpointing,
then the per-example sdpa loop. Planned (not yet run on a GPU): ~1.5-2.5 minutes on an H100/H200: model init
and save ~10 s; per run ~3 s to tokenize 3,000 trajectories into 119 rows, 24 steps of 16k tokens (~0.2 s/step
varlen, ~0.5 s/step sdpa loop), ~10 s for the final DCP checkpoint (6 GB) + bf16 policy, deleted after the run.
Device command (the varlen/sdpa agreement test first):
    python3 -m pytest -q -p no:cacheprovider tests/sft/test_varlen_attention.py tests/sft/test_sft_loss.py &&
    python3 bench/gpu_check.py --results $OUT/gpu_check.jsonl
`--dry-run` runs the same code on CPU (gloo) with a tiny model and prints the rows without recording them.
The trainer's config classes need pydantic, which that machine lacks: carry its wheels (pydantic,
pydantic-core, annotated-types, typing-inspection for cp312; the device README's `.whl` recipe).

`--check rl` (torch + transformers; the lent machine runs it): GRPO rows on a random Qwen2.5-0.5B-shaped
policy built from its config on the GPU (nothing downloaded; a word-level tokenizer that names every id):
  - rl_learner_step_s / rl_learner_tokens_per_s / rl_learner_peak_memory: one GRPO update per step (training/
    grpo.py `token_logprobs` + `policy_loss`, 2 micro-batches, clip, AdamW) under FSDP2 (training/parallel.py
    `parallelize(..., "fsdp", ...)` in `single_process_group`), bf16 compute / fp32 master weights, on 8
    synthetic right-padded rows of up to 1,024 tokens (256 prompt, loss on the response); 1 warm-up + 3 steps;
  - rl_rollout_tokens_per_s_hf: HFEngine.generate (bf16, its own model copy), 64 prompts x 128 new tokens;
  - rl_weight_sync_s: learner -> engine on one GPU: `get_model_state_dict(full_state_dict=True)` of the FSDP2
    model loaded into the engine's separate copy (HFEngine.update_weights), median of 3, copy checked equal;
  - rl_rollout_vllm_over_hf (target >= 10), rl_vllm_sleep_freed_fraction (target >= 0.8 of the engine's GPU
    memory, sleep level 1) and rl_weight_sync_s_vllm_ipc (VLLMEngine weight_sync="ipc" after sleep): where
    vLLM is importable; elsewhere (the lent machine) the rows are written with value null and detail.skipped.
  Planned: ~30-45 s on an H100/H200 without vLLM (model init ~2 s x 2, learner ~5-10 s incl. first-step
  warm-up, rollout ~3-5 s, syncs ~1 s); `--check all` (sft then rl) stays under 4 minutes.
    python3 bench/gpu_check.py --check all --results $OUT/gpu_check.jsonl
`--check rl_vllm_step`, for a machine with CUDA and vLLM; on the same policy and prompts:
  1. multi-turn rollout throughput, transformers (HFEngine on cuda) vs vLLM (VLLMEngine), generated tokens/s;
  2. one full RL step on GPU through `train_rl` (vLLM rollouts, CUDA learner, weight push into vLLM),
     checking that the weights changed and that vLLM's logprobs agree with the learner's (temperature 1).
  Policy: `--policy DIR --problems FILE`, else the addition-task demo policy (tests/rl/addition_task.py) SFT'd
  here on the GPU in a few seconds. Budget: under 5 minutes (vLLM start ~1 min, the rest well under that).
Results are appended to bench/results/gpu_check.jsonl as {"bench","metric","value","target","unit","detail"}
(value null: skipped, detail.skipped says why).

Run:  python bench/gpu_check.py [--check sft|rl|rl_vllm_step|all|a,b] [--dry-run] [--results FILE]
      [--policy DIR --problems FILE]
Without CUDA (and without --dry-run) it prints "SKIP: ..." and exits 0 without writing anything.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
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


def record(metric: str, value: float | None, target: float | None, unit: str, detail: dict) -> None:
    """One JSON line; value None is a skipped row (detail["skipped"] says why)."""
    row = {"bench": "gpu_check", "metric": metric, "value": None if value is None else round(value, 4),
           "target": target, "unit": unit, "detail": detail}
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
            # The run's final DCP checkpoint (fp32 weights + AdamW, ~6 GB at 0.5B) and policy: ~7 GB of disk per run.
            shutil.rmtree(cfg.output_dir)


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


# RL rows (`--check rl`): sizes on GPU and for the CPU dry run. GPU: ~30-60 s on an H100/H200 (budget 70 s).
RL_GPU = dict(rows=8, prompt_len=256, response_len=768, micro_rows=4, steps=4, warmup=1,
              rollout_prompts=64, rollout_prompt_len=128, rollout_new_tokens=128, syncs=3)
RL_DRY = dict(rows=4, prompt_len=16, response_len=48, micro_rows=2, steps=3, warmup=1,
              rollout_prompts=8, rollout_prompt_len=16, rollout_new_tokens=16, syncs=2)


def id_tokenizer(vocab_size: int, work: Path):
    """A tokenizer that names every id of the model's vocabulary (WordLevel, "t<id>"), so random policies' samples
    always decode, in HFEngine and in vLLM's detokenizer. Eos is the last id; nothing trained or downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size - 2)} | {"<pad>": vocab_size - 2, "<eos>": vocab_size - 1}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>",
                                  clean_up_tokenization_spaces=False)
    tok.save_pretrained(work / "tokenizer")
    return tok


def rl_check(dry_run: bool) -> None:
    """GRPO learner update (FSDP2, bf16), HF-engine rollout, learner -> engine weight sync, on a random
    Qwen2.5-0.5B-shaped policy (tiny on the CPU dry run); then the vLLM rows, skipped where vLLM is missing."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from models.engines.hf import HFEngine
    from training.grpo import policy_loss, token_logprobs
    from training.parallel import clip_grad_norm, grad_sync, parallelize, single_process_group

    sizes, shape = (RL_DRY, DRY_SHAPE) if dry_run else (RL_GPU, QWEN25_05B)
    device = torch.device("cpu") if dry_run else torch.device("cuda", 0)
    gpu = device.type == "cuda"
    if gpu:
        torch.cuda.empty_cache()  # after the sft check in the same process
    with tempfile.TemporaryDirectory(prefix="gpu-check-rl-") as tmp:
        work = Path(tmp)
        tok = id_tokenizer(shape["vocab_size"], work)
        seq_len = sizes["prompt_len"] + sizes["response_len"]
        config = Qwen2Config(**shape, max_position_embeddings=max(seq_len, 1024), bos_token_id=None,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        with torch.device(device):  # initialised where it runs: seconds, not a CPU-side 0.5B init
            learner = Qwen2ForCausalLM(config)
        n_params = sum(p.numel() for p in learner.parameters())
        common = {"params": n_params, "device": torch.cuda.get_device_name() if gpu else "cpu"}
        if gpu:
            torch.cuda.reset_peak_memory_stats()

        with single_process_group("nccl" if gpu else "gloo"):
            # ---- learner: one GRPO update per step on a synthetic batch ----
            model = parallelize(learner, "fsdp", device, 1, bf16=True, activation_checkpointing=False)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
            gen = torch.Generator().manual_seed(0)
            rows, plen = sizes["rows"], sizes["prompt_len"]
            ids = torch.randint(0, shape["vocab_size"] - 2, (rows, seq_len), generator=gen)
            # right-padded rows of different lengths, loss on the response tokens only
            lengths = torch.tensor([seq_len - (i * sizes["response_len"]) // (2 * rows) for i in range(rows)])
            attention = (torch.arange(seq_len)[None] < lengths[:, None]).long()
            loss_mask = torch.zeros(rows, seq_len - 1, dtype=torch.long)
            for r, n in enumerate(lengths.tolist()):
                loss_mask[r, plen - 1:n - 1] = 1
            old_logp = -torch.rand(rows, seq_len - 1, generator=gen) * 3 * loss_mask
            advantages = torch.randn(rows, generator=gen)
            ids, attention, loss_mask, old_logp, advantages = (t.to(device) for t in
                                                              (ids, attention, loss_mask, old_logp, advantages))
            valid = float(loss_mask.sum())
            step_s, stats = [], {}
            for step in range(sizes["steps"]):
                if gpu:
                    torch.cuda.synchronize()
                started = time.perf_counter()
                micro = list(range(0, rows, sizes["micro_rows"]))
                for k, start in enumerate(micro):
                    sl = slice(start, start + sizes["micro_rows"])
                    logp, entropy = token_logprobs(model, ids[sl], attention[sl], loss_mask[sl], temperature=1.0)
                    loss, stats = policy_loss(logp, old_logp[sl], advantages[sl], loss_mask[sl], entropy=entropy,
                                              num_valid_tokens=valid)
                    with grad_sync(model, enabled=k == len(micro) - 1):
                        loss.backward()
                grad_norm = clip_grad_norm(model, 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if gpu:
                    torch.cuda.synchronize()
                step_s.append(time.perf_counter() - started)
            timed = step_s[sizes["warmup"]:]
            seconds = statistics.median(timed)
            tokens = int(attention.sum())
            detail = common | {"shape": shape, "rows": rows, "seq_len": seq_len, "tokens_per_step": tokens,
                               "response_tokens": int(valid), "micro_rows": sizes["micro_rows"],
                               "step_s": [round(x, 3) for x in step_s], "grad_norm": round(grad_norm, 4),
                               "clip_fraction": stats.get("clip_fraction"),
                               "mixed_precision": "bf16" if gpu else "fp32",
                               "parallelism": "fsdp2 (1 process)"}
            record("rl_learner_step_s", seconds, None, "s", detail)
            record("rl_learner_tokens_per_s", tokens / seconds, None, "tokens/s", detail)
            if gpu:
                record("rl_learner_peak_memory", torch.cuda.max_memory_allocated() / 2**30, None, "GiB", detail)

            # ---- the engine's own model copy (bf16 on GPU) and its rollout throughput ----
            with torch.device(device):
                engine_model = Qwen2ForCausalLM(config).to(torch.bfloat16 if gpu else torch.float32).eval()
            engine = HFEngine(engine_model, tok, max_batch_size=sizes["rollout_prompts"])
            hf_rollout = hf_rollout_row(engine, sizes, shape, common)

            # ---- learner -> engine weight sync: full state dict gathered from FSDP2, loaded into the copy ----
            sync_s = []
            for _ in range(sizes["syncs"]):
                if gpu:
                    torch.cuda.synchronize()
                started = time.perf_counter()
                full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
                engine.update_weights(full)
                if gpu:
                    torch.cuda.synchronize()
                sync_s.append(time.perf_counter() - started)
            name = "model.layers.0.mlp.down_proj.weight"
            agree = torch.equal(engine_model.state_dict()[name], full[name].to(engine_model.dtype))
            del full
            record("rl_weight_sync_s", statistics.median(sync_s), None, "s",
                   common | {"syncs_s": [round(x, 3) for x in sync_s], "path": "get_model_state_dict(full) -> "
                             "HFEngine.update_weights (load_state_dict, fp32 -> engine dtype)",
                             "engine_dtype": str(engine_model.dtype), "engine_matches_learner": agree})
            del model, optimizer, learner
        del engine, engine_model
        if gpu:
            torch.cuda.empty_cache()
        vllm_rows(dry_run, work, config, tok, sizes, hf_rollout, common)


def rollout_prompts(sizes: dict, shape: dict) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, shape["vocab_size"] - 2, (sizes["rollout_prompts"], sizes["rollout_prompt_len"]),
                         generator=gen).tolist()


def hf_rollout_row(engine, sizes: dict, shape: dict, common: dict) -> float:
    """HFEngine.generate on one batch, every sequence to max_new_tokens (random policy, no stop strings)."""
    prompts = rollout_prompts(sizes, shape)
    engine.generate(prompts[:4], max_new_tokens=4, temperature=1.0, stop=(), seed=0)  # warm-up
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    gens = engine.generate(prompts, max_new_tokens=sizes["rollout_new_tokens"], temperature=1.0, stop=(), seed=0)
    seconds = time.perf_counter() - started
    generated = sum(len(g.token_ids) for g in gens)
    record("rl_rollout_tokens_per_s_hf", generated / seconds, None, "tokens/s",
           common | {"engine": "HFEngine", "prompts": len(prompts), "prompt_len": sizes["rollout_prompt_len"],
                     "max_new_tokens": sizes["rollout_new_tokens"], "generated_tokens": generated,
                     "seconds": round(seconds, 3), "dtype": str(engine.model.dtype)})
    return generated / seconds


def vllm_rows(dry_run: bool, work: Path, config, tok, sizes: dict, hf_tokens_per_s: float, common: dict) -> None:
    """vLLM rollout tokens/s over HF's (target >= 10) and memory freed by sleep (target >= 0.8 of the engine's),
    plus its CUDA-IPC weight-sync seconds; each row skipped with the reason where it cannot run."""
    import importlib.util

    metrics = [("rl_rollout_vllm_over_hf", 10.0, "x"), ("rl_vllm_sleep_freed_fraction", 0.8, "fraction"),
               ("rl_weight_sync_s_vllm_ipc", None, "s")]
    reason = ("vllm is not importable here" if importlib.util.find_spec("vllm") is None
              else "no CUDA (dry run)" if dry_run or not torch.cuda.is_available() else None)
    if reason is None:
        try:
            vllm_measure(work, config, tok, sizes, hf_tokens_per_s, common)
            return
        except Exception as exc:  # noqa: BLE001 - never run on a GPU when written: report, don't abort the check
            reason = f"vLLM check failed: {type(exc).__name__}: {exc}"[:500]
    for metric, target, unit in metrics:
        record(metric, None, target, unit, common | {"skipped": reason})


def vllm_measure(work: Path, config, tok, sizes: dict, hf_tokens_per_s: float, common: dict) -> None:
    from transformers import Qwen2ForCausalLM

    from models.engines.vllm_engine import VLLMEngine

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(work / "policy")
    tok.save_pretrained(work / "policy")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    del model
    torch.cuda.empty_cache()
    free_before = torch.cuda.mem_get_info()[0]
    engine = VLLMEngine(str(work / "policy"), dtype="bfloat16", max_model_len=1024, gpu_memory_utilization=0.3,
                        weight_sync="ipc", enable_sleep_mode=True)
    engine_bytes = free_before - torch.cuda.mem_get_info()[0]
    prompts = rollout_prompts(sizes, {"vocab_size": config.vocab_size})
    engine.generate(prompts[:4], max_new_tokens=4, temperature=1.0, stop=(), seed=0)
    started = time.perf_counter()
    gens = engine.generate(prompts, max_new_tokens=sizes["rollout_new_tokens"], temperature=1.0, stop=(), seed=0)
    seconds = time.perf_counter() - started
    generated = sum(len(g.token_ids) for g in gens)
    record("rl_rollout_vllm_over_hf", generated / seconds / hf_tokens_per_s, 10.0, "x",
           common | {"vllm_tokens_per_s": round(generated / seconds, 1), "hf_tokens_per_s": round(hf_tokens_per_s, 1),
                     "prompts": len(prompts), "max_new_tokens": sizes["rollout_new_tokens"]})
    free_awake = torch.cuda.mem_get_info()[0]
    engine.sleep(1)
    freed = torch.cuda.mem_get_info()[0] - free_awake
    record("rl_vllm_sleep_freed_fraction", freed / max(engine_bytes, 1), 0.8, "fraction",
           common | {"engine_gib": round(engine_bytes / 2**30, 2), "freed_gib": round(freed / 2**30, 2), "level": 1})
    torch.cuda.synchronize()
    started = time.perf_counter()
    engine.update_weights(state)  # wakes the weights, CUDA IPC transfer
    torch.cuda.synchronize()
    record("rl_weight_sync_s_vllm_ipc", time.perf_counter() - started, None, "s",
           common | {"path": "VLLMEngine(weight_sync='ipc').update_weights after sleep(1)"})
    engine.wake_up()


def main() -> None:
    global results_path
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", default="sft",
                        help="comma-separated: sft, rl (learner/rollout/sync rows), rl_vllm_step; 'all' = sft,rl")
    parser.add_argument("--dry-run", action="store_true", help="sft, rl: tiny model on CPU, rows printed, not recorded")
    parser.add_argument("--results", type=Path, default=RESULTS, help="JSONL file the rows are appended to")
    parser.add_argument("--policy")
    parser.add_argument("--problems")
    parser.add_argument("--prompts", type=int, default=64, help="prompts in the throughput comparison (x group 8)")
    args = parser.parse_args()
    results_path = None if args.dry_run else args.results
    checks = ["sft", "rl"] if args.check == "all" else [c.strip() for c in args.check.split(",") if c.strip()]
    unknown = sorted(set(checks) - {"sft", "rl", "rl_vllm_step"})
    if unknown:
        parser.error(f"unknown --check {unknown}; choose from sft, rl, rl_vllm_step, all")
    if not torch.cuda.is_available() and not (args.dry_run and "rl_vllm_step" not in checks):
        print(f"SKIP: no CUDA device here; `--check {args.check}` needs a GPU (rl_vllm_step: and vLLM).")
        return
    for check in checks:
        started = time.perf_counter()
        if check == "sft":
            sft_check(args.dry_run)
        elif check == "rl":
            rl_check(args.dry_run)
        else:
            rl_vllm_step_check(args)
        print(f"# check {check}: {time.perf_counter() - started:.1f} s", flush=True)


def rl_vllm_step_check(args) -> None:
    """The multi-turn HF vs vLLM rollout comparison and one `train_rl` step on vLLM (needs CUDA and vLLM)."""

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
