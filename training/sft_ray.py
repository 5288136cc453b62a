"""SFT on Ray Train: the same `train_worker` loop as `run_sft_local`, on `num_workers` data-parallel workers.

`TorchTrainer` + `ScalingConfig(num_workers, use_gpu)`: Ray makes the process group (gloo on CPU, NCCL on
GPU); the trainer wraps the model for `sft.parallelism` itself (DDP or FSDP2, training/parallel.py).
Checkpoints are sharded (DCP): every worker writes its own shard into a local directory and reports it, and
Ray Train merges the reported directories into one checkpoint in its storage (`checkpoint_uri`: a directory,
or s3://bucket/prefix via a pyarrow S3 filesystem honouring AWS_ENDPOINT_URL). Ray keeps the last
`keep_last`, and `FailureConfig(max_failures)` restarts dead workers from the latest one (exactly: see
sft_trainer's doc), on any worker count. The driver owns the MLflow run; rank 0 appends metrics to it; the
final policy (gathered once, training dtype) travels inside the last checkpoint and is moved to
`<output_dir>/policy`, then registered. The Ray Train run is named after the MLflow run, so a later job never
resumes from its checkpoints: once the policy is stored, `discard_run_state` deletes them (the last one holds
the final weights again, in fp32 with AdamW: 6x the bf16 policy's bytes) and the job's copy of the rows
(the store's rows artifact stays: later jobs on the same data reuse it).

    ray.init(num_cpus=2)                       # or an existing cluster
    result = train_sft(load_config(SFTConfig, "configs/sft.yaml", ["num_workers=2"]))

`ray.train.report` waits until Ray Train's controller has polled the previous report (every 0.2 s on the local
Ray, afm/ray_local.py; Ray's 2 s on a cluster): the loop reports every `report_every` steps and at checkpoints only.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs
import ray
import ray.train
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from afm import tracking
from afm.ray_local import init_local_ray
from training.checkpointing import write_sharded_checkpoint
from training.sft_data import DataReport
from training.sft_trainer import (
    SFTConfig, SFTResult, TrainOutcome, TrainParts, WorkerContext, export_policy, train_worker, worker_device,
)
from training.sft_tracking import StepMetricsLogger, finish_sft_run, start_sft_run


class RaySink:
    """Checkpoints and reports through Ray Train: every rank reports its own shard's directory."""

    def __init__(self, rank: int):
        self.rank = rank

    def latest(self) -> Path | None:
        checkpoint = ray.train.get_checkpoint()
        return Path(checkpoint.to_directory()) if checkpoint is not None else None

    def save(self, step: int, parts: TrainParts, state: dict[str, Any], metrics: dict[str, float], final: bool) -> None:
        metrics = {**metrics, "step": step}
        if final:
            metrics.update(parts.data.as_metrics())
        with tempfile.TemporaryDirectory(prefix="afm-sft-ckpt-") as tmp:
            write_sharded_checkpoint(Path(tmp), parts.model, parts.optimizer, parts.scheduler, {**state, "step": step},
                                     self.rank)
            if final:
                export_policy(parts, self.rank, Path(tmp) / "policy")
            # Ray copies the directory into run storage before report returns, so tmp may go afterwards.
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp))

    def report(self, metrics: dict[str, float]) -> None:
        ray.train.report(metrics)


