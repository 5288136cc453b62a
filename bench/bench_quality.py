"""Quality benchmark: does the `quality` preset reach the issue's targets? Runs the whole pipeline
(`afm pipeline --config configs/quality.yaml`) under its own AFM_HOME, then reads the stage artifacts and the
eval report and appends JSON lines to bench/results/quality.jsonl:
    {"bench": "quality", "metric", "value", "target", "unit", "detail"}

Metrics: teacher / SFT / RL accuracy on held-out-entity problems (eval set `heldout`), SFT/teacher ratio
(target 0.7), RL/teacher ratio (#26: target 0.95), RL - SFT points (target 5), the SFT and RL lines again under
greedy decoding (`*_greedy`: one temperature-0 episode per problem, evaluated here after the pipeline),
train-entity accuracy of SFT and RL (memorization vs generalization), and each stage's wall time (distill: its
own count; the others: between manifests' created_at; the whole pipeline: #26's target <= 1,800 s).
`detail` carries pass@k, failure shares, the SFT step count / loss and the last RL step's metrics, so a miss
can be read off the row.

Takes ~31 min on 2 cores (distill ~2 min, SFT 17, RL 6.5, eval ~2, then this bench's greedy eval ~1). Stages
are cached by config hash, so re-running with the same --afm-home after a crash redoes only the unfinished
stage; `--no-run` only reads an existing AFM_HOME (e.g. one a pipeline run already filled).

Run:  .venv/bin/python bench/bench_quality.py [--afm-home /tmp/afm-quality] [--config configs/quality.yaml]
                                              [--no-run] [--set sft.time_budget_s=600 ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "quality.jsonl"
# Pipeline order: a stage's time is its manifest's created_at minus the previous stage's.
STAGES = ("distill", "policy", "sft", "rl", "eval")


def record(metric: str, value: float, target: float | None, unit: str, detail: dict,
           results: Path = RESULTS) -> dict:
    """Append one row to `results` (bench name = the file's stem) and print it."""
    row = {"bench": results.stem, "metric": metric, "value": round(value, 4), "target": target, "unit": unit,
           "detail": detail}
    results.parent.mkdir(parents=True, exist_ok=True)
    with open(results, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    return row


def run_pipeline(afm_home: Path, config: Path, overrides: list[str]) -> float:
    """Run `afm pipeline` with AFM_HOME=afm_home; returns its start time (epoch seconds)."""
    afm_home.mkdir(parents=True, exist_ok=True)
    cmd = [str(ROOT / ".venv" / "bin" / "afm"), "pipeline", "--config", str(config)]
    for item in overrides:
        cmd += ["--set", item]
    started = time.time()
    log = afm_home / "pipeline.log"
    with open(log, "a", encoding="utf-8") as out:
        proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "AFM_HOME": str(afm_home)}, stdout=out,
                              stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        sys.exit(f"bench_quality: `{' '.join(cmd)}` exited {proc.returncode}; see {log}")
    return started


def newest_manifests(afm_home: Path) -> dict[str, dict]:
    """{stage: manifest} of the newest completed artifact of each pipeline stage under afm_home."""
    stages_dir = afm_home / "artifacts" / "stages"
    found: dict[str, dict] = {}
    for path in sorted(stages_dir.glob("*/manifest.json")):
        stage = path.parent.name.rsplit("-", 1)[0]
        manifest = json.loads(path.read_text(encoding="utf-8"))
        manifest["dir"] = path.parent
        if stage in STAGES and (stage not in found or manifest["created_at"] > found[stage]["created_at"]):
            found[stage] = manifest
    missing = [s for s in STAGES if s not in found]
    if missing:
        sys.exit(f"bench_quality: no completed {missing} stage under {stages_dir}; run the pipeline first "
                 "(drop --no-run)")
    return found


def stage_seconds(manifests: dict[str, dict], started: float | None) -> dict[str, float]:
    """Wall seconds per stage: distill's own count, the others from consecutive manifest timestamps (so a
    stage's time includes the flow's bookkeeping between stages, and any restart in between). With `started`
    (this bench ran the pipeline), a stage made before it was a cache hit (0 s) and the first stage made in
    this run counts from `started`, not from an older cached predecessor."""
    times = [datetime.fromisoformat(manifests[s]["created_at"]).timestamp() for s in STAGES]
    cached = [started is not None and t < started for t in times]
    out = {"distill": 0.0 if cached[0] else manifests["distill"]["extra"]["counts"]["total_seconds"]}
    for i, stage in enumerate(STAGES[1:], 1):
        out[stage] = 0.0 if cached[i] else round(times[i] - max(times[i - 1], started or 0.0), 1)
    return out


def summary_row(rows: list[dict], model: str, problem_set: str) -> dict:
    for row in rows:
        if row["model"] == model and row["set"] == problem_set:
            return row
    sys.exit(f"bench_quality: the eval summary has no row for model {model!r} on set {problem_set!r}")


def brief(row: dict) -> dict:
    """The parts of a summary row worth keeping in `detail`."""
    return {k: v for k, v in row.items() if k in ("problems", "samples", "pass@1", "pass@3", "tokens/problem",
                                                  "tool_calls/problem") or k.startswith("failure.")}


def greedy_heldout_accuracy(afm_home: Path, config: Path, manifests: dict[str, dict]) -> dict[str, dict]:
    """SFT and RL on the held-out set once more, greedy (temperature 0, one episode per problem): the accuracy a
    deployed model shows, next to the pipeline's sampled accuracy (temperature 0.7, the mean over samples,
    which pays for every garbled sampled copy). Same set, tools, turn and token limits as the pipeline's eval.
    Returns {model: summary row}."""
    os.environ["AFM_HOME"] = str(afm_home)  # MLflow of this run (the eval logs a run there)
    from afm.config import load_config
    from evaluation.runner import evaluate
    from flows.pipeline import PipelineConfig
    from problems.miniweb import serve_corpus
    from tasks.evaluate import resolve_dataset_sources
    from tasks.train import fetch

    eval_cfg = load_config(PipelineConfig, config).eval
    work = afm_home / "bench-greedy"
    data = fetch(manifests["distill"]["uri"], work / "dataset")
    models = {m: str(fetch(manifests[m]["uri"], work / m)) for m in ("sft", "rl")}
    sets = resolve_dataset_sources({"heldout": eval_cfg.problem_sets["heldout"]}, data)
    with serve_corpus(eval_cfg.toolbox, data / "corpus.jsonl") as toolbox:
        result = evaluate(eval_cfg.model_copy(update={
            "models": models, "include_teacher": False, "problem_sets": sets, "toolbox": toolbox,
            "temperature": 0.0, "n_samples": 1, "ks": [1], "gate": None, "output_dir": str(work / "report"),
            "run_name": "eval-greedy"}))
    return {row["model"]: row for row in result.summary_rows}


def report(afm_home: Path, config: Path, started: float | None, overrides: list[str]) -> None:
    manifests = newest_manifests(afm_home)
    seconds = stage_seconds(manifests, started)
    if started is not None:  # the pipeline's wall time, before this bench's own greedy eval below
        seconds["pipeline"] = round(time.time() - started, 1)
    summary = json.loads((manifests["eval"]["dir"] / "summary.json").read_text(encoding="utf-8"))["summary"]
    sft_extra = manifests["sft"]["extra"]
    common = {"config": str(config.relative_to(ROOT) if config.is_relative_to(ROOT) else config),
              "afm_home": str(afm_home), "overrides": overrides}

    teacher = summary_row(summary, "teacher", "heldout")
    sft = summary_row(summary, "sft", "heldout")
    rl = summary_row(summary, "rl", "heldout")
    untrained = summary_row(summary, "untrained", "heldout")
    record("teacher_heldout_accuracy", teacher["accuracy"], None, "fraction", {**brief(teacher), **common})
    record("sft_heldout_accuracy", sft["accuracy"], None, "fraction",
           {**brief(sft), "untrained_accuracy": untrained["accuracy"], "sft_steps": sft_extra["steps"],
            "sft_final_loss": round(sft_extra["final_loss"], 4), **common})
    ratio = sft["accuracy"] / teacher["accuracy"] if teacher["accuracy"] else 0.0
    record("sft_over_teacher_heldout", ratio, 0.7, "ratio",
           {"sft": sft["accuracy"], "teacher": teacher["accuracy"], **common})
    record("rl_heldout_accuracy", rl["accuracy"], None, "fraction",
           {**brief(rl), "rl_history_last": manifests["rl"]["extra"].get("history"), **common})
    record("rl_over_teacher_heldout", rl["accuracy"] / teacher["accuracy"] if teacher["accuracy"] else 0.0, 0.95,
           "ratio", {"rl": rl["accuracy"], "teacher": teacher["accuracy"], "issue": "#26", **common})
    record("rl_minus_sft_heldout_points", 100 * (rl["accuracy"] - sft["accuracy"]), 5.0, "points",
           {"rl": rl["accuracy"], "sft": sft["accuracy"], "problems": rl["problems"], "samples": rl["samples"],
            **common})
    greedy = greedy_heldout_accuracy(afm_home, config, manifests)
    for model in ("sft", "rl"):
        record(f"{model}_heldout_accuracy_greedy", greedy[model]["accuracy"], None, "fraction",
               {**brief(greedy[model]), "sampled_accuracy": summary_row(summary, model, "heldout")["accuracy"],
                "note": "temperature 0, one episode per problem (the teacher is deterministic too)", **common})
    record("sft_over_teacher_heldout_greedy", greedy["sft"]["accuracy"] / teacher["accuracy"], 0.7, "ratio",
           {"sft": greedy["sft"]["accuracy"], "teacher": teacher["accuracy"], **common})
    record("rl_minus_sft_heldout_points_greedy", 100 * (greedy["rl"]["accuracy"] - greedy["sft"]["accuracy"]), 5.0,
           "points", {"rl": greedy["rl"]["accuracy"], "sft": greedy["sft"]["accuracy"],
                      "problems": greedy["rl"]["problems"], **common})
    for model in ("sft", "rl"):
        row = summary_row(summary, model, "train_entities")
        record(f"{model}_train_entities_accuracy", row["accuracy"], None, "fraction",
               {**brief(row), "heldout_accuracy": summary_row(summary, model, "heldout")["accuracy"],
                "note": "train entities, unseen questions: a gap over heldout = memorized names", **common})
    for stage, value in seconds.items():
        # #26: the preset tells the paper's whole story (distill -> SFT -> RL -> eval) in <= 30 min on 2 cores
        record(f"stage_seconds_{stage}", value, 1800.0 if stage == "pipeline" else None, "s",
               {"all_stages": seconds, **common})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--afm-home", type=Path, default=Path("/tmp/afm-quality"), help="AFM_HOME of the run")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "quality.yaml", help="pipeline recipe")
    parser.add_argument("--no-run", action="store_true", help="only read the artifacts already in --afm-home")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="pipeline override key=value")
    args = parser.parse_args()
    config = args.config.resolve()
    started = None if args.no_run else run_pipeline(args.afm_home, config, args.overrides)
    report(args.afm_home.resolve(), config, started, args.overrides)


if __name__ == "__main__":
    main()
