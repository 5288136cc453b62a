"""MLflow side of an SFT job: the run (params, dataset input, system metrics), buffered step metrics from
rank 0, the loss-curve figure, and registering the final policy as a new model version.

The driver owns the run (`start_sft_run` ... `finish_sft_run`); workers only append metrics to it by run
id (`StepMetricsLogger`), so Ray Train workers need no active-run state, only the tracking URI.

    with start_sft_run(cfg, work_dir) as (run_id, tracking_uri):
        logger = StepMetricsLogger(tracking_uri, run_id)                # on rank 0
        logger.log({"loss": 2.1, "lr": 1e-3}, step=1); logger.flush()
        version = finish_sft_run(cfg, run_id, policy_dir, outcome)
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import matplotlib

matplotlib.use("Agg")  # headless: figures are only written to files
import matplotlib.pyplot as plt
import mlflow
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from afm import tracking
from afm.lineage import lineage_tags, model_run_id
from training.sft_data import dataset_identity, resolve_dataset

if TYPE_CHECKING:
    from training.sft_trainer import SFTConfig, TrainOutcome

# MLflow accepts at most 1000 metrics per log_batch call.
_MAX_BATCH = 1000


class StepMetricsLogger:
    """Buffers per-step metrics and writes them to an existing MLflow run in batches (one call per flush)."""

    def __init__(self, tracking_uri: str, run_id: str):
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.run_id = run_id
        self.pending: list[Metric] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.pending += [Metric(key, float(value), now, step) for key, value in metrics.items()]

    def flush(self) -> None:
        for start in range(0, len(self.pending), _MAX_BATCH):
            self.client.log_batch(self.run_id, metrics=self.pending[start:start + _MAX_BATCH])
        self.pending = []


@contextmanager
def start_sft_run(cfg: "SFTConfig", work_dir: Path) -> Iterator[tuple[str, str]]:
    """One MLflow run for the job: full config as params, the dataset as input; yields (run_id, tracking_uri)."""
    if cfg.log_system_metrics:
        mlflow.enable_system_metrics_logging()
    _, manifest = resolve_dataset(cfg.dataset, cfg.dataset_file, work_dir)
    with tracking.start_run(cfg.mlflow_experiment, cfg.run_name, params=cfg.model_dump(), tags={"stage": "sft"}) as run:
        tracking.log_dataset(manifest, name=Path(cfg.dataset).name, context="training")
        yield run.info.run_id, mlflow.get_tracking_uri()
    if cfg.log_system_metrics:
        mlflow.disable_system_metrics_logging()


def loss_curve_figure(history: list[Any]) -> Any:
    """A matplotlib figure of training loss against step from MLflow metric history entries."""
    points = sorted((m.step, m.value) for m in history)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([s for s, _ in points], [v for _, v in points])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (token-weighted, observations masked)")
    ax.set_title("SFT training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def finish_sft_run(cfg: "SFTConfig", run_id: str, policy_dir: Path, outcome: "TrainOutcome") -> str:
    """Log summary metrics and the loss curve, register the final policy; returns the new model version."""
    tracking.log_metrics({"final_loss": outcome.final_loss, "mean_tokens_per_s": outcome.tokens_per_s}, step=outcome.steps)
    fig = loss_curve_figure(MlflowClient().get_metric_history(run_id, "loss"))
    tracking.log_figure(fig, "loss_curve.png")
    plt.close(fig)
    dataset_uri, dataset_sha = dataset_identity(cfg.dataset)
    tags = lineage_tags("sft", run_id, cfg.model_path, model_run_id(cfg.model_path), dataset_uri, dataset_sha)
    return tracking.register_model(policy_dir, cfg.registered_model_name, tags=tags)
