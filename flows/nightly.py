"""`nightly-retrain` flow: the pipeline on fresh data, scheduled (prefect.yaml: cron 02:00 UTC). The champion
alias moves only when the retrained model beats the current champion on the gate set (eval.gate).

"Latest data" on the embedded default means a newly generated world (the world seed is the run's date, so
each night distils, trains and evaluates on entities never seen before); with a real dataset the recipe
points at the newest export instead and `fresh_world` is off.
"""
from __future__ import annotations

from datetime import datetime, timezone

from prefect import flow

from flows.pipeline import PipelineConfig, pipeline_flow


@flow(name="nightly-retrain", log_prints=True)
def nightly_retrain_flow(config: PipelineConfig = PipelineConfig(), fresh_world: bool = True) -> dict:
    if fresh_world:
        seed = datetime.now(timezone.utc).date().toordinal()
        config = config.model_copy(update={"distill": config.distill.model_copy(update={"world_seed": seed})})
        print(f"nightly retrain on a fresh world (world_seed={seed})")
    return pipeline_flow(config)
