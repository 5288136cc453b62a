"""Evaluate models (and the teacher MAS) on problem sets: per-episode JSONL, a summary table, plots, MLflow,
and the promotion gate.

Any model the platform can load is accepted: a local save_pretrained directory, `s3://...` artifact, or an
MLflow registry URI (`models:/name@alias`, `models:/name/3`, shorthand `name@alias`), resolved via
`afm.tracking.resolve_model_uri`.

Where the work runs: model episodes run on the RL rollout pool (`training.rl_pool.RolloutPool`, `pool`):
`pool.rollout_workers` engine replicas (HF on CPU, vLLM on GPU), each generating its share of a chunk of
problems in one batched `engine.generate` call per turn, tools on CPU tool actors; the 2-core default is one
actor. One pool serves every model of an evaluation that has the same architecture and tokenizer as the one
before it (`ModelPool`: the actors swap weights instead of starting again). Sampling seeds are per episode (seed, problem index in its set, sample, turn), so the records do not
depend on the number of replicas. The teacher runs in process or on the distillation stage's Ray actor pool
(`teacher_ray_actors`), see evaluation.teacher_eval.

Usage:
    cfg = load_config(EvalConfig, "configs/eval.yaml")
    result = evaluate(cfg)
    print(format_summary_table(result.summary_rows, result.efficiency_rows))
"""
from __future__ import annotations

import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import matplotlib.pyplot as plt
import mlflow
from pydantic import Field
from tqdm import tqdm

from afm import tracking
from afm.config import Config
from agents.teacher.mas import TeacherConfig
from agents.tools.sandbox import SandboxLimits
from agents.tools.toolbox import ToolboxConfig
from evaluation.grading import episode_to_record
from afm.lineage import is_registry_uri, normalize_model_uri, resolve_registry_version
from evaluation.metrics import accuracy
from evaluation.promotion import (
    CHAMPION, PromotionDecision, apply_promotion, current_champion_version, decide_promotion,
)
from evaluation.records import EvalRecord, write_records
from evaluation.report import efficiency_rows, save_plots, summary_markdown, summary_rows, tts_curves
from evaluation.teacher_eval import TEACHER_LABEL, evaluate_teacher, resolve_teacher
from problems.computation import computation_problems
from problems.humaneval import humaneval_problems
from problems.loaders import load_problems
from problems.records import Problem
from training.rewards import Judge
from training.rewards import build_judge as rewards_build_judge
from training.rl_pool import PoolConfig, RolloutPool, same_architecture
from training.rl_rollout import RolloutConfig

CHAMPION_LABEL = "champion"  # label of the current champion's records when the gate re-evaluates it


class ProblemSetConfig(Config):
    """One problem set: a file/URI any `problems.loaders` format reads, or a built-in source."""

    source: str = Field(..., description="Path or s3:// URI of a dataset (Problem JSONL, hotpotqa, gsm8k, afm_qa, "
                                         "verl, math); or 'humaneval' (the installed package's 164 problems); or "
                                         "'computation' (freshly generated test-split computation problems).")
    size: int = Field(20, ge=1, description="Problems taken from the source (the first `size`).")
    seed: int = Field(0, description="Seed of generated sources ('computation').")


class GateConfig(Config):
    """Promotion gate: which evaluated model is the candidate and what it must beat."""

    candidate: str = Field(..., description="Label in `models` of the candidate; its URI must be models:/name/version "
                                            "or models:/name@alias so the alias can be set.")
    problem_set: str = Field(..., description="Label in `problem_sets` the decision is made on (accuracy).")
    margin: float = Field(0.02, ge=0.0, description="Accuracy the candidate must gain over the champion.")


