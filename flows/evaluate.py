"""`evaluate` flow: models (and the teacher MAS) side by side on problem sets — accuracy, pass@k, tokens and
tool calls per problem, efficiency vs the teacher — plus the promotion gate.

    afm eval --set dataset_uri=<distill artifact URI> --set eval.models.sft=models:/afm-sft/1
"""
from __future__ import annotations

from pydantic import Field
from prefect import flow

from afm.config import Config
from evaluation.runner import EvalConfig
from flows.rl import read_dataset_manifest
from tasks.evaluate import evaluate_task


class EvalFlowConfig(Config):
    store_uri: str = Field("", description="Artifact store; '' = $AFM_STORE_URI or <AFM_HOME>/artifacts.")
    dataset_uri: str = Field("", description="Distilled dataset artifact (corpus for the tools, eval sets).")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Models, problem sets, sampling, gate.")
    parent_run_id: str = Field("", description="MLflow run this stage's run is nested under (the pipeline "
                                               "passes its own); '' = a top-level run in the stage's experiment.")


@flow(name="evaluate", log_prints=True)
def evaluate_flow(config: EvalFlowConfig = EvalFlowConfig()) -> dict:
    report = evaluate_task(config.eval, read_dataset_manifest(config.dataset_uri), config.store_uri,
                           config.parent_run_id)
    print(report["extra"]["table"])
    return {"report": report["uri"], "table": report["extra"]["table"], "promotion": report["extra"]["promotion"],
            "summary": report["extra"]["summary"], "efficiency": report["extra"]["efficiency"],
            "cached": report["cached"]}
