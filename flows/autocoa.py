"""The AutoCoA recipe (arXiv 2503.06580, issue #23) as pipeline stages, next to AFM's (flows/pipeline.py):

    distill (shared with AFM, same cache) -> AutoCoA data -> base policy
      -> SFT1 when-to-act (pairwise, pairs.jsonl) -> SFT2 how-to-act (coa_cot.jsonl, observations masked)
      -> SFT3 world model (observations learned) -> RL in the simulated environment (N steps)
      -> RL with real tools (M steps) -> probes (when-to-act, world model) -> evaluation side by side with
         AFM (SFT on the CoA data; RL), ReAct (SFT on react.jsonl, SFT2's budget) and, optionally, all-real RL

Every stage is a cached stage artifact (tasks/stages.py: a re-run skips what completed), its own MLflow run
nested under the pipeline run and its own registered version; each model stage starts from the previous
stage's registered version (`afm lineage models:/autocoa-rl/N` lists rl-sim, sft3, sft2, sft1, base). Stages
missing from `autocoa.stages` are skipped, which gives the paper's ablations (SFT1 only, SFT2 only, SFT1+2, ...).

    afm pipeline --config configs/autocoa.yaml [--set autocoa.stages=[sft2] ...]
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from afm import tracking
from afm.config import Config
from afm.paths import afm_home
from distill.autocoa_data import AutoCoADataConfig
from evaluation.report import format_action_table
from evaluation.runner import ProblemSetConfig
from flows.distill import DistillFlowConfig, distill_flow
from flows.evaluate import EvalFlowConfig, evaluate_flow
from flows.pipeline_metrics import StageClock, headline_metrics
from flows.rl import RLFlowConfig, rl_flow
from flows.sft import SFTFlowConfig, sft_flow
from tasks.autocoa import ProbeConfig, autocoa_data_task, eval_action_rates, probes_task
from tasks.stages import default_store_uri
from tasks.train import base_policy_task, fetch

if TYPE_CHECKING:  # flows/pipeline.py imports this module; only its config type is needed here
    from flows.pipeline import PipelineConfig

Stage = Literal["sft1", "sft2", "sft3", "rl_sim", "rl_real"]
Baseline = Literal["afm", "react", "all_real_rl"]
STAGES: tuple[str, ...] = ("sft1", "sft2", "sft3", "rl_sim", "rl_real")
# Registered model of each stage (and of each baseline's SFT / RL stage).
REGISTERED = {"sft1": "autocoa-sft1", "sft2": "autocoa-sft2", "sft3": "autocoa-sft3", "rl_sim": "autocoa-rl-sim",
              "rl_real": "autocoa-rl", "afm_sft": "autocoa-afm-sft", "afm_rl": "autocoa-afm-rl",
              "react": "autocoa-react", "all_real_rl": "autocoa-all-real-rl"}
# Evaluation label of a baseline's policy; an AutoCoA policy's label names the stages it has been through
# (chain_label): sft1, sft2 (SFT2 only), sft12, sft123, sft123_sim, sft123_sim_real (the full recipe).
BASELINE_LABEL = {"afm_sft": "afm_sft", "afm_rl": "afm_rl", "react": "react", "all_real_rl": "sft123_real"}


class SFTStage(Config):
    """One AutoCoA SFT stage: the pipeline's `sft` recipe with this length."""

    max_steps: int = Field(400, ge=1, description="Optimizer steps of the stage.")
    time_budget_s: float | None = Field(None, gt=0, description="Stop the stage after this many seconds of "
                                                                "training (None: max_steps ends it).")
    lr: float | None = Field(None, gt=0, description="Peak learning rate of the stage (None: the `sft` recipe's). "
                                                     "AutoCoA trains SFT1 at 1/10 of SFT2's (5e-6 vs 5e-5).")


