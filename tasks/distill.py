"""Prefect task wrapping the distillation stage (`distill.pipeline.distill_dataset`): cache by manifest,
publish the filter report to MLflow and as a Prefect table artifact.

Used by flows/distill.py and flows/pipeline.py; the domain logic lives in `distill/`.
"""
from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.artifacts import create_table_artifact

from afm import tracking
from distill.pipeline import DistillConfig, distill_dataset
from tasks.stages import default_store_uri, retry_on_transient, run_stage, stage_key


def filter_table(report: list[dict]) -> list[dict]:
    """The per-stage filter report as flat rows (stage, in, out, kept %, reasons)."""
    rows = []
    for stage in report:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(stage.get("reasons", {}).items())) or "-"
        kept_pct = 100.0 * stage["out"] / stage["in"] if stage["in"] else 0.0
        rows.append({"stage": stage["stage"], "in": stage["in"], "out": stage["out"],
                     "kept_%": round(kept_pct, 1), "dropped_or_added": reasons})
    return rows


@task(name="distill-dataset", retries=2, retry_delay_seconds=10, retry_condition_fn=retry_on_transient)
def distill_task(cfg: DistillConfig, store_uri: str = "", parent_run_id: str = "") -> dict:
    """Teacher rollouts -> CoA -> filters; returns the dataset artifact's manifest (skipped if it exists).
    `parent_run_id`: the pipeline run the distill run is nested under."""
    key = stage_key("distill", cfg)

    def produce(work_dir: Path):
        result = distill_dataset(cfg, work_dir, store_uri=store_uri or default_store_uri())
        files = {"train.jsonl": result.sft_path, "rl_problems.jsonl": result.rl_problems_path,
                 "corpus.jsonl": result.corpus_path, "report.json": work_dir / "report.json",
                 "eval_heldout.jsonl": work_dir / "eval_heldout.jsonl", "eval_train.jsonl": work_dir / "eval_train.jsonl",
                 # the trajectories' problems with their world solutions: AutoCoA's pairs and CoT data need them
                 "problems.jsonl": work_dir / "problems.jsonl"}
        return files, {"counts": result.counts, "filter_report": result.filter_report, "stage_key": key}

    manifest = run_stage("distill", key, store_uri, produce, kind="dataset")
    if not manifest["cached"]:
        with tracking.stage_scope(parent_run_id, stage="distill"), \
                tracking.start_run("distill", f"distill-{key}", cfg.model_dump(mode="json")):
            counts = manifest["extra"]["counts"]
            tracking.log_metrics({k: v for k, v in counts.items() if isinstance(v, (int, float))}, step=0)
            for i, stage in enumerate(manifest["extra"]["filter_report"]):
                tracking.log_metrics({f"filter.{stage['stage']}.in": stage["in"],
                                      f"filter.{stage['stage']}.out": stage["out"]}, step=i)
            tracking.log_table_rows(filter_table(manifest["extra"]["filter_report"]), "filter_report.json")
            tracking.log_dataset(manifest, name="coa-sft", context="training")
    create_table_artifact(filter_table(manifest["extra"]["filter_report"]), key="distill-filter-report",
                          description=f"Progressive filtering of {manifest['uri']} "
                                      f"({'cached' if manifest['cached'] else 'new'}): in / out / reasons per stage")
    return manifest


def dataset_summary(manifest: dict) -> str:
    counts = manifest["extra"]["counts"]
    return json.dumps({"dataset": manifest["uri"], "sft_trajectories": counts.get("sft_trajectories"),
                       "rl_problems": counts.get("rl_problems"), "cached": manifest["cached"]})
