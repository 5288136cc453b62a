"""`sft` flow: supervised fine-tuning of a policy on a distilled dataset (any dataset URI), on Ray Train,
observation tokens masked; the model is registered in MLflow.

    afm sft --set sft.model_path=<policy dir or URI> --set sft.dataset=<dataset artifact URI or .jsonl>
"""
from __future__ import annotations

from pydantic import Field
from prefect import flow

from afm.config import Config
from tasks.train import sft_task
from training.sft_trainer import SFTConfig


class SFTFlowConfig(Config):
    store_uri: str = Field("", description="Artifact store; '' = $AFM_STORE_URI or <AFM_HOME>/artifacts.")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="Policy, dataset and training recipe.")
    parent_run_id: str = Field("", description="MLflow run this stage's run is nested under (the pipeline "
                                               "passes its own); '' = a top-level run in the stage's experiment.")


@flow(name="sft", log_prints=True)
def sft_flow(config: SFTFlowConfig = SFTFlowConfig()) -> dict:
    model = sft_task(config.sft, config.store_uri, config.parent_run_id)
    print(f"SFT policy: {model['uri']} (MLflow model version {model['extra']['model_version']}, "
          f"{'cached' if model['cached'] else 'trained'})")
    return model
