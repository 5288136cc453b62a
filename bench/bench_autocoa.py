"""AutoCoA bench (issue #23's acceptance): the recipe's ablations, ReAct and AFM on held-out problems, the real tool
calls saved by simulated RL, when-to-act after SFT1 and world-model fidelity after SFT3. Runs `afm pipeline
--config configs/autocoa.yaml` twice under its own AFM_HOME (the stages are cached, so the second run trains
only what differs):
  1. every stage, with the baselines afm, react and all_real_rl (real RL from SFT3 for sim+real steps);
  2. the ablation "SFT2 only" (stages=[sft2], no baselines);
then appends JSON lines to bench/results/autocoa.jsonl:
    {"bench": "autocoa", "metric", "value", "target", "unit", "detail"}

Metrics: heldout_em.<label> (labels: sft1, sft2, sft12, sft123, sft123_sim, sft123_sim_real, react, afm_sft,
afm_rl, sft123_real; value = mean exact match over the sampled episodes, detail: pass@k, tokens and tool calls
per problem, acted-when-needed and abstained-when-not rates); real_tool_call_ratio (sim-then-real RL ÷ all-real
RL at the same number of steps, target <= 0.3, detail: both EMs, target EM gap <= 2 points);
when_to_act_after_sft1 (target >= 0.9); world_model_f1_after_sft3. Every row's detail names the size measured.

Sizes (`--size`): `small` (the default) shrinks data, model and every stage so both runs take <= ~15 min on 2
shared CPU cores: it shows the machinery and its counts, not AutoCoA's accuracy; `recipe` is
configs/autocoa.yaml as written (the issue's quality-sized run; not run here: over an hour on 2 cores).

Run:  nice -n 5 .venv/bin/python bench/bench_autocoa.py [--size small|recipe] [--afm-home /tmp/afm-autocoa-bench]
                                                        [--set autocoa.sft2.max_steps=400 ...]
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quality import brief, record  # noqa: E402 (the bench row format, shared)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "autocoa.jsonl"
CONFIG = ROOT / "configs" / "autocoa.yaml"
SIZES = {
    # ~100 teacher trajectories, a 64-wide 2-layer policy, stages of tens of steps, RL 5 simulated + 1 real
    # (the paper's 80/16 ratio), 12 held-out problems x 2 samples.
    "small": [
        "distill.n_worlds=4", "distill.multihop_per_world=24", "distill.n_computation=16",
        "distill.rl_multihop_per_world=4", "distill.rl_computation=4", "distill.n_heldout_worlds=2",
        "distill.eval_per_world=6", "distill.rollout.num_actors=1",
        "policy.tiny.hidden_size=64", "policy.tiny.num_layers=2", "policy.tiny.num_heads=2",
        "policy.tiny.num_kv_heads=1", "policy.tiny.intermediate_size=256", "policy.vocab_size=1024",
        "sft.max_len=768", "sft.checkpoint_every=100", "sft.report_every=25",
        "autocoa.sft1.max_steps=40", "autocoa.sft2.max_steps=150", "autocoa.sft3.max_steps=60",
        "autocoa.rl_sim_steps=5", "autocoa.rl_real_steps=1",
        "rl.prompts_per_step=2", "rl.rollout.group_size=2", "rl.rollout.max_turns=4", "rl.checkpoint_every=10",
        "eval.problem_sets.heldout.size=12", "eval.problem_sets.train_entities.size=4",
        "eval.problem_sets.computation.size=2", "eval.n_samples=2", "eval.ks=[1,2]", "eval.max_turns=4",
        "autocoa.probes.pairs=100", "autocoa.probes.observations=24", "autocoa.probes.max_new_tokens=48",
        "autocoa.facts_given_size=12",
    ],
    "recipe": [],
}
RUNS = {
    "full": ["autocoa.stages=[sft1,sft2,sft3,rl_sim,rl_real]", "autocoa.baselines=[afm,react,all_real_rl]"],
    "sft2_only": ["autocoa.stages=[sft2]", "autocoa.baselines=[]"],
}
HELDOUT = "heldout"


def run_pipeline(afm_home: Path, name: str, overrides: list[str]) -> dict:
    """`afm pipeline` under AFM_HOME=afm_home; returns the fields of its "AutoCoA pipeline finished:" summary."""
    afm_home.mkdir(parents=True, exist_ok=True)
    cmd = [str(ROOT / ".venv" / "bin" / "afm"), "pipeline", "--config", str(CONFIG)]
    for item in overrides:
        cmd += ["--set", item]
    log = afm_home / f"pipeline-{name}.log"
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "AFM_STORE_URI", "RAY_ADDRESS",
                                                             "PREFECT_API_URL")}
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.run(cmd, cwd=ROOT, env={**env, "AFM_HOME": str(afm_home)}, stdout=out,
                              stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        sys.exit(f"bench_autocoa: `{' '.join(cmd)}` exited {proc.returncode}; see {log}")
    text = log.read_text(encoding="utf-8")
    summary = text[text.rindex("AutoCoA pipeline finished:"):]
    fields = {}
    for line in summary.splitlines()[1:]:
        key, sep, value = line.strip().partition(": ")
        if sep and key in ("registered", "probes", "action_rates", "real_tool_calls", "stages"):
            fields[key] = ast.literal_eval(value)
        elif sep and key in ("report", "seconds"):
            fields[key] = value
    return fields


def eval_rows(report_uri: str) -> list[dict]:
    return json.loads((Path(report_uri) / "manifest.json").read_text(encoding="utf-8"))["extra"]["summary"]


def heldout_row(rows: list[dict], model: str) -> dict:
    return next(r for r in rows if r["model"] == model and r["set"] == HELDOUT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--afm-home", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    home = args.afm_home or Path(f"/tmp/afm-autocoa-bench-{args.size}")
    base = SIZES[args.size] + args.overrides
    size = {"size": args.size, "config": "configs/autocoa.yaml", "overrides": base}

    summaries, seconds = {}, {}
    for name, extra in RUNS.items():
        started = time.perf_counter()
        summaries[name] = run_pipeline(home, name, base + extra)
        seconds[name] = round(time.perf_counter() - started, 1)
    full, ablation = summaries["full"], summaries["sft2_only"]
    rows = {"full": eval_rows(full["report"]), "sft2_only": eval_rows(ablation["report"])}
    rates = {**full["action_rates"], **ablation["action_rates"]}

    em = {}
    for run, labels in (("sft2_only", ["sft2"]), ("full", ["sft1", "sft12", "sft123", "sft123_sim", "sft123_sim_real",
                                                          "react", "afm_sft", "afm_rl", "sft123_real", "untrained"])):
        for label in labels:
            row = heldout_row(rows[run], label)
            em[label] = row["accuracy"]
            record(f"heldout_em.{label}", row["accuracy"], None, "fraction",
                   {**brief(row), "action_rates": rates.get(label), "run": run, **size}, RESULTS)

    calls = full["real_tool_calls"]
    ratio = calls["sft123_sim_real"] / calls["sft123_real"] if calls.get("sft123_real") else float("nan")
    gap = round(100 * (em["sft123_sim_real"] - em["sft123_real"]), 1)
    record("real_tool_call_ratio", ratio, 0.3, "ratio",
           {"sim_then_real_calls": calls["sft123_sim_real"], "all_real_calls": calls.get("sft123_real"),
            "em_sim_then_real": em["sft123_sim_real"], "em_all_real": em["sft123_real"], "em_gap_points": gap,
            "em_gap_target_points": 2.0, "em_gap_met": abs(gap) <= 2.0, **size}, RESULTS)
    w2a = full["probes"]["sft1"]["when_to_act"]
    record("when_to_act_after_sft1", w2a["accuracy"], 0.9, "fraction", {**w2a, **size}, RESULTS)
    world = full["probes"]["sft123"]["world_model"]
    record("world_model_f1_after_sft3", world["token_f1"], None, "token F1",
           {"fact_present": world["fact_present"], "n": world["n"], "closed": world["closed"],
            "before_sft3": full["probes"]["sft12"]["world_model"], **size}, RESULTS)
    record("wall_seconds", sum(seconds.values()), None, "s", {"runs": seconds, **size}, RESULTS)


if __name__ == "__main__":
    main()
