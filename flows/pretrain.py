"""`pretrain` flow: causal LM of a base policy on the mini-web pages of a dataset's training worlds (never the
held-out ones), registered as the base model SFT starts from (tasks/train.py `pretrain_task`).

Run inside the pipeline when `pretrain.enabled` (configs/default.yaml), or alone from Python:
    pretrain_flow(PretrainFlowConfig(dataset=<distill manifest>, base_uri=<policy artifact URI>))
"""
from __future__ import annotations

from pydantic import Field
from prefect import flow

from afm.config import Config
from tasks.train import PretrainConfig, pretrain_task


class PretrainFlowConfig(Config):
    store_uri: str = Field("", description="Artifact store; '' = $AFM_STORE_URI or <AFM_HOME>/artifacts.")
    dataset: dict = Field(default_factory=dict, description="The distill stage's dataset manifest (its corpus).")
    base_uri: str = Field("", description="The policy to pretrain (the base-policy stage's artifact URI).")
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig, description="Pages and trainer recipe.")
    parent_run_id: str = Field("", description="MLflow run this stage's run is nested under ('' = top level).")


@flow(name="pretrain", log_prints=True)
def pretrain_flow(config: PretrainFlowConfig) -> dict:
    model = pretrain_task(config.pretrain, config.dataset, config.base_uri, config.store_uri, config.parent_run_id)
    print(f"pretrained base: {model['uri']} ({model['extra'].get('documents')} pages, MLflow model version "
          f"{model['extra']['model_version']}, {'cached' if model['cached'] else 'trained'})")
    return model