class EvalConfig(Config):
    """What to evaluate, on what, and how."""

    models: dict[str, str] = Field(default_factory=dict, description="{label: model URI}: local dir, s3:// artifact, "
                                                                     "models:/name@alias, models:/name/version, or "
                                                                     "the registry shorthand name@alias.")
    include_teacher: bool = Field(True, description="Also run the teacher MAS on every set (efficiency baseline).")
    teacher: TeacherConfig | None = Field(None, description="The teacher MAS and its backend; None = the teacher "
                                                            "that distilled the dataset of the problem sets (its "
                                                            "report.json), else the default scripted oracle.")
    teacher_ray_actors: int = Field(0, ge=0, description="0: teacher runs in this process; N: on the distillation "
                                                         "stage's pool of N Ray actors (LLM teachers, big sets).")
    problem_sets: dict[str, ProblemSetConfig] = Field(default_factory=dict, description="{label: problem set}.")
    n_samples: int = Field(3, ge=1, description="Episodes per problem (pass@k needs k <= n_samples).")
    ks: list[int] = Field(default_factory=lambda: [1, 3], min_length=1, description="k values reported as pass@k.")
    temperature: float = Field(0.7, ge=0.0, description="Sampling temperature (0 = greedy; then all samples agree).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_turns: int = Field(8, ge=1, description="Generation turns per episode (AFM: 25 web, 8 code).")
    max_new_tokens: int = Field(128, ge=1, description="Tokens one turn may generate.")
    token_budget: int = Field(768, ge=1, description="Response tokens per episode (generated + observations).")
    system_prompt: str | None = Field(None, description="System prompt; must be the one the models were trained with.")
    problems_per_batch: int = Field(8, ge=1, description="Problems whose episodes one rollout actor generates "
                                                          "together (memory vs speed).")
    toolbox: ToolboxConfig = Field(default_factory=ToolboxConfig, description="Tools models and teacher may call.")
    judge: Literal["normalized_match", "llm"] = Field("normalized_match", description="Judge for QA answers.")
    judge_base_url: str = Field("", description="OpenAI-compatible endpoint of the LLM judge (judge='llm').")
    judge_model: str = Field("", description="Model name at the judge endpoint (judge='llm').")
    judge_concurrency: int = Field(8, ge=1, description="Episodes graded at once (LLM-judge requests and HumanEval "
                                                        "test runs in flight).")
    test_timeout_s: float = Field(10.0, gt=0, description="Sandbox wall-clock limit for running HumanEval tests.")
    gate: GateConfig | None = Field(None, description="Promotion gate; None = no registry change.")
    output_dir: str = Field("runs/eval", description="Per-episode JSONL, summary JSON/markdown and PNG plots go here.")
    mlflow_experiment: str = Field("eval", description="MLflow experiment of the run.")
    run_name: str = Field("eval", description="MLflow run name.")
    pool: PoolConfig = Field(default_factory=PoolConfig, description="Rollout actors the models run on (engine "
                                                                      "replicas, GPUs, tool actors).")
    seed: int = Field(0, description="Seeds sampling (same seed, model and config -> same episodes).")


@dataclass
class EvalResult:
    summary_rows: list[dict]
    efficiency_rows: list[dict]
    per_problem_path: Path
    plots: list[Path]
    markdown: str
    tts: dict[str, dict[str, dict[int, float]]]  # {model: {"pass@k": {k: v}, "majority@k": {k: v}}}
    promotion: PromotionDecision | None = None
    records: list[EvalRecord] = field(default_factory=list, repr=False)


def load_problem_set(cfg: ProblemSetConfig) -> list[Problem]:
    """The first `cfg.size` problems of the set; bad rows in a file raise, naming file and line."""
    if cfg.source == "humaneval":
        return humaneval_problems()[: cfg.size]
    if cfg.source == "computation":
        return computation_problems(cfg.size, rng_seed=cfg.seed, split="test")
    return load_problems(cfg.source, split="test", limit=cfg.size, strict=True).problems


def build_judge(cfg: EvalConfig) -> Judge:
    """The configured judge; LLM verdicts cached under <output_dir>/judge-cache (a re-run re-asks nothing)."""
    return rewards_build_judge(cfg.judge, cfg.judge_base_url, cfg.judge_model, Path(cfg.output_dir) / "judge-cache")


def rollout_config(cfg: EvalConfig) -> RolloutConfig:
    return RolloutConfig(group_size=cfg.n_samples, max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens,
                         token_budget=cfg.token_budget, temperature=cfg.temperature, top_p=cfg.top_p,
                         system_prompt=cfg.system_prompt)


class ModelPool:
    """The rollout pool of one evaluation, kept from model to model: the next model of the same architecture and
    tokenizer is swapped in (`RolloutPool.switch_policy`), any other gets a new pool."""

    def __init__(self, cfg: EvalConfig):
        self.cfg, self.pool, self.model_dir = cfg, None, None

    def serving(self, model_dir: Path) -> RolloutPool:
        if self.pool is not None and same_architecture(self.model_dir, model_dir):
            self.pool.switch_policy(model_dir)
        else:
            self.close()
            self.pool = RolloutPool(self.cfg.pool, model_dir, self.cfg.toolbox)
        self.model_dir = model_dir
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None


def evaluate_model(label: str, uri: str, problem_sets: dict[str, list[Problem]], cfg: EvalConfig,
                   judge: Judge, limits: SandboxLimits, work_dir: Path, pools: ModelPool) -> list[EvalRecord]:
    """All episodes of one model on every set (n_samples per problem), batched `problems_per_batch` at a time,
    on the evaluation's pool (`pools`)."""
    import ray

    from afm.ray_local import init_local_ray

    if not ray.is_initialized():
        init_local_ray()
    model_dir = tracking.resolve_model_uri(normalize_model_uri(uri), work_dir / label)
    rollout = rollout_config(cfg)
    records: list[EvalRecord] = []
    total = sum(len(ps) for ps in problem_sets.values())
    chunk_size = cfg.problems_per_batch * cfg.pool.rollout_workers
    pool = pools.serving(model_dir)
    with tqdm(total=total, desc=f"eval {label}", unit="problem") as bar:
        for set_label, problems in problem_sets.items():
            for start in range(0, len(problems), chunk_size):
                chunk = problems[start:start + chunk_size]
                episodes = pool.rollout(chunk, list(range(start, start + len(chunk))), rollout, seed=cfg.seed * 7919)
                with ThreadPoolExecutor(cfg.judge_concurrency, thread_name_prefix="eval-judge") as graders:
                    records += graders.map(lambda ep: episode_to_record(ep, label, set_label, judge, limits),
                                           episodes)
                bar.update(len(chunk))
    return records


def run_gate(cfg: EvalConfig, records: list[EvalRecord], problem_sets: dict[str, list[Problem]],
             judge: Judge, limits: SandboxLimits, work_dir: Path, pools: ModelPool) -> tuple[PromotionDecision, list[EvalRecord]]:
    """Evaluate the current champion on the gate set next to the candidate (same problems and sampling),
    decide, and apply the alias. Returns the decision and the champion's records (added to the report)."""
    gate = cfg.gate
    if gate.candidate not in cfg.models:
        raise ValueError(f"EvalConfig: gate.candidate {gate.candidate!r} is not a label in models {sorted(cfg.models)}")
    if gate.problem_set not in problem_sets:
        raise ValueError(f"EvalConfig: gate.problem_set {gate.problem_set!r} is not in problem_sets")
    uri = normalize_model_uri(cfg.models[gate.candidate])
    if not is_registry_uri(uri):
        raise ValueError(f"EvalConfig: gate.candidate {gate.candidate!r} has URI {uri!r}; the gate needs a registry "
                         "URI (models:/name/version) to set an alias on")
    name, version = resolve_registry_version(uri)
    candidate_score = accuracy([r for r in records if r.model == gate.candidate and r.problem_set == gate.problem_set])
    champion_version = current_champion_version(name)
    if champion_version == version:  # re-evaluating the champion itself changes nothing
        return PromotionDecision(CHAMPION, "is the current champion", candidate_score, candidate_score,
                                 gate.margin), []
    champion_records: list[EvalRecord] = []
    champion_score = None
    if champion_version is not None:
        champion_records = evaluate_model(CHAMPION_LABEL, f"models:/{name}/{champion_version}",
                                          {gate.problem_set: problem_sets[gate.problem_set]}, cfg, judge,
                                          limits, work_dir, pools)
        champion_score = accuracy(champion_records)
    decision = decide_promotion(candidate_score, champion_score, gate.margin)
    apply_promotion(name, version, decision, gate.problem_set, champion_version)
    return decision, champion_records


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def metric_name(*parts: str) -> str:
    """MLflow metric names allow letters, digits, `_-./ ` only: "sft.multihop.pass@3" -> "sft.multihop.pass_at_3"."""
    return ".".join(parts).replace("@", "_at_")


def log_to_mlflow(rows: list[dict], eff_rows: list[dict], markdown: str, figures: dict, out_dir: Path) -> None:
    """Metrics `<model>.<set>.<column>` and `<model>.vs_teacher.<column>`, tables, markdown, episodes, plots."""
    for row in rows:
        tracking.log_metrics({metric_name(row["model"], row["set"], key): value for key, value in row.items()
                              if isinstance(value, (int, float)) and key not in ("problems", "samples")}, step=0)
    for row in eff_rows:
        tracking.log_metrics({metric_name(row["model"], "vs_teacher", key): value for key, value in row.items()
                              if key != "model" and value is not None}, step=0)
    tracking.log_table_rows(rows, "summary.json")
    tracking.log_table_rows(eff_rows, "efficiency.json")
    mlflow.log_text(markdown, "summary.md")
    mlflow.log_artifact(str(out_dir / "episodes.jsonl"))
    for name, fig in figures.items():
        tracking.log_figure(fig, name)


def promotion_markdown(candidate: str, decision: PromotionDecision) -> str:
    champion = "-" if decision.champion_score is None else f"{decision.champion_score:.3f}"
    return (f"\n## Promotion\n\n{candidate}: **{decision.alias}** ({decision.reason}; candidate "
            f"{decision.candidate_score:.3f}, champion {champion})\n")


def evaluate(cfg: EvalConfig) -> EvalResult:
    """Run every model (and the teacher) on every problem set; write, plot, log, and apply the gate."""
    if not cfg.problem_sets:
        raise ValueError("EvalConfig: field 'problem_sets' is empty; name at least one problem set")
    if min(cfg.ks) < 1 or max(cfg.ks) > cfg.n_samples:
        raise ValueError(f"EvalConfig: field 'ks' {cfg.ks} needs 1 <= k <= n_samples={cfg.n_samples}; "
                         "sample at least max(ks) episodes per problem")
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    per_problem_path = out_dir / "episodes.jsonl"
    problem_sets = {label: load_problem_set(ps) for label, ps in cfg.problem_sets.items()}
    judge = build_judge(cfg)
    limits = SandboxLimits(timeout_s=cfg.test_timeout_s, cpu_s=int(cfg.test_timeout_s) + 1)
    records: list[EvalRecord] = []
    decision = None
    with tracking.start_run(cfg.mlflow_experiment, cfg.run_name, params=cfg.model_dump(mode="json")), \
            tempfile.TemporaryDirectory(prefix="afm-eval-") as tmp:
        pools = ModelPool(cfg)
        if cfg.include_teacher:
            teacher = resolve_teacher(cfg.teacher, [ps.source for ps in cfg.problem_sets.values()])
            records += evaluate_teacher(problem_sets, teacher, cfg.toolbox, cfg.n_samples, cfg.teacher_ray_actors,
                                        judge, limits, Path(tmp))
            write_records(per_problem_path, records)  # after each model: a crash keeps what is done
        try:
            for label, uri in cfg.models.items():
                records += evaluate_model(label, uri, problem_sets, cfg, judge, limits, Path(tmp), pools)
                write_records(per_problem_path, records)
            if cfg.gate is not None:
                decision, champion_records = run_gate(cfg, records, problem_sets, judge, limits, Path(tmp), pools)
                records += champion_records
                write_records(per_problem_path, records)
        finally:
            pools.close()
        rows = summary_rows(records, cfg.ks)
        eff_rows = efficiency_rows(records, TEACHER_LABEL)
        markdown = summary_markdown(rows, eff_rows)
        if decision is not None:
            markdown += promotion_markdown(cfg.gate.candidate, decision)
        curves = tts_curves(records, max_k=cfg.n_samples)
        write_text_atomic(out_dir / "summary.json", json.dumps(
            {"summary": rows, "efficiency": eff_rows, "tts": curves}, indent=2))
        write_text_atomic(out_dir / "summary.md", markdown)
        figures = save_plots(rows, eff_rows, curves, out_dir)
        log_to_mlflow(rows, eff_rows, markdown, figures, out_dir)
        tracking.log_table_rows([{"model": m, **c} for m, c in curves.items()], "tts.json")
        for fig in figures.values():
            plt.close(fig)
    return EvalResult(rows, eff_rows, per_problem_path, [out_dir / name for name in figures], markdown, curves,
                      decision, records)
