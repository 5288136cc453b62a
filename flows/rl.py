"""`rl` flow: agentic RL (GRPO/DAPO, real tools, observation tokens masked) from an SFT policy on a dataset's
RL problem set; the model is registered in MLflow.

    afm rl --set dataset_uri=<distill artifact URI> --set rl.policy=<SFT policy URI or models:/afm-sft@...>
"""
from __future__ import annotations

from pydantic import Field
from prefect import flow

from afm.config import Config
from afm.storage import open_store
from tasks.train import rl_task
from training.rl_trainer import RLConfig


class RLFlowConfig(Config):
    store_uri: str = Field("", description="Artifact store; '' = $AFM_STORE_URI or <AFM_HOME>/artifacts.")
    dataset_uri: str = Field("", description="Distilled dataset artifact (its rl_problems.jsonl and corpus.jsonl).")
    rl: RLConfig = Field(default_factory=RLConfig, description="Start policy and RL recipe.")
    parent_run_id: str = Field("", description="MLflow run this stage's run is nested under (the pipeline "
                                               "passes its own); '' = a top-level run in the stage's experiment.")


def read_dataset_manifest(uri: str) -> dict:
    root, _, name = uri.rstrip("/").rpartition("/")
    manifest = open_store(root).read_manifest(name)
    if manifest is None:
        raise FileNotFoundError(f"dataset {uri!r}: no manifest.json (absent or incomplete); run `afm distill` first")
    return manifest


@flow(name="rl", log_prints=True)
def rl_flow(config: RLFlowConfig = RLFlowConfig()) -> dict:
    model = rl_task(config.rl, read_dataset_manifest(config.dataset_uri), config.store_uri,
                    config.parent_run_id)
    print(f"RL policy: {model['uri']} (MLflow model version {model['extra']['model_version']})")
    return model
