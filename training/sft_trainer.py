"""SFT trainer: a plain torch loop over packed, observation-masked CoA examples; runs alone or under Ray Train.

Reads top to bottom: `setup` (model, data, optimizer, schedule, resume) -> `train` (steps with gradient
accumulation, clipping, checkpoints, metrics) -> final checkpoint + policy -> `cleanup`.
`run_sft_local(cfg)` runs it in this process (one worker, no Ray) inside one MLflow run;
`training.sft_ray.train_sft(cfg)` runs the same `train_worker` on `num_workers` Ray Train workers;
`run_sft_worker(cfg, rank, world_size, device)` runs it in a process of a process group made elsewhere
(torch.multiprocessing in tests, the GPU check: no Ray, no MLflow imported).

Parallelism (`sft.parallelism`, training/parallel.py): `ddp` replicates the model on every worker; `fsdp` shards
parameters, gradients and AdamW state over the workers with FSDP2 (bf16 compute on GPU). Checkpoints are
sharded (DCP, training/checkpointing.py) whatever the parallelism, and resume on another worker count. The
final policy is gathered once and written as an HF safetensors directory in the training dtype.

    cfg = load_config(SFTConfig, "configs/sft.yaml", overrides=["max_steps=100"])
    result = run_sft_local(cfg)      # result.policy_dir, result.final_loss, result.model_version

Why a plain loop and not HF Trainer/TRL: packing here relies on exact control of the forward call (one flat
sequence per micro-batch, restarting `position_ids`, per-example attention, logits only where a label is, see
training/sft_data.py), the loss is summed
per token and divided by the step's global target count (token-weighted across micro-batches and workers),
resume must restore the exact data position of a deterministic row order, and a wall-clock budget must stop
all workers at the same step. Each of those is a few lines here and a fight with callbacks there. The padded
HF Trainer is the baseline in bench/bench_sft.py.

Exact resume: a checkpoint holds model, optimizer, scheduler, RNG, and the step; the row order of an epoch
depends only on (seed, epoch), so `step` alone fixes the data position. Continuing from a checkpoint gives
the same losses as never stopping (tests/sft/test_resume.py kills a real run with SIGKILL). A local job
started again after a crash resumes from `<output_dir>/checkpoints` in a NEW MLflow run (the killed run stays
RUNNING); Ray Train worker restarts (`max_failures`) stay inside the driver's one run. Under a time budget the
schedule also follows the seconds trained (training/lr.py), so a run whose budget binds is exact up to the time
each step took.
"""
from __future__ import annotations

import contextlib
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import numpy as np
import torch
import torch.distributed as dist
from pydantic import Field
from tqdm import tqdm

from afm.config import Config
from models.policy import load_policy, save_policy
from models.policy_tokens import add_coa_special_tokens
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from training.checkpointing import latest_checkpoint, load_sharded_checkpoint, save_sharded_checkpoint
from training.cpu_threads import ThreadChooser
from training.lr import Schedule, TimeShare, warmup_schedule
from training.parallel import (
    Parallelism, clip_grad_norm, fill_from_rank0, grad_sync, hf_model, parallelize, single_process_group,
)
from training.sft_data import DataReport, collate_rows, count_targets, dataset_identity, epoch_row_order
from training.pairwise_loss import count_pairs, pairwise_loss_sum
from training.sft_loss import token_loss_sum
from training.sft_rows import RowTable, tokenized_rows
from training.varlen_attention import PackedAttention, packed_attention_for


