"""SFT scale bench on CPU: FSDP2 vs DDP and activation checkpointing, measured side by side in one run.

    .venv/bin/python bench/bench_sft_scale.py            # ~4 min on 2 cores

Appends `{"bench","metric","value","target","unit","detail"}` lines to bench/results/sft_scale.jsonl:
- `fsdp2_over_ddp2_state_bytes` (target <= 0.55): rank 0's bytes of parameters + gradients + AdamW state, FSDP
  on 2 workers / DDP on 2 workers. Counted from the tensors themselves (a DTensor's local shard) right before
  the second optimizer step, when gradients and AdamW moments all exist.
- `ac_over_no_ac_peak_memory` (target <= 0.6 on the 8-layer model; also given for the 4-layer one): peak memory of the first training step (forward, backward,
  optimizer: activations + gradients + AdamW state) with activation checkpointing / without, at max_len 1024.
  Measured in a fresh process per case as peak RSS minus RSS after setup (CPU tensors have no allocator
  statistics; the torch/transformers baseline is excluded because it is the same in both).
- `fsdp2_over_ddp2_tokens_per_s` (target >= 0.8): training tokens/s, both with 2 gloo workers of one thread;
  DDP and FSDP runs alternate (2 each) and the medians are compared (the cores are shared).

All through the trainer's own functions (`training.sft_trainer.setup`/`train`), workers spawned with
torch.multiprocessing (no Ray). Models: Qwen2s of ~4M parameters (hidden 256, 4 layers) and of ~2M (hidden
128, 8 layers); data: synthetic CoA trajectories packed into 1,024-token rows.
"""
from __future__ import annotations

import json
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.format import render_segments, write_jsonl  # noqa: E402
from models.policy import save_policy  # noqa: E402
from models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from models.tokenizer import train_tokenizer  # noqa: E402
from training.sft_data import collate_rows, count_targets  # noqa: E402
from training.sft_trainer import LocalSink, MetricsHistory, SFTConfig, WorkerContext, setup, train, train_step  # noqa: E402
from training.synthetic_coa import synthetic_trajectories  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "sft_scale.jsonl"
MODEL = TinyModelConfig(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=1024,
                        max_position_embeddings=1024, seed=0)
# Activation checkpointing saves all layers' activations but one (plus the checkpointed inputs), so its ratio
# falls with depth: measured on the 4-layer model and on the deepest tiny model (8 layers; Qwen2.5-7B has 28).
DEEP = MODEL.model_copy(update={"hidden_size": 128, "num_layers": 8, "intermediate_size": 512})
MAX_LEN = 1024
THROUGHPUT_STEPS = 12  # the first 2 are warm-up