class AutoCoAConfig(Config):
    """The AutoCoA recipe: which stages run, their lengths and the comparison it is evaluated in."""

    data: AutoCoADataConfig = Field(default_factory=AutoCoADataConfig, description="How pairs, CoA+CoT and ReAct "
                                                                                   "data are cut from the dataset.")
    stages: list[Stage] = Field(default_factory=lambda: list(STAGES), description="Stages that run, in the "
                                "paper's order whatever the list order; a missing one is skipped (ablations).")
    sft1: SFTStage = Field(default_factory=lambda: SFTStage(max_steps=200), description="When-to-act (pairwise).")
    sft2: SFTStage = Field(default_factory=SFTStage, description="How-to-act: CoA + CoT, observations masked. "
                                                                 "The ReAct and AFM SFT baselines get the same.")
    sft3: SFTStage = Field(default_factory=lambda: SFTStage(max_steps=200), description="World model: "
                                                                                         "observations learned.")
    rl_sim_steps: int = Field(80, ge=1, description="RL steps in the simulated environment (paper: 80).")
    rl_real_steps: int = Field(16, ge=1, description="RL steps with real tools after them (paper: 16).")
    baselines: list[Baseline] = Field(default_factory=lambda: ["afm", "react"], description="Compared policies: "
                                      "afm (SFT on the CoA trajectories, then real RL of sim+real steps), react "
                                      "(SFT on react.jsonl), all_real_rl (real RL from SFT3 for sim+real steps: "
                                      "the tool-call saving of the simulated phase).")
    probes: ProbeConfig = Field(default_factory=ProbeConfig, description="Held-out when-to-act and world-model "
                                                                         "probes of every AutoCoA policy.")
    facts_given_size: int = Field(24, ge=1, description="Facts-given held-out problems evaluated (abstained-when-not).")


def chain_label(stages: list[str]) -> str:
    """The evaluation label of the policy after `stages` (in order): ["sft1", "sft2", "rl_sim"] -> "sft12_sim"."""
    sft = "".join(s[-1] for s in stages if s.startswith("sft"))
    return "_".join([f"sft{sft}" if sft else "base"] + [s[3:] for s in stages if s.startswith("rl_")])


def _registry_uri(model: dict, stage: str) -> str:
    return f"models:/{REGISTERED[stage]}/{model['extra']['model_version']}"


def run_autocoa(config: "PipelineConfig", run_id: str) -> dict:
    """The stages of the module docstring under the pipeline run `run_id`; returns the pipeline summary."""
    cfg, clock = config.autocoa, StageClock()
    store = config.store_uri or default_store_uri()
    dataset = distill_flow(DistillFlowConfig(store_uri=store, distill=config.distill, parent_run_id=run_id))
    data = autocoa_data_task(cfg.data, dataset, store)
    base = base_policy_task(config.policy, dataset, store)
    clock.lap("data")

    def sft(stage: str, start: str, file: str, length: SFTStage, **recipe) -> dict:
        model = sft_flow(SFTFlowConfig(store_uri=store, parent_run_id=run_id, sft=config.sft.model_copy(update={
            "model_path": start, "dataset": dataset["uri"] if file == "train.jsonl" else data["uri"],
            "dataset_file": file, "max_steps": length.max_steps, "time_budget_s": length.time_budget_s,
            "lr": length.lr or config.sft.lr, "run_name": REGISTERED[stage], "registered_model_name": REGISTERED[stage],
            **recipe})))
        clock.lap(stage)
        return model

    def rl(stage: str, start: str, steps: int, simulated: bool) -> dict:
        recipe = config.rl.model_copy(update={
            "policy": start, "steps": steps, "run_name": REGISTERED[stage], "registered_model_name": REGISTERED[stage],
            "rollout": config.rl.rollout.model_copy(update={"simulated_env": simulated})})
        model = rl_flow(RLFlowConfig(store_uri=store, dataset_uri=dataset["uri"], parent_run_id=run_id, rl=recipe))
        clock.lap(stage)
        return model

    # The chain: each stage starts from the registered version of the last stage that ran.
    models: dict[str, dict] = {}
    labels = dict(BASELINE_LABEL)
    start = base
    steps = {"sft1": lambda s: sft("sft1", s, "pairs.jsonl", cfg.sft1, data_format="pairs", objective="pairwise"),
             "sft2": lambda s: sft("sft2", s, "coa_cot.jsonl", cfg.sft2),
             "sft3": lambda s: sft("sft3", s, "coa_cot.jsonl", cfg.sft3, learn_observations=True),
             "rl_sim": lambda s: rl("rl_sim", s, cfg.rl_sim_steps, True),
             "rl_real": lambda s: rl("rl_real", s, cfg.rl_real_steps, False)}
    for stage in STAGES:
        if stage in cfg.stages:
            models[stage] = steps[stage](start)
            start = _registry_uri(models[stage], stage)
            labels[stage] = chain_label(list(models))

    rl_steps = cfg.rl_sim_steps + cfg.rl_real_steps
    if "afm" in cfg.baselines:
        models["afm_sft"] = sft("afm_sft", base, "train.jsonl", cfg.sft2)
        models["afm_rl"] = rl("afm_rl", _registry_uri(models["afm_sft"], "afm_sft"), rl_steps, False)
    if "react" in cfg.baselines:
        models["react"] = sft("react", base, "react.jsonl", cfg.sft2)
    if "all_real_rl" in cfg.baselines and "sft3" in models:
        models["all_real_rl"] = rl("all_real_rl", _registry_uri(models["sft3"], "sft3"), rl_steps, False)

    autocoa_models = {labels[s]: m for s, m in models.items() if s in STAGES}
    probes = probes_task(cfg.probes, autocoa_models, data, config.sft.system_prompt, store) if autocoa_models else None
    clock.lap("probes")

    registered = {labels[s]: _registry_uri(m, s) for s, m in models.items()}
    facts_given = ProblemSetConfig(source=f"{data['uri']}/eval_facts_given.jsonl", size=cfg.facts_given_size)
    gate = config.eval.gate if config.eval.gate and config.eval.gate.candidate in registered else None
    report = evaluate_flow(EvalFlowConfig(store_uri=store, dataset_uri=dataset["uri"], parent_run_id=run_id,
                                          eval=config.eval.model_copy(update={
                                              "models": {"untrained": base, **registered, **config.eval.models},
                                              "problem_sets": {**config.eval.problem_sets, "facts_given": facts_given},
                                              "gate": gate})))
    clock.lap("eval")
    rates = action_rates_of(report["report"], dataset, data, config, afm_home() / "work" / f"autocoa-rates-{run_id}")

    metrics = headline_metrics(_last(models, ("sft3", "sft2", "sft1")) or {"extra": {}},
                               _last(models, ("rl_real", "rl_sim")) or {"extra": {}}, report, clock.seconds)
    metrics.update(autocoa_metrics({labels[s]: m for s, m in models.items()}, probes, rates))
    tracking.log_run_metrics(run_id, {**metrics, "seconds.total": clock.total()})
    summary = {
        "recipe": "autocoa", "dataset": dataset["uri"], "autocoa_data": data["uri"], "base_policy": base,
        "registered": registered, "report": report["report"], "promotion": report["promotion"],
        "probes": probes["extra"]["probes"] if probes else {}, "action_rates": rates,
        "real_tool_calls": {labels[s]: m["extra"]["real_tool_calls"] for s, m in models.items()
                            if "real_tool_calls" in m["extra"]},
        "stages": {name: "cached" if out["cached"] else "ran"
                   for name, out in (("distill", dataset), ("autocoa_data", data), *models.items(), ("eval", report))},
        "mlflow": tracking.configure_tracking(), "pipeline_run": run_id, "seconds": clock.total(),
    }
    print(report["table"])
    print("\nWhen to act (held-out needs-tool episodes; facts-given twins):\n"
          + format_action_table(rates, ["untrained", *registered, *config.eval.models]))
    print("\n".join(["", "AutoCoA pipeline finished:"] + [f"  {k:>15}: {v}" for k, v in summary.items()]))
    return summary


