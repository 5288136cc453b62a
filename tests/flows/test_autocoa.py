"""The AutoCoA recipe end to end through the real CLI on a tiny config (configs/autocoa.yaml + the smoke sizes):
every stage runs for real and chains (SFT1 -> SFT2 -> SFT3 -> RL sim -> RL real, each from the previous stage's
registered version: `afm lineage` shows it), each has its own nested MLflow run; a second run that disables
stages (the ablation SFT1+2 without baselines) takes the completed stages from the cache and skips the rest.

Runs in subprocesses like tests/flows/test_pipeline.py (Ray sessions never leak into the test process)."""
from __future__ import annotations

import ast

import pytest

from afm.config import ConfigError, load_config
from flows.autocoa import REGISTERED, STAGES, chain_label
from flows.pipeline import PipelineConfig
from tests.flows.conftest import SMOKE_OVERRIDES
from tests.flows.test_pipeline import run_cli, summary_field

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AUTOCOA_TINY = [o for o in SMOKE_OVERRIDES if not o.startswith("pretrain.")] + [
    "autocoa.sft1.max_steps=2", "autocoa.sft2.max_steps=2", "autocoa.sft3.max_steps=2",
    "autocoa.rl_sim_steps=1", "autocoa.rl_real_steps=1", "autocoa.baselines=[react]",
    "autocoa.probes.pairs=4", "autocoa.probes.observations=2", "autocoa.probes.max_new_tokens=8",
    "autocoa.facts_given_size=2", "autocoa.data.heldout_fraction=0.2", "autocoa.sft1.lr=1e-4",
]


def run_autocoa(home, extra: list[str]):
    args = ["pipeline", "--config", "configs/autocoa.yaml"]
    for override in AUTOCOA_TINY + extra:
        args += ["--set", override]
    result = run_cli(home, args)
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout + result.stderr
    return {name: ast.literal_eval(summary_field(out, name)) for name in ("stages", "registered", "real_tool_calls",
                                                                            "probes", "action_rates")} | {
        "pipeline_run": summary_field(out, "pipeline_run")}


def test_autocoa_recipe_chains_stages_and_ablation_reuses_them(tmp_path):
    home = tmp_path / "afm"
    full = run_autocoa(home, [])
    assert set(full["stages"]) == {"distill", "autocoa_data", "sft1", "sft2", "sft3", "rl_sim", "rl_real", "react",
                                   "eval"}
    assert set(full["stages"].values()) == {"ran"}
    assert full["registered"] == {label: f"models:/{REGISTERED[s]}/1" for s, label in (
        ("sft1", "sft1"), ("sft2", "sft12"), ("sft3", "sft123"), ("rl_sim", "sft123_sim"),
        ("rl_real", "sft123_sim_real"), ("react", "react"))}
    assert full["real_tool_calls"]["sft123_sim"] == 0, "the simulated phase ran a tool"
    assert "sft123_sim_real" in full["real_tool_calls"]  # counted (a 2-step policy may well call no tool)
    assert set(full["probes"]) == {"sft1", "sft12", "sft123", "sft123_sim", "sft123_sim_real"}
    assert 0.0 <= full["probes"]["sft1"]["when_to_act"]["accuracy"] <= 1.0
    assert {"sft123_sim_real", "react", "untrained"} <= set(full["action_rates"])
    check_runs(home, full["pipeline_run"])

    chain = run_cli(home, ["lineage", "models:/autocoa-rl/1"])
    assert chain.returncode == 0, chain.stderr[-2000:]
    order = [chain.stdout.index(f"models:/{name}/1") for name in
             ("autocoa-rl", "autocoa-rl-sim", "autocoa-sft3", "autocoa-sft2", "autocoa-sft1")]
    assert order == sorted(order), f"lineage is not RL real -> RL sim -> SFT3 -> SFT2 -> SFT1:\n{chain.stdout}"

    ablation = run_autocoa(home, ["autocoa.stages=[sft1,sft2]", "autocoa.baselines=[]"])
    assert ablation["stages"] == {"distill": "cached", "autocoa_data": "cached", "sft1": "cached", "sft2": "cached",
                                  "eval": "ran"}
    assert ablation["registered"] == {"sft1": "models:/autocoa-sft1/1", "sft12": "models:/autocoa-sft2/1"}


def check_runs(home, run_id: str) -> None:
    """Every model stage (and the evaluation) is its own MLflow run nested under the pipeline run, which carries
    the AutoCoA metrics."""
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow.db'}")
    client = MlflowClient()
    experiment = client.get_experiment_by_name("pipeline")
    children = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{run_id}'")
    stages = sorted(c.data.tags["afm.stage"] for c in children)
    assert stages == ["distill", "eval", "rl", "rl", "sft", "sft", "sft", "sft"]
    # SFT1 trains at its own lr (autocoa.sft1.lr=1e-4 above), the other SFT stages at the recipe's
    recipe_lr = load_config(PipelineConfig, "configs/autocoa.yaml", AUTOCOA_TINY).sft.lr
    lrs = {c.data.tags["mlflow.runName"]: float(c.data.params["lr"]) for c in children
           if c.data.tags["afm.stage"] == "sft"}
    assert lrs == {"autocoa-sft1": 1e-4, "autocoa-sft2": recipe_lr, "autocoa-sft3": recipe_lr,
                   "autocoa-react": recipe_lr} and recipe_lr != 1e-4
    metrics = client.get_run(run_id).data.metrics
    for name in ("rl.sft123_sim.real_tool_calls", "rl.sft123_sim_real.real_tool_calls", "probe.sft1.when_to_act",
                 "eval.sft123_sim_real.heldout.accuracy", "eval.react.heldout.accuracy", "seconds.sft1"):
        assert name in metrics, name


def test_autocoa_recipe_config():
    cfg = load_config(PipelineConfig, "configs/autocoa.yaml")
    default = load_config(PipelineConfig, "configs/default.yaml")
    assert cfg.recipe == "autocoa" and default.recipe == "afm"
    assert (cfg.autocoa.rl_sim_steps, cfg.autocoa.rl_real_steps) == (80, 16), "the paper's 80/16"
    assert cfg.distill == default.distill and cfg.policy == default.policy, "the two recipes share the distill cache"
    assert cfg.eval.gate.candidate == chain_label(list(STAGES)) == "sft123_sim_real"
    assert chain_label(["sft2"]) == "sft2" and chain_label(["sft1", "sft3", "rl_real"]) == "sft13_real"
    with pytest.raises(ConfigError, match="autocoa.stages"):
        load_config(PipelineConfig, "configs/autocoa.yaml", ["autocoa.stages=[sft4]"])