class SFTConfig(Config):
    """One SFT job: model, data, optimisation, budget, checkpoints, tracking."""

    model_path: str = Field("", description="Policy to fine-tune: a save_pretrained directory or s3:// artifact URI "
                                            "('' only where the pipeline fills it in).")
    dataset: str = Field("", description="Trajectories: an artifact (dir or s3:// URI with manifest.json) or a .jsonl "
                                         "file ('' only where the pipeline fills it in).")
    dataset_file: str = Field("train.jsonl", description="File inside the dataset artifact that holds the trajectories.")
    rows_store: str = Field("", description="Artifact store (dir or s3://) for the tokenized rows, keyed by data, "
                                            "tokenizer and settings, so later jobs on the same data reuse them "
                                            "(training/sft_rows.py); '' keeps them under <output_dir>/rows for this "
                                            "job only. Several machines need a store they all reach (s3://).")
    data_format: Literal["trajectories", "text", "pairs"] = Field(
        "trajectories", description="trajectories: CoA trajectories, observations masked; text: {\"text\": ...} "
                                    "documents with every token a target (the pretraining stage, training/text_data.py); "
                                    "pairs: AutoCoA when-to-act pairs (distill/autocoa_pairs.py), needs objective=pairwise.")
    objective: Literal["sft", "pairwise"] = Field("sft", description="sft: next-token cross-entropy, token-weighted; "
                                                  "pairwise: AutoCoA's -log σ(P̄_chosen - P̄_rejected) - α·P̄_chosen, "
                                                  "pair-weighted (training/pairwise_loss.py).")
    pairwise_alpha: float = Field(0.2, ge=0.0, description="α of the pairwise objective (weight of -P̄_chosen); AutoCoA: 0.2.")
    learn_observations: bool = Field(False, description="trajectories only: observation tokens are targets too "
                                                        "(AutoCoA stage 3, the world model); False masks them (AFM SFT).")
    system_prompt: str | None = Field(None, description="System prompt rendered before every question (None: none).")
    max_len: int = Field(512, ge=16, description="Longest training row in tokens; longer trajectories are cut at an observation boundary.")
    pack: bool = Field(True, description="Pack several examples per row (block-diagonal attention); False pads one example per row.")
    micro_batch: int = Field(8, ge=1, description="Rows per forward/backward pass on each worker.")
    grad_accum: int = Field(1, ge=1, description="Micro-batches accumulated per optimizer step.")
    lr: float = Field(1e-3, gt=0, description="Peak learning rate of AdamW.")
    warmup_ratio: float = Field(0.05, ge=0, le=1, description="Fraction of total steps with linear LR warmup.")
    schedule: Schedule = Field(
        "cosine", description="LR after warmup: cosine decay to 0, constant, or wsd (constant, then linear to 0 over "
        "the last 20% of the run). Decays follow the nearer end: the steps or the time budget (training/lr.py).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay on matrices (not on norms or biases).")
    max_grad_norm: float = Field(1.0, gt=0, description="Clip the global gradient norm to this value.")
    max_steps: int | None = Field(None, ge=1, description="Optimizer steps to run; None: `epochs` full passes.")
    epochs: int = Field(1, ge=1, description="Passes over the data when max_steps is None (also sets the LR schedule length).")
    time_budget_s: float | None = Field(None, gt=0, description="Stop after this many seconds of training (summed over resumes).")
    seed: int = Field(0, description="Seeds torch/numpy/python and the per-epoch row order.")
    num_workers: int = Field(1, ge=1, description="Ray Train data-parallel workers (run_sft_local always uses 1).")
    cpus_per_worker: int | None = Field(None, ge=1, description="CPUs (= torch threads) per CPU worker; None: the "
                                                                "Ray cluster's CPUs / num_workers.")
    cpu_threads: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto", description="torch threads of a CPU worker. auto: the worker's own count (Ray's CPU reservation), "
                            "re-timed against 1 thread every 200 steps and when steps suddenly slow down, a clearly "
                            "faster count taking over (training/cpu_threads.py: on "
                            "2 cores shared with other processes two spinning OpenMP threads ran 5-10x slower than one, "
                            "idle 1.7x faster); a switch changes the float sums, so loaded runs do not repeat bit for "
                            "bit. An int fixes the count: repeatable at any load.")
    use_gpu: bool = Field(False, description="One GPU per worker (NCCL); False trains on CPU (gloo).")
    parallelism: Parallelism = Field("ddp", description="ddp: a full model, gradients and AdamW state on every worker; "
                                                        "fsdp: FSDP2 shards them over the workers (each decoder layer and the "
                                                        "root), needed for models whose training state exceeds one device.")
    bf16: bool = Field(True, description="GPU only (CPU stays float32): bf16 compute with fp32 master weights, fp32 "
                                         "gradient reduction (fsdp), bf16 autocast (ddp); the final policy is saved in bf16.")
    activation_checkpointing: bool = Field(False, description="Recompute each decoder layer's activations in backward "
                                                              "instead of keeping them (~1/3 more compute, activation "
                                                              "memory of one layer instead of all).")
    packed_attention: PackedAttention = Field("auto", description="Attention over packed rows: varlen (torch's varlen "
                                                                  "flash kernel, one call per layer; CUDA + bf16), sdpa "
                                                                  "(one sdpa call per example; CPU), auto: varlen where it runs.")
    loss_chunk_tokens: int = Field(2048, ge=1, description="Target positions per LM-head + cross-entropy chunk: at "
                                                           "most this many rows of fp32 logits exist at once.")
    checkpoint_every: int = Field(50, ge=1, description="Save a checkpoint every N optimizer steps (and at the end).")
    keep_last: int = Field(2, ge=1, description="Checkpoints kept; older ones are deleted.")
    max_failures: int = Field(2, ge=0, description="Ray Train restarts from the latest checkpoint after a worker dies.")
    report_every: int = Field(25, ge=1, description="Flush metrics to MLflow and report to Ray every N steps (a Ray "
                              "report waits until the previous one is polled: <= 0.2 s on the local Ray, 2 s on a cluster's).")
    output_dir: str = Field("runs/sft", description="Local directory for checkpoints (local runs) and the final policy.")
    checkpoint_uri: str | None = Field(None, description="Ray Train storage for checkpoints: a directory or s3://bucket/prefix; None: <output_dir>/ray.")
    mlflow_experiment: str = Field("sft", description="MLflow experiment of the run.")
    run_name: str = Field("sft", description="MLflow run name (and Ray Train run name).")
    registered_model_name: str = Field("afm-sft", description="The final policy is registered as a new version of this model.")
    log_system_metrics: bool = Field(True, description="MLflow system metrics (CPU, memory, GPU) during the run.")


