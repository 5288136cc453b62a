"""Prefect tasks of the AutoCoA recipe (issue #23) besides the SFT/RL/eval ones it shares with AFM (tasks/train.py,
tasks/evaluate.py): the AutoCoA data stage, the when-to-act / world-model probes and the action rates of an
evaluation. Cached like every stage (tasks/stages.py): a re-run with the same inputs reads the manifest.

Used by flows/autocoa.py; the logic lives in distill/autocoa_data.py, evaluation/when_to_act.py and
evaluation/world_model.py.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from pydantic import Field
from prefect import task

from afm.config import Config
from distill.autocoa_data import AutoCoADataConfig, write_autocoa_data
from distill.autocoa_pairs import read_pairs
from evaluation.records import read_records
from evaluation.when_to_act import action_rates, when_to_act_accuracy
from evaluation.world_model import read_observation_examples, world_model_fidelity
from problems.records import read_problems
from tasks.stages import default_store_uri, directory_files, retry_on_transient, run_stage, stage_key
from tasks.train import fetch


class ProbeConfig(Config):
    """Sizes of the held-out probes run on every AutoCoA stage's policy."""

    pairs: int = Field(200, ge=1, description="Held-out when-to-act pairs scored (the first N of pairs_heldout.jsonl).")
    observations: int = Field(64, ge=1, description="Held-out tool calls whose observation the policy writes "
                                                    "(the first N of observations_heldout.jsonl).")
    max_new_tokens: int = Field(96, ge=1, description="Tokens the policy may write for one observation.")


@task(name="autocoa-data", retries=1, retry_delay_seconds=10, retry_condition_fn=retry_on_transient)
def autocoa_data_task(cfg: AutoCoADataConfig, dataset: dict, store_uri: str = "") -> dict:
    """AutoCoA's pairs / CoA+CoT / ReAct / held-out files cut from the distilled dataset, as a stage artifact."""
    key = stage_key("autocoa-data", cfg, {"dataset": dataset["digest"]})

    def produce(work_dir: Path):
        data = fetch(dataset["uri"], work_dir / "dataset")
        counts = write_autocoa_data(data, work_dir / "autocoa", cfg)
        shutil.rmtree(data)
        return directory_files(work_dir / "autocoa"), {"stage_key": key, "counts": counts}

    return run_stage("autocoa-data", key, store_uri or default_store_uri(), produce, kind="dataset")


@task(name="autocoa-probes", retries=1, retry_delay_seconds=10, retry_condition_fn=retry_on_transient)
def probes_task(cfg: ProbeConfig, models: dict[str, dict], data: dict, system_prompt: str | None = None,
                store_uri: str = "") -> dict:
    """When-to-act accuracy on held-out pairs and world-model fidelity on held-out tool calls of each policy in
    `models` ({label: model stage manifest}); returns the manifest with extra.probes = {label: {...}}."""
    key = stage_key("autocoa-probes", cfg, {"data": data["digest"], "system_prompt": system_prompt,
                                            "models": {label: m["digest"] for label, m in models.items()}})

    def produce(work_dir: Path):
        files = fetch(data["uri"], work_dir / "data")
        pairs = list(read_pairs(files / "pairs_heldout.jsonl"))[:cfg.pairs]
        examples = list(read_observation_examples(files / "observations_heldout.jsonl"))[:cfg.observations]
        probes = {}
        for label, model in models.items():
            policy = fetch(model["uri"], work_dir / "policies" / label)
            probes[label] = {
                "when_to_act": when_to_act_accuracy(policy, pairs, system_prompt) if pairs else None,
                "world_model": world_model_fidelity(policy, examples, cfg.max_new_tokens, system_prompt,
                                                    predictions_path=work_dir / f"observations-{label}.jsonl")
                if examples else None}
            shutil.rmtree(policy)
        (work_dir / "probes.json").write_text(json.dumps(probes, indent=2))
        out = {"probes.json": work_dir / "probes.json"}
        out.update({p.name: p for p in work_dir.glob("observations-*.jsonl")})
        return out, {"stage_key": key, "probes": probes}

    return run_stage("autocoa-probes", key, store_uri or default_store_uri(), produce, kind="report")


def eval_action_rates(report_uri: str, problem_files: dict[str, Path], work_dir: Path) -> dict[str, dict]:
    """{model: action_rates} over the evaluation episodes of the sets in `problem_files` ({set label: problem
    JSONL}): acted-when-needed on the needs-tool sets, abstained-when-not on the facts-given one."""
    report = fetch(report_uri, work_dir / "report")
    problems = [p for path in problem_files.values() for p in read_problems(path)]
    records = [r for r in read_records(report / "episodes.jsonl") if r.problem_set in problem_files]
    models = sorted({r.model for r in records})
    return {m: action_rates([r for r in records if r.model == m], problems) for m in models}