def emit(metric: str, value: float, target: float | None, unit: str, detail: dict) -> None:
    line = {"bench": "sft_scale", "metric": metric, "value": round(value, 4), "target": target, "unit": unit,
            "detail": detail}
    print(json.dumps(line), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def make_inputs(work: Path) -> tuple[dict[str, Path], Path]:
    """Policies {"model": MODEL, "deep": DEEP} sharing one tokenizer, and the trajectories file."""
    trajectories = synthetic_trajectories(600, seed=0)
    tokenizer = train_tokenizer([t.question + render_segments(t.segments) for t in trajectories], vocab_size=2048)
    data = work / "train.jsonl"
    write_jsonl(data, trajectories)
    policies = {name: save_policy(build_tiny_model(cfg, tokenizer), tokenizer, work / name)
                for name, cfg in (("model", MODEL), ("deep", DEEP))}
    return policies, data


def bench_cfg(policy: Path, data: Path, out: Path, **update) -> SFTConfig:
    fields = dict(model_path=str(policy), dataset=str(data), max_len=MAX_LEN, micro_batch=2,
                  max_steps=THROUGHPUT_STEPS, lr=1e-3, checkpoint_every=10_000, output_dir=str(out),
                  log_system_metrics=False)
    return SFTConfig(**{**fields, **update})


def local_bytes(tensors) -> int:
    """Bytes this rank holds for `tensors` (a DTensor counts its local shard only)."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def _train_worker(rank: int, world_size: int, port: int, cfg_json: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        cfg = SFTConfig.model_validate_json(cfg_json)
        ctx = WorkerContext(rank, world_size, torch.device("cpu"), LocalSink(cfg, rank))
        parts = setup(cfg, ctx, Path(cfg.output_dir) / "data")
        state_bytes: dict[str, int] = {}

        def count(optimizer, args, kwargs):  # before the 2nd step: grads and AdamW moments both exist
            if parts.optimizer.state and not state_bytes:
                params = list(parts.model.parameters())
                state_bytes.update(params=local_bytes(params), grads=local_bytes(p.grad for p in params),
                                   optimizer=local_bytes(v for s in parts.optimizer.state.values()
                                                         for v in s.values() if torch.is_tensor(v)))

        parts.optimizer.register_step_pre_hook(count)
        history = MetricsHistory()
        train(parts, cfg, ctx, history)
        if rank == 0:
            speeds = list(history.series("tokens_per_s").values())[2:]  # the first 2 steps are warm-up
            Path(out).write_text(json.dumps({"bytes": state_bytes, "tokens_per_s": speeds}))
    finally:
        dist.destroy_process_group()


def run_workers(cfg: SFTConfig, world_size: int) -> dict:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = Path(cfg.output_dir).with_suffix(".json")
    mp.spawn(_train_worker, args=(world_size, port, cfg.model_dump_json(), str(out)), nprocs=world_size, join=True)
    return json.loads(out.read_text())


def first_step_peak_bytes(cfg_json: str) -> int:
    """In this (fresh) process: setup, then one training step; peak RSS of the step above RSS after setup."""
    torch.set_num_threads(2)
    cfg = SFTConfig.model_validate_json(cfg_json)
    ctx = WorkerContext(0, 1, torch.device("cpu"), LocalSink(cfg, 0))
    parts = setup(cfg, ctx, Path(cfg.output_dir) / "data")
    batch = collate_rows([parts.rows[i] for i in range(cfg.micro_batch)])
    with open("/proc/self/statm") as handle:
        rss_after_setup = int(handle.read().split()[1]) * resource.getpagesize()
    train_step(parts, cfg, ctx, [batch], float(count_targets(batch)))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_after_setup


def peak_in_subprocess(cfg: SFTConfig) -> int:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from bench.bench_sft_scale import first_step_peak_bytes; "
            "print(first_step_peak_bytes(sys.argv[2]))")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), cfg.model_dump_json()], check=True,
                         capture_output=True, text=True, cwd=ROOT)
    return int(out.stdout.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-sft-scale-") as tmp:
        work = Path(tmp)
        policies, data = make_inputs(work)
        policy = policies["model"]
        runs: dict[str, list[dict]] = {"ddp": [], "fsdp": []}
        for repeat in range(2):
            for parallelism in ("ddp", "fsdp"):
                cfg = bench_cfg(policy, data, work / f"{parallelism}-{repeat}", parallelism=parallelism)
                runs[parallelism].append(run_workers(cfg, world_size=2))
        ddp, fsdp = runs["ddp"][0]["bytes"], runs["fsdp"][0]["bytes"]
        emit("fsdp2_over_ddp2_state_bytes", sum(fsdp.values()) / sum(ddp.values()), 0.55, "ratio",
             {"ddp_rank0_bytes": ddp, "fsdp_rank0_bytes": fsdp, "model": MODEL.model_dump(), "workers": 2})
        speed = {p: statistics.median(v for run in runs[p] for v in run["tokens_per_s"]) for p in runs}
        emit("fsdp2_over_ddp2_tokens_per_s", speed["fsdp"] / speed["ddp"], 0.8, "ratio",
             {"ddp_tokens_per_s": round(speed["ddp"], 1), "fsdp_tokens_per_s": round(speed["fsdp"], 1),
              "workers": 2, "threads_per_worker": 1, "micro_batch": 2, "max_len": MAX_LEN,
              "steps_timed_per_run": THROUGHPUT_STEPS - 2, "runs_each": 2})

        for name, model_cfg in (("deep", DEEP), ("model", MODEL)):
            peaks = {ac: peak_in_subprocess(bench_cfg(policies[name], data, work / f"peak-{name}-{ac}", micro_batch=4,
                                                      activation_checkpointing=ac)) for ac in (False, True)}
            emit("ac_over_no_ac_peak_memory", peaks[True] / peaks[False], 0.6 if name == "deep" else None, "ratio",
                 {"peak_bytes_no_ac": peaks[False], "peak_bytes_ac": peaks[True], "max_len": MAX_LEN, "micro_batch": 4,
                  "model": model_cfg.model_dump(),
                  "measured": "peak RSS of the first train step minus RSS after setup, fresh process per case"})


if __name__ == "__main__":
    main()