def _last(models: dict[str, dict], order: tuple[str, ...]) -> dict | None:
    return next((models[s] for s in order if s in models), None)


def action_rates_of(report_uri: str, dataset: dict, data: dict, config: "PipelineConfig", work_dir: Path) -> dict:
    """Acted-when-needed on the held-out set, abstained-when-not on its facts-given twin, per evaluated model."""
    files = {"facts_given": fetch(data["uri"], work_dir / "data") / "eval_facts_given.jsonl"}
    heldout = config.eval.problem_sets.get("heldout")
    if heldout is not None and heldout.source.startswith("dataset:"):
        files["heldout"] = fetch(dataset["uri"], work_dir / "dataset") / heldout.source[len("dataset:"):]
    return eval_action_rates(report_uri, files, work_dir)


def autocoa_metrics(models: dict[str, dict], probes: dict | None, rates: dict[str, dict]) -> dict[str, float]:
    """Parent-run metrics from {label: model stage manifest}: real tool calls and wall time of each RL stage, the
    probes, the action rates (names: rl.<label>.real_tool_calls, probe.<label>.when_to_act, action.<label>.<rate>)."""
    out: dict[str, float] = {}
    for label, model in models.items():
        for field in ("real_tool_calls", "wall_s"):
            if model["extra"].get(field) is not None:
                out[f"rl.{label}.{field}"] = float(model["extra"][field])
    for label, probe in (probes["extra"]["probes"] if probes else {}).items():
        if probe["when_to_act"]:
            out[f"probe.{label}.when_to_act"] = probe["when_to_act"]["accuracy"]
        if probe["world_model"] and probe["world_model"]["n"]:
            out[f"probe.{label}.world_model_f1"] = probe["world_model"]["token_f1"]
            out[f"probe.{label}.world_model_fact"] = probe["world_model"]["fact_present"]
    for label, row in rates.items():
        out.update({f"action.{label}.{k}": float(v) for k, v in row.items() if v is not None})
    return out
