"""Default-recipe benchmark: what `make run` does on 2 cores. Runs `afm pipeline --config configs/default.yaml`
under a fresh AFM_HOME and appends JSON lines to bench/results/default.jsonl:
    {"bench": "default", "metric", "value", "target", "unit", "detail"}

Metrics: filtered trajectories (target >= 2,000), whole-pipeline seconds (target <= 900: the 15 minutes the
recipe promises) and each stage's (RL target <= 300), the RL reward curve (mean reward of the first and last
third of the steps, and the rise in standard errors, target >= 2: the issue's "its reward curve rises"),
accuracy / format-error rate of the untrained, SFT and RL models from the pipeline's eval, and #26's lines:
RL held-out accuracy (target >= 0.5), RL minus SFT held-out (target >= +5 points), RL pass@3 minus pass@1 on
held-out (target >= +10 points), RL tokens per solved problem against the teacher's (target <= -84.6%).
`--median` prints each of those lines' median over the last runs in the results file (#26: median of 3).

Takes ~14 min on 2 cores. `--no-run` only reads an existing AFM_HOME (e.g. the one `make run` filled).

Run:  .venv/bin/python bench/bench_default.py [--afm-home DIR] [--no-run] [--set rl.time_budget_s=200 ...]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from bench_quality import ROOT, newest_manifests, record, run_pipeline, stage_seconds, summary_row

RESULTS = ROOT / "bench" / "results" / "default.jsonl"
CONFIG = ROOT / "configs" / "default.yaml"


def thirds(values: list[float]) -> dict[str, float]:
    """Mean of the first and last third of a per-step curve and the rise between them in standard errors
    (Welch: the two thirds as independent samples; steps are noisy, so a bare difference says little)."""
    n = max(1, len(values) // 3)
    first, last = values[:n], values[-n:]

    def mean_var(xs: list[float]) -> tuple[float, float]:
        m = sum(xs) / len(xs)
        return m, sum((x - m) ** 2 for x in xs) / max(1, len(xs) - 1)

    (m1, v1), (m2, v2) = mean_var(first), mean_var(last)
    se = math.sqrt(v1 / len(first) + v2 / len(last))
    return {"first": m1, "last": m2, "steps_per_third": n, "rise_se": (m2 - m1) / se if se else 0.0}


def rl_curve(client: MlflowClient, run_id: str, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def report(afm_home: Path, started: float | None, overrides: list[str]) -> None:
    manifests = newest_manifests(afm_home)
    common = {"afm_home": str(afm_home), "overrides": overrides}
    counts = manifests["distill"]["extra"]["counts"]
    record("distill_trajectories", counts["sft_trajectories"], 2000, "trajectories",
           {"problems": counts["problems"], "rl_problems": counts["rl_problems"], **common}, RESULTS)

    seconds = stage_seconds(manifests, started)
    if started is not None:
        seconds["pipeline"] = round(time.time() - started, 1)
    targets = {"rl": 300.0, "pipeline": 900.0}
    for stage, value in seconds.items():
        record(f"stage_seconds_{stage}", value, targets.get(stage), "s", {"all_stages": seconds, **common}, RESULTS)

    os.environ["AFM_HOME"] = str(afm_home)  # the run's MLflow store
    from afm.tracking import configure_tracking

    client, run_id = MlflowClient(tracking_uri=configure_tracking()), manifests["rl"]["extra"]["run_id"]
    reward = rl_curve(client, run_id, "reward_mean")
    curve = thirds(reward)
    detail = {"steps": len(reward), "steps_per_third": curve["steps_per_third"],
              "reward_per_step": [round(r, 3) for r in reward], **common}
    for key in ("accuracy", "format_ok"):
        part = thirds(rl_curve(client, run_id, key))
        detail[f"{key}_first_last_third"] = [round(part["first"], 4), round(part["last"], 4)]
    record("rl_reward_first_third", curve["first"], None, "reward", detail, RESULTS)
    record("rl_reward_last_third", curve["last"], None, "reward", detail, RESULTS)
    record("rl_reward_rise_se", curve["rise_se"], 2.0, "standard errors",
           {"first": round(curve["first"], 4), "last": round(curve["last"], 4), "steps": len(reward), **common},
           RESULTS)

    report_json = json.loads((manifests["eval"]["dir"] / "summary.json").read_text(encoding="utf-8"))
    summary = report_json["summary"]
    rl, sft = summary_row(summary, "rl", "heldout"), summary_row(summary, "sft", "heldout")
    record("issue26_rl_heldout_accuracy", rl["accuracy"], 0.5, "fraction", {"problems": rl["problems"], **common},
           RESULTS)
    record("issue26_rl_minus_sft_heldout_points", round(100 * (rl["accuracy"] - sft["accuracy"]), 2), 5.0, "points",
           {"rl": rl["accuracy"], "sft": sft["accuracy"], **common}, RESULTS)
    record("issue26_rl_pass3_minus_pass1_heldout_points", round(100 * (rl["pass@3"] - rl["pass@1"]), 2), 10.0,
           "points", {"pass@3": rl["pass@3"], "pass@1": rl["pass@1"], **common}, RESULTS)
    efficiency = next(row for row in report_json["efficiency"] if row["model"] == "rl")
    record("issue26_rl_tokens_per_solved_vs_teacher_pct", efficiency["token_reduction_pct"], -84.6, "%",
           {k: efficiency[k] for k in ("common_solved", "tokens_per_solved", "teacher_tokens_per_solved")} | common,
           RESULTS)
    for model in ("untrained", "sft", "rl"):
        for problem_set in ("heldout", "train_entities", "computation"):
            row = summary_row(summary, model, problem_set)
            record(f"{model}_{problem_set}_accuracy", row["accuracy"], None, "fraction",
                   {"pass@3": row.get("pass@3"), "format_error": row.get("failure.format_error"),
                    "problems": row["problems"], "samples": row["samples"], **common}, RESULTS)


def print_medians(runs: int) -> None:
    """The median of each #26 line (and the pipeline's seconds) over the last `runs` runs of the committed recipe
    (rows without overrides) in the results file."""
    lines = [json.loads(line) for line in RESULTS.read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = [row for row in lines if not row["detail"].get("overrides")]
    for metric in ("issue26_rl_heldout_accuracy", "issue26_rl_minus_sft_heldout_points",
                   "issue26_rl_pass3_minus_pass1_heldout_points", "issue26_rl_tokens_per_solved_vs_teacher_pct",
                   "stage_seconds_pipeline", "rl_reward_rise_se"):
        values = [row["value"] for row in lines if row["metric"] == metric][-runs:]
        measured = [v for v in values if v is not None]  # tokens per solved: None when RL solved nothing
        if measured:
            target = next(row["target"] for row in reversed(lines) if row["metric"] == metric)
            print(f"{metric}: median {statistics.median(measured)} of {values} (target {target})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--afm-home", type=Path, default=None, help="AFM_HOME of the run (default: a new temp dir)")
    parser.add_argument("--no-run", action="store_true", help="only read the artifacts already in --afm-home")
    parser.add_argument("--median", type=int, default=0, metavar="N", help="only print the medians of the last N runs")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="pipeline override key=value")
    args = parser.parse_args()
    if args.median:
        return print_medians(args.median)
    if args.no_run and args.afm_home is None:
        parser.error("--no-run needs --afm-home")
    afm_home = (args.afm_home or Path(tempfile.mkdtemp(prefix="afm-default-bench-"))).resolve()
    started = None if args.no_run else run_pipeline(afm_home, CONFIG, args.overrides)
    report(afm_home, started, args.overrides)


if __name__ == "__main__":
    main()
