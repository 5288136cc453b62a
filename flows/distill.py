"""`distill` flow: teacher MAS rollouts on Ray -> Chain-of-Agents trajectories -> progressive filtering ->
a versioned SFT dataset + RL problem set in the artifact store, logged to MLflow.

    afm distill --config configs/default.yaml          # or trigger the `distill` deployment from the Prefect UI
"""
from __future__ import annotations

from pydantic import Field
from prefect import flow

from afm.config import Config
from distill.pipeline import DistillConfig
from tasks.distill import dataset_summary, distill_task


class DistillFlowConfig(Config):
    store_uri: str = Field("", description="Artifact store (path or s3://bucket/prefix); '' = $AFM_STORE_URI or "
                                           "<AFM_HOME>/artifacts.")
    distill: DistillConfig = Field(default_factory=DistillConfig, description="Worlds, teacher, rollouts, filters.")
    parent_run_id: str = Field("", description="MLflow run this stage's run is nested under (the pipeline "
                                               "passes its own); '' = a top-level run in the stage's experiment.")


@flow(name="distill", log_prints=True)
def distill_flow(config: DistillFlowConfig = DistillFlowConfig()) -> dict:
    dataset = distill_task(config.distill, config.store_uri, config.parent_run_id)
    print(dataset_summary(dataset))
    return dataset