@dataclass
class SFTResult:
    policy_dir: Path
    run_id: str
    model_version: str
    final_loss: float
    steps: int
    tokens_per_s: float
    data: DataReport


@dataclass
class TrainOutcome:
    """What a worker's loop returns (rank 0's view)."""

    final_loss: float
    steps: int
    tokens_per_s: float
    data: DataReport


class CheckpointSink(Protocol):
    """Where a worker's checkpoints and progress reports go: a local directory, or Ray Train."""

    def latest(self) -> Path | None: ...

    def save(self, step: int, parts: "TrainParts", state: dict[str, Any], metrics: dict[str, float], final: bool) -> None: ...

    def report(self, metrics: dict[str, float]) -> None: ...


class MetricsLogger(Protocol):
    """Where rank 0's per-step metrics go (MLflow in runs, a list in tests)."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def flush(self) -> None: ...


class MetricsHistory:
    """A MetricsLogger that keeps every step's metrics in memory (tests, benches, the GPU check)."""

    def __init__(self):
        self.steps: dict[int, dict[str, float]] = {}

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.steps.setdefault(step, {}).update(metrics)

    def flush(self) -> None:
        """Nothing buffered."""

    def series(self, key: str) -> dict[int, float]:
        """{step: value} of one metric, in step order."""
        return {step: m[key] for step, m in sorted(self.steps.items()) if key in m}


@dataclass
class WorkerContext:
    rank: int
    world_size: int
    device: torch.device
    sink: CheckpointSink
    local_rank: int = 0  # rank on this machine: local rank 0 fetches a remote rows file for the machine's workers


@dataclass
class TrainParts:
    """Everything `setup` builds and the loop mutates."""

    model: torch.nn.Module
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    time_share: TimeShare  # the time budget's share the schedule has seen (the loop sets it each step)
    rows: RowTable  # packed rows of examples, memory-mapped (training/sft_rows.py)
    data: DataReport
    steps_per_epoch: int
    total_steps: int
    start_step: int
    elapsed_s: float
    fingerprint: dict[str, Any]
    policy_dtype: torch.dtype  # the training dtype the final policy is saved in