def sft_worker_loop(config: dict[str, Any]) -> None:
    """Ray Train entry point on every worker."""
    cfg = SFTConfig.model_validate(config["cfg"])
    context = ray.train.get_context()
    rank = context.get_world_rank()
    ctx = WorkerContext(rank=rank, world_size=context.get_world_size(),
                        device=worker_device(cfg, context.get_local_rank()), sink=RaySink(rank),
                        local_rank=context.get_local_rank())
    logger = StepMetricsLogger(config["tracking_uri"], config["run_id"]) if rank == 0 else None
    work_dir = Path(tempfile.mkdtemp(prefix="afm-sft-data-"))
    try:
        train_worker(cfg, ctx, work_dir, logger)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def ray_storage(uri: str) -> tuple[str, pyarrow.fs.FileSystem | None]:
    """(storage_path, storage_filesystem) for RunConfig: s3://bucket/prefix -> ("bucket/prefix", S3FileSystem)."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3":
        return str(Path(uri).resolve()), None
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    options: dict[str, Any] = {"region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
    if endpoint:
        ep = urlparse(endpoint)
        options.update(endpoint_override=ep.netloc, scheme=ep.scheme)
    return f"{parsed.netloc}{parsed.path}".rstrip("/"), pyarrow.fs.S3FileSystem(**options)


def move_policy(checkpoint: Checkpoint, policy_dir: Path) -> None:
    """Move `policy/` out of the final checkpoint, atomically (temp dir + rename), so Ray storage keeps no copy
    of it. Only that folder is read: the checkpoint's DCP shards (fp32 weights + AdamW, 6x the policy's bytes
    for a bf16 7B) are not copied (RL resumes from them; SFT's go with `discard_run_state`)."""
    policy_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{policy_dir.name}.tmp-", dir=policy_dir.parent))
    (tmp / "policy").mkdir()
    pyarrow.fs.copy_files(f"{checkpoint.path}/policy", str(tmp / "policy"), source_filesystem=checkpoint.filesystem,
                          destination_filesystem=pyarrow.fs.LocalFileSystem())
    if policy_dir.exists():
        shutil.rmtree(policy_dir)
    os.replace(tmp / "policy", policy_dir)
    shutil.rmtree(tmp)
    checkpoint.filesystem.delete_dir(f"{checkpoint.path}/policy")


def ray_run_name(cfg: SFTConfig, run_id: str) -> str:
    """The Ray Train run of the MLflow run `run_id`: one per job, so Ray never resumes another job's checkpoints
    (worker restarts within the job still do, `max_failures`)."""
    return f"{cfg.run_name}-{run_id[:8]}"


def discard_run_state(cfg: SFTConfig, run_id: str) -> None:
    """After the job's policy is stored: delete its Ray Train run (every DCP checkpoint it kept, on local disk or
    S3) and the job's local copy of the tokenized rows (a fetched or job-local file; the store's rows artifact
    stays for reuse). No later job can resume from them (`ray_run_name`), and the
    last checkpoint is a second, fp32 copy of the final weights (+ AdamW): 91 GB for a 7B model."""
    storage_path, filesystem = ray_storage(cfg.checkpoint_uri or str(Path(cfg.output_dir) / "ray"))
    (filesystem or pyarrow.fs.LocalFileSystem()).delete_dir(f"{storage_path}/{ray_run_name(cfg, run_id)}")
    shutil.rmtree(Path(cfg.output_dir) / "rows", ignore_errors=True)  # training/sft_rows.py's directory


def cpus_per_worker(cfg: SFTConfig) -> int:
    """CPUs each CPU worker reserves. Ray sets a worker's OMP_NUM_THREADS (hence torch's thread count) to its
    CPU reservation, so the 1 CPU of a bare `ScalingConfig` trains on one core of a 2-core machine (measured:
    13.0k vs 18.4k tokens/s for the default recipe's SFT stage)."""
    if cfg.cpus_per_worker is not None:
        return cfg.cpus_per_worker
    if not ray.is_initialized():
        init_local_ray()
    return max(1, int(ray.cluster_resources().get("CPU", 1)) // cfg.num_workers)


def train_sft(cfg: SFTConfig) -> SFTResult:
    """Run SFT on Ray Train (cluster from the caller's ray.init, or a local one); one MLflow run."""
    storage_path, filesystem = ray_storage(cfg.checkpoint_uri or str(Path(cfg.output_dir) / "ray"))
    work_dir = Path(cfg.output_dir) / "data"
    with start_sft_run(cfg, work_dir) as (run_id, tracking_uri):
        # A registered start (models:/afm-base/3, so lineage links to it) becomes its store location for the workers.
        start = tracking.loadable_model_uri(cfg.model_path, Path(cfg.output_dir) / "start-policy")
        trainer = TorchTrainer(
            sft_worker_loop,
            train_loop_config={"cfg": cfg.model_copy(update={"model_path": start}).model_dump(), "run_id": run_id,
                               "tracking_uri": tracking_uri},
            scaling_config=ScalingConfig(
                num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                resources_per_worker=None if cfg.use_gpu else {"CPU": cpus_per_worker(cfg)},
            ),
            run_config=RunConfig(
                name=ray_run_name(cfg, run_id), storage_path=storage_path, storage_filesystem=filesystem,
                checkpoint_config=CheckpointConfig(num_to_keep=cfg.keep_last),
                failure_config=FailureConfig(max_failures=cfg.max_failures),
            ),
        )
        result = trainer.fit()
        policy_dir = Path(cfg.output_dir) / "policy"
        move_policy(result.checkpoint, policy_dir)
        metrics = result.metrics
        data = DataReport(**{key.removeprefix("data."): int(v) for key, v in metrics.items() if key.startswith("data.")})
        outcome = TrainOutcome(metrics["loss"], int(metrics["step"]), metrics["mean_tokens_per_s"], data)
        version = finish_sft_run(cfg, run_id, policy_dir, outcome)
    shutil.rmtree(work_dir, ignore_errors=True)
    return SFTResult(policy_dir, run_id, version, outcome.final_loss, outcome.steps, outcome.tokens_per_s, data)
