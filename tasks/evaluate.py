"""Prefect task for the evaluation stage (`evaluation.runner.evaluate`): tools over the dataset's corpus,
problem sets resolved against the dataset artifact, results stored and published as Prefect artifacts.

A problem-set source `dataset:<file>` names a file of the distilled dataset artifact (e.g. the held-out-entity
set `dataset:eval_heldout.jsonl`); other sources (paths, s3://, `computation`, `humaneval`) pass through.
"""
from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from afm import tracking
from evaluation.report import format_summary_table
from evaluation.runner import EvalConfig, ProblemSetConfig, evaluate
from problems.miniweb import serve_corpus
from tasks.stages import directory_files, retry_on_transient, run_stage, stage_key
from tasks.train import fetch, store_dataset

DATASET_PREFIX = "dataset:"


def resolve_dataset_sources(problem_sets: dict[str, ProblemSetConfig], data: Path) -> dict[str, ProblemSetConfig]:
    """`dataset:<file>` sources pointed at `<file>` in the fetched dataset directory `data`; others unchanged."""
    return {label: ps.model_copy(update={"source": str(data / ps.source[len(DATASET_PREFIX):])})
            if ps.source.startswith(DATASET_PREFIX) else ps
            for label, ps in problem_sets.items()}


@task(name="evaluate", retries=1, retry_delay_seconds=10, retry_condition_fn=retry_on_transient)
def evaluate_task(cfg: EvalConfig, dataset: dict, store_uri: str = "", parent_run_id: str = "") -> dict:
    """Evaluate `cfg.models` (+ the teacher) and apply the promotion gate; returns the report manifest with the
    printable table under extra.table. The eval run (nested under `parent_run_id` when given) records the
    dataset's problem sets and corpus as its inputs, by their store URIs."""
    key = stage_key("eval", cfg, {"dataset": dataset["digest"]})

    def produce(work_dir: Path):
        data = fetch(dataset["uri"], work_dir / "dataset")
        sets = resolve_dataset_sources(cfg.problem_sets, data)
        inputs = [store_dataset(dataset, ps.source[len(DATASET_PREFIX):], "evaluation")
                  for ps in cfg.problem_sets.values() if ps.source.startswith(DATASET_PREFIX)]
        inputs.append(store_dataset(dataset, "corpus.jsonl", "tools"))
        with serve_corpus(cfg.toolbox, data / "corpus.jsonl", corpus_uri=f"{dataset['uri']}/corpus.jsonl") as toolbox, \
                tracking.stage_scope(parent_run_id, inputs, stage="eval"):
            result = evaluate(cfg.model_copy(update={"problem_sets": sets, "toolbox": toolbox,
                                                     "output_dir": str(work_dir / "report")}))
        decision = None
        if result.promotion is not None:
            decision = {"alias": result.promotion.alias, "reason": result.promotion.reason,
                        "candidate_score": result.promotion.candidate_score,
                        "champion_score": result.promotion.champion_score}
        extra = {"stage_key": key, "summary": result.summary_rows, "efficiency": result.efficiency_rows,
                 "markdown": result.markdown, "table": format_summary_table(result.summary_rows, result.efficiency_rows),
                 "promotion": decision}
        return directory_files(work_dir / "report"), extra

    manifest = run_stage("eval", key, store_uri, produce, kind="report")
    create_markdown_artifact(manifest["extra"]["markdown"], key="evaluation-summary",
                             description=f"Evaluation report {manifest['uri']}")
    create_table_artifact(manifest["extra"]["summary"], key="evaluation-table",
                          description="Accuracy, pass@k, tokens and tool calls per problem, per model and set")
    return manifest