def check_objective(cfg: SFTConfig) -> None:
    """Pairs only make sense under the pairwise objective and vice versa; observation labels only on trajectories."""
    if (cfg.objective == "pairwise") != (cfg.data_format == "pairs"):
        raise ValueError(f"objective={cfg.objective} with data_format={cfg.data_format}: the pairwise objective "
                         f"trains on data_format=pairs and only on it")
    if cfg.learn_observations and cfg.data_format != "trajectories":
        raise ValueError("learn_observations applies to data_format=trajectories only")


def loss_units(cfg: SFTConfig, batch: dict) -> int:
    """What a step's loss is averaged over: target tokens (sft) or pairs (pairwise)."""
    return count_pairs(batch) if cfg.objective == "pairwise" else count_targets(batch)


def batch_loss_sum(model: torch.nn.Module, cfg: SFTConfig, batch: dict) -> torch.Tensor:
    """The micro-batch's loss summed over its units (tokens or pairs)."""
    if cfg.objective == "pairwise":
        return pairwise_loss_sum(model, batch, cfg.pairwise_alpha, cfg.loss_chunk_tokens).loss_sum
    return token_loss_sum(model, batch, cfg.loss_chunk_tokens)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def adamw(model: torch.nn.Module, cfg: SFTConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (decaying norms and biases hurts small models)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def setup(cfg: SFTConfig, ctx: WorkerContext, work_dir: Path) -> TrainParts:
    """Seed, load the policy and data, pack rows, build optimizer/schedule, resume from the latest checkpoint."""
    check_objective(cfg)
    seed_everything(cfg.seed)
    # fp32 master weights on every path; bf16 exists only as FSDP's compute copy or DDP's autocast (GPU).
    # FSDP on several workers: only rank 0 reads the weights, the others get their shards from it.
    from_rank0 = cfg.parallelism == "fsdp" and ctx.world_size > 1
    model, tokenizer = load_policy(cfg.model_path, dtype=torch.float32,
                                   device="meta" if from_rank0 and ctx.rank != 0 else "cpu")
    add_coa_special_tokens(model, tokenizer)  # a real checkpoint's tags become special tokens (no-op for the tiny one)
    # Per-example attention over the flat micro-batch (sft_data doc): one varlen call on GPU, an sdpa loop on CPU.
    model.set_attn_implementation(packed_attention_for(ctx.device, cfg.bf16, cfg.packed_attention))
    model.train()
    full_state = model.state_dict() if from_rank0 and ctx.rank == 0 else {}
    model = parallelize(model, cfg.parallelism, ctx.device, ctx.world_size, cfg.bf16, cfg.activation_checkpointing)
    if from_rank0:
        fill_from_rank0(model, full_state, ctx.rank, ctx.device)
        del full_state
    rows = tokenized_rows(cfg, tokenizer, ctx.rank, ctx.local_rank, work_dir)
    report = rows.report
    rows_per_step = cfg.micro_batch * cfg.grad_accum * ctx.world_size
    steps_per_epoch = len(rows) // rows_per_step
    if steps_per_epoch == 0:
        raise ValueError(
            f"{cfg.dataset}: {len(rows)} rows ({report.examples} examples) < {rows_per_step} rows per step "
            f"(micro_batch x grad_accum x num_workers); lower micro_batch/grad_accum or add data"
        )
    total_steps = cfg.max_steps or cfg.epochs * steps_per_epoch
    optimizer = adamw(model, cfg)
    time_share = TimeShare(cfg.time_budget_s)
    scheduler = warmup_schedule(optimizer, cfg.schedule, math.ceil(cfg.warmup_ratio * total_steps), total_steps,
                                time_share)
    # Resume is only exact when the data and the batch geometry are the same as when the checkpoint was made.
    fingerprint = {
        "dataset_digest": dataset_identity(cfg.dataset)[1], "rows": len(rows), "rows_per_step": rows_per_step,
        "total_steps": total_steps, "seed": cfg.seed,
    }
    start_step, elapsed_s = 0, 0.0
    checkpoint = ctx.sink.latest()
    if checkpoint is not None:
        state = load_sharded_checkpoint(checkpoint, model, optimizer, scheduler)
        if state["fingerprint"] != fingerprint:
            raise ValueError(
                f"checkpoint {checkpoint} was made with {state['fingerprint']}, this run has {fingerprint}; "
                f"use a new output_dir/run_name or the original data and batch settings"
            )
        start_step, elapsed_s = state["step"], state["elapsed_s"]
    policy_dtype = torch.bfloat16 if cfg.bf16 and ctx.device.type == "cuda" else torch.float32
    return TrainParts(
        model, tokenizer, optimizer, scheduler, time_share, rows, report, steps_per_epoch, total_steps, start_step,
        elapsed_s, fingerprint, policy_dtype,
    )


def shard_rows(cfg: SFTConfig, rank: int, world_size: int, steps_per_epoch: int, step: int,
               order: list[int]) -> list[list[int]]:
    """The row indices of worker `rank`'s micro-batches at global step `step`: the step's slice of the epoch's
    row order, micro-batch by micro-batch interleaved over the workers (disjoint, together the whole slice)."""
    rows_per_step = cfg.micro_batch * cfg.grad_accum * world_size
    start = (step % steps_per_epoch) * rows_per_step
    step_rows = order[start:start + rows_per_step]
    offsets = ((accum * world_size + rank) * cfg.micro_batch for accum in range(cfg.grad_accum))
    return [step_rows[offset:offset + cfg.micro_batch] for offset in offsets]


def step_micro_batches(
    parts: TrainParts, cfg: SFTConfig, ctx: WorkerContext, step: int, order: list[int]
) -> tuple[list[dict], int]:
    """This worker's micro-batches for global step `step` (`shard_rows`, read from the mapped rows file) and
    their real (non-pad) token count."""
    batches, tokens = [], 0
    for indices in shard_rows(cfg, ctx.rank, ctx.world_size, parts.steps_per_epoch, step, order):
        rows = [parts.rows[i] for i in indices]
        batches.append(collate_rows(rows))
        tokens += sum(len(example) for row in rows for example in row)
    return batches, tokens


def all_reduce_sum(values: list[float], ctx: WorkerContext) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    if ctx.world_size > 1:
        dist.all_reduce(tensor)
    return tensor.tolist()


def train_step(parts: TrainParts, cfg: SFTConfig, ctx: WorkerContext, batches: list[dict], global_targets: float) -> tuple[float, float]:
    """Forward/backward every micro-batch, clip, step. Returns (this worker's loss sum, grad norm)."""
    model = parts.model
    # FSDP's MixedPrecisionPolicy already computes in bf16; DDP needs autocast for it.
    autocast = torch.autocast("cuda", dtype=torch.bfloat16,
                              enabled=cfg.bf16 and ctx.device.type == "cuda" and cfg.parallelism == "ddp")
    loss_sum = 0.0
    for i, batch in enumerate(batches):
        batch = {k: v.to(ctx.device) for k, v in batch.items()}
        # DDP and FSDP average gradients over workers; scaling by world_size / global_targets turns that into a
        # sum over every target token (pair, for the pairwise objective) of the step divided by their count.
        with grad_sync(model, enabled=i == len(batches) - 1), autocast:
            summed = batch_loss_sum(model, cfg, batch)
            (summed * (ctx.world_size / global_targets)).backward()
        loss_sum += summed.item()
    grad_norm = clip_grad_norm(model, cfg.max_grad_norm)
    parts.optimizer.step()
    parts.scheduler.step()
    parts.optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


def checkpoint_state(parts: TrainParts, step: int, elapsed_s: float, loss: float) -> dict[str, Any]:
    epoch, step_in_epoch = divmod(step, parts.steps_per_epoch)
    return {
        "epoch": epoch, "step_in_epoch": step_in_epoch, "elapsed_s": elapsed_s, "loss": loss,
        "fingerprint": parts.fingerprint,
    }


def thread_chooser(cfg: SFTConfig, ctx: WorkerContext) -> ThreadChooser | None:
    """CPU workers: a fixed `cpu_threads` (set here), or a ThreadChooser between 1 thread and the worker's own
    count; None where nothing is left to choose (GPU, a fixed count, a 1-thread worker)."""
    if ctx.device.type != "cpu":
        return None
    if cfg.cpu_threads != "auto":
        torch.set_num_threads(cfg.cpu_threads)
        return None
    own = torch.get_num_threads()
    return ThreadChooser([1, own]) if own > 1 else None


def train(parts: TrainParts, cfg: SFTConfig, ctx: WorkerContext, logger: MetricsLogger | None) -> TrainOutcome:
    """The optimisation loop from `parts.start_step` to `total_steps`, the time budget, or the end of data."""
    chooser = thread_chooser(cfg, ctx)
    loss, step = float("nan"), parts.start_step
    elapsed_s, order_epoch, order = parts.elapsed_s, -1, []
    total_tokens, loop_start = 0.0, time.perf_counter()
    # Under a time budget the budget, not max_steps, usually ends the run: the bar then counts seconds, so its
    # ETA is the real one (a step bar would show hours for a 30-minute run).
    timed = cfg.time_budget_s is not None
    bar = tqdm(total=cfg.time_budget_s if timed else parts.total_steps, initial=elapsed_s if timed else step,
               desc="sft", unit="s" if timed else "it", disable=ctx.rank != 0, mininterval=2.0,
               bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}s [{elapsed}<{remaining}{postfix}]" if timed else None)
    while step < parts.total_steps:
        tick = time.perf_counter()
        epoch = step // parts.steps_per_epoch
        if epoch != order_epoch:
            order, order_epoch = epoch_row_order(len(parts.rows), cfg.seed, epoch), epoch
        batches, local_tokens = step_micro_batches(parts, cfg, ctx, step, order)
        out_of_time = float(cfg.time_budget_s is not None and elapsed_s >= cfg.time_budget_s)
        targets, tokens, stop, elapsed_sum = all_reduce_sum(
            [sum(loss_units(cfg, b) for b in batches), local_tokens, out_of_time, elapsed_s], ctx)
        if stop:  # every worker sees the same sum, so all stop at the same step
            break
        # The schedule's time share is the workers' mean: one value on every rank, so every replica steps at one LR.
        parts.time_share.spent_s = elapsed_sum / ctx.world_size
        threads = chooser.threads_for(step) if chooser is not None else torch.get_num_threads()
        loss_sum, grad_norm = train_step(parts, cfg, ctx, batches, targets)
        (global_loss_sum,) = all_reduce_sum([loss_sum], ctx)
        loss = global_loss_sum / targets
        step += 1
        seconds = time.perf_counter() - tick
        if chooser is not None:
            chooser.record(threads, seconds, local_tokens)
        elapsed_s += seconds
        total_tokens += tokens
        tokens_per_s = tokens / seconds
        metrics = {
            "loss": loss, "lr": parts.scheduler.get_last_lr()[0], "grad_norm": grad_norm,
            "tokens_per_s": tokens_per_s, "epoch": step / parts.steps_per_epoch, "threads": threads,
        }
        if logger is not None:
            logger.log(metrics, step)
        # a timed bar never passes its total: tqdm then drops the total and its "{total:.0f}" format raises
        bar.update(min(seconds, max(0.0, bar.total - bar.n)) if timed else 1)
        # refresh=False: the bar redraws at most every `mininterval`, not at every step (under Ray each redraw is
        # a log line shipped to the driver).
        bar.set_postfix(step=step, loss=f"{loss:.4f}", refresh=False)
        final = step == parts.total_steps
        checkpoint_due, report_due = step % cfg.checkpoint_every == 0, step % cfg.report_every == 0
        if checkpoint_due and not final:  # a checkpoint report doubles as the progress report
            ctx.sink.save(step, parts, checkpoint_state(parts, step, elapsed_s, loss), metrics, final=False)
        elif report_due:
            ctx.sink.report(metrics)
        if logger is not None and (checkpoint_due or report_due):
            logger.flush()
    bar.close()
    loop_seconds = time.perf_counter() - loop_start
    mean_tokens_per_s = total_tokens / loop_seconds if total_tokens else 0.0
    final_metrics = {"loss": loss, "mean_tokens_per_s": mean_tokens_per_s}
    ctx.sink.save(step, parts, checkpoint_state(parts, step, elapsed_s, loss), final_metrics, final=True)
    return TrainOutcome(loss, step, mean_tokens_per_s, parts.data)


def cleanup(logger: MetricsLogger | None) -> None:
    if logger is not None:
        logger.flush()


def export_policy(parts: TrainParts, rank: int, out_dir: Path) -> None:
    """Collective: gather the full weights (on CPU, rank 0 only) and write them once as an HF safetensors
    directory in the training dtype."""
    full = get_model_state_dict(parts.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        state = {k: v.to(parts.policy_dtype) for k, v in full.items()}
        save_policy(hf_model(parts.model), parts.tokenizer, out_dir, state_dict=state)


class LocalSink:
    """Checkpoints in `<output_dir>/checkpoints` (keep last K), on a directory all ranks share; the final
    policy in `<output_dir>/policy`."""

    def __init__(self, cfg: SFTConfig, rank: int):
        self.root = Path(cfg.output_dir) / "checkpoints"
        self.policy_dir = Path(cfg.output_dir) / "policy"
        self.keep_last = cfg.keep_last
        self.rank = rank

    def latest(self) -> Path | None:
        return latest_checkpoint(self.root)

    def save(self, step: int, parts: TrainParts, state: dict[str, Any], metrics: dict[str, float], final: bool) -> None:
        save_sharded_checkpoint(self.root, step, parts.model, parts.optimizer, parts.scheduler, state, self.keep_last,
                                self.rank)
        if final:
            export_policy(parts, self.rank, self.policy_dir)

    def report(self, metrics: dict[str, float]) -> None:
        """Local runs have no driver to report to; metrics already went to MLflow."""


def train_worker(cfg: SFTConfig, ctx: WorkerContext, work_dir: Path, logger: MetricsLogger | None) -> TrainOutcome:
    """setup -> train -> (final checkpoint and policy inside train) -> cleanup, on one worker; `logger` on rank 0."""
    parts = setup(cfg, ctx, work_dir)
    if logger is not None:
        logger.log(parts.data.as_metrics(), step=0)
    threads = torch.get_num_threads()
    try:
        return train(parts, cfg, ctx, logger)
    finally:
        torch.set_num_threads(threads)  # the chooser's last pick must not leak into what the process runs next
        cleanup(logger)


def worker_device(cfg: SFTConfig, local_rank: int = 0) -> torch.device:
    """This worker's device: its GPU (made current, as NCCL and FSDP expect) or the CPU."""
    if cfg.use_gpu and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def run_sft_worker(
    cfg: SFTConfig, rank: int, world_size: int, device: torch.device, logger: MetricsLogger | None = None
) -> TrainOutcome:
    """One worker of a job whose process group exists (or world_size 1 with ddp), all on this machine:
    tokenized rows, checkpoints and the final policy under `cfg.output_dir`. No Ray, no MLflow."""
    return train_worker(cfg, WorkerContext(rank, world_size, device, LocalSink(cfg, rank), local_rank=rank),
                        Path(cfg.output_dir) / "data", logger)


def run_sft_local(cfg: SFTConfig) -> SFTResult:
    """The whole SFT job in this process (one worker, no Ray): one MLflow run, final policy registered."""
    # MLflow is imported here, not at module level: the trainer itself runs where MLflow is not installed.
    from training.sft_tracking import StepMetricsLogger, finish_sft_run, start_sft_run

    device = worker_device(cfg)
    work_dir = Path(cfg.output_dir) / "data"
    # FSDP needs a process group even on one worker; DDP on one worker is the bare model.
    group = single_process_group("nccl" if device.type == "cuda" else "gloo") if cfg.parallelism == "fsdp" \
        else contextlib.nullcontext()
    with group, start_sft_run(cfg, work_dir) as (run_id, tracking_uri):
        outcome = run_sft_worker(cfg, 0, 1, device, StepMetricsLogger(tracking_uri, run_id))
        policy_dir = Path(cfg.output_dir) / "policy"
        version = finish_sft_run(cfg, run_id, policy_dir, outcome)
    shutil.rmtree(work_dir, ignore_errors=True)
    return SFTResult(policy_dir, run_id, version, outcome.final_loss, outcome.steps, outcome.tokens_per_s, outcome.data)
