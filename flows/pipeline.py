"""`pipeline` flow — the paper's figure, end to end, as subflows:

    distill (teacher MAS -> CoA trajectories -> filters) -> base policy -> sft -> rl -> evaluate -> promote

Every stage's output is an artifact whose manifest is written last and whose name carries a key hashed from
the stage config and its inputs' digests: re-running after a crash skips the completed stages and redoes only
the one that was in progress. This is what `make run` runs on the embedded default (configs/default.yaml).
`recipe: autocoa` runs AutoCoA's stages instead (flows/autocoa.py, configs/autocoa.yaml).

    afm pipeline --config configs/default.yaml [--set sft.time_budget_s=120 ...]

In MLflow a pipeline is one run of the `pipeline` experiment with every stage's run nested under it and the
headline metrics on it (flows/pipeline_metrics.py): select two pipeline runs and "Compare" puts them side by side.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field
from prefect import flow

from afm import tracking
from afm.config import Config
from distill.pipeline import DistillConfig
from evaluation.runner import EvalConfig
from flows.autocoa import AutoCoAConfig, run_autocoa
from flows.distill import DistillFlowConfig, distill_flow
from flows.evaluate import EvalFlowConfig, evaluate_flow
from flows.pipeline_metrics import StageClock, headline_metrics
from flows.pretrain import PretrainFlowConfig, pretrain_flow
from flows.rl import RLFlowConfig, rl_flow
from flows.sft import SFTFlowConfig, sft_flow
from tasks.stages import default_store_uri
from tasks.train import BasePolicyConfig, PretrainConfig, base_policy_task
from training.rl_trainer import RLConfig
from training.sft_trainer import SFTConfig


class PipelineConfig(Config):
    store_uri: str = Field("", description="Artifact store; '' = $AFM_STORE_URI or <AFM_HOME>/artifacts.")
    recipe: Literal["afm", "autocoa"] = Field("afm", description="afm: distill -> SFT -> RL (this module); autocoa: "
                                              "AutoCoA's staged SFT and sim-then-real RL (flows/autocoa.py).")
    distill: DistillConfig = Field(default_factory=DistillConfig, description="Stage 1: teacher rollouts + filters.")
    policy: BasePolicyConfig = Field(default_factory=BasePolicyConfig, description="The base policy.")
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig, description="Optional causal LM of the base "
                                                                                 "policy on training pages before SFT.")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="Stage 2 (model_path/dataset set by the pipeline).")
    rl: RLConfig = Field(default_factory=RLConfig, description="Stage 3 (policy/problems set by the pipeline).")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Stage 4 (models set by the pipeline).")
    autocoa: AutoCoAConfig = Field(default_factory=AutoCoAConfig, description="recipe=autocoa: its stages (SFT "
                                   "stages take the `sft` recipe, RL stages the `rl` one).")


# The MLflow experiment of pipeline runs (parents) and, nested under them, their stages' runs.
PIPELINE_EXPERIMENT = "pipeline"


def registry_uri(model: dict, registered_name: str) -> str:
    return f"models:/{registered_name}/{model['extra']['model_version']}"


@flow(name="pipeline", log_prints=True)
def pipeline_flow(config: PipelineConfig = PipelineConfig()) -> dict:
    """One MLflow `pipeline` run per call; every stage's run is its nested child and it carries the headline
    metrics (flows/pipeline_metrics.py), so two pipeline runs compare side by side."""
    name = "pipeline" if config.recipe == "afm" else "autocoa"
    with tracking.parent_run(PIPELINE_EXPERIMENT, name, params=config.model_dump(mode="json"),
                             tags={tracking.TAG_STAGE: "pipeline"}) as run_id:
        return run_stages(config, run_id) if config.recipe == "afm" else run_autocoa(config, run_id)


@flow(name="autocoa", log_prints=True)
def autocoa_flow(config: PipelineConfig = PipelineConfig(recipe="autocoa")) -> dict:
    """The AutoCoA recipe as a deployment of its own (flows/deployments.py): the pipeline with recipe=autocoa."""
    return pipeline_flow(config.model_copy(update={"recipe": "autocoa"}))


def run_stages(config: PipelineConfig, run_id: str) -> dict:
    clock = StageClock()
    store = config.store_uri or default_store_uri()
    dataset = distill_flow(DistillFlowConfig(store_uri=store, distill=config.distill, parent_run_id=run_id))
    clock.lap("distill")
    base = base_policy_task(config.policy, dataset, store)
    clock.lap("policy")
    start, pretrained = base, None
    if config.pretrain.enabled:
        pretrained = pretrain_flow(PretrainFlowConfig(store_uri=store, dataset=dataset, base_uri=base,
                                                      pretrain=config.pretrain, parent_run_id=run_id))
        # SFT starts from the registered base version, so the SFT model's lineage links to it (afm lineage).
        start = registry_uri(pretrained, config.pretrain.train.registered_model_name)
        clock.lap("pretrain")
    sft = sft_flow(SFTFlowConfig(store_uri=store, parent_run_id=run_id, sft=config.sft.model_copy(
        update={"model_path": start, "dataset": dataset["uri"]})))
    clock.lap("sft")
    sft_model = registry_uri(sft, config.sft.registered_model_name)
    # RL starts from the registered SFT version, so the RL model's lineage links to it (afm lineage).
    rl = rl_flow(RLFlowConfig(store_uri=store, dataset_uri=dataset["uri"], parent_run_id=run_id,
                              rl=config.rl.model_copy(update={"policy": sft_model})))
    clock.lap("rl")
    models = {"untrained": base, "sft": sft_model, "rl": registry_uri(rl, config.rl.registered_model_name)}
    report = evaluate_flow(EvalFlowConfig(store_uri=store, dataset_uri=dataset["uri"], parent_run_id=run_id,
                                          eval=config.eval.model_copy(update={"models": {**models, **config.eval.models}})))
    clock.lap("eval")
    tracking.log_run_metrics(run_id, {**headline_metrics(sft, rl, report, clock.seconds, pretrained), "seconds.total": clock.total()})
    summary = {
        "dataset": dataset["uri"], "base_policy": base, **({"pretrained": pretrained["uri"]} if pretrained else {}),
        "sft_model": sft["uri"], "rl_model": rl["uri"],
        "registered": {k: v for k, v in models.items() if v.startswith("models:/")},
        "report": report["report"], "promotion": report["promotion"], "mlflow": tracking.configure_tracking(),
        "stages": {name: "cached" if out["cached"] else "ran" for name, out in
                   (("distill", dataset), ("sft", sft), ("rl", rl), ("eval", report))},
        "pipeline_run": run_id, "seconds": clock.total(),
    }
    print(report["table"])
    print("\n".join(["", "Pipeline finished:"] + [f"  {k:>12}: {v}" for k, v in summary.items()]))
    return summary
