"""Distillation benchmarks: teacher rollout throughput on 1 vs 2 Ray actors (one run), filter throughput, and
the per-call cost of the tools a rollout uses. Appends JSON lines to bench/results/distill.jsonl:
    {"bench", "metric", "value", "target", "unit", "detail"}

Run:  .venv/bin/python bench/bench_distill.py [--problems 240]
Each rollout measurement uses its own cold tool cache, so both pay the same tool cost (sandboxed code runs,
page extraction), as the first `afm distill` run does.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from agents.teacher.mas import TeacherConfig, run_mas
from agents.teacher.oracle import OracleKnowledge, ScriptedOracleBackend
from agents.tools.toolbox import ToolboxConfig, build_toolbox
from distill.conversion import mas_log_to_trajectory
from distill.filters import FilterConfig, run_filters
from distill.pipeline import DistillConfig, build_problems
from distill.rollouts import RolloutConfig, ensure_ray, run_rollouts
from problems.miniweb import MiniWeb
from problems.world import world_corpus, world_html

RESULTS = Path(__file__).parent / "results" / "distill.jsonl"


def emit(metric: str, value: float, target: float | None, unit: str, detail: dict) -> dict:
    row = {"bench": "distill", "metric": metric, "value": round(value, 3), "target": target, "unit": unit,
           "detail": detail}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    return row


def tool_costs(toolbox_cfg: ToolboxConfig, problems) -> dict:
    box = build_toolbox(toolbox_cfg.model_copy(update={"cache_dir": None}))
    comp = next(p for p in problems if p.family == "computation")
    page = next(s for p in problems if p.family == "multihop" for s in p.metadata["solution"]["steps"]
                if s["tool"] == "crawl_page")
    calls = {"web_search": "Kato Rimu", "crawl_page": page["argument"], "code": comp.metadata["solution"]["steps"][0]["argument"]}
    out = {}
    for tag, arg in calls.items():
        box.call(tag, arg)
        t0 = time.perf_counter()
        for _ in range(5):
            box.call(tag, arg)
        out[f"{tag}_ms"] = round((time.perf_counter() - t0) / 5 * 1000, 1)
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=int, default=600, help="multi-hop rollouts per measurement (+1/6 as many "
                                                             "computation ones)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-distill-"))
    cfg = DistillConfig(n_worlds=6, multihop_per_world=args.problems // 6, n_computation=args.problems // 6)
    worlds, problems, _ = build_problems(cfg)
    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in world_corpus(worlds)))
    pages = {k: v for w in worlds for k, v in world_html(w).items()}
    with MiniWeb(pages) as web:
        base_tools = ToolboxConfig(corpus_path=corpus, crawl_resolve={"miniweb.local": web.address})
        costs = tool_costs(base_tools, problems)
        emit("tool_call_ms", costs["code_ms"], None, "ms", costs)
        ensure_ray(2)
        rates, steady = {}, {}
        for actors in (1, 2):
            tools = base_tools.model_copy(update={"cache_dir": work / f"cache-{actors}"})
            rc = RolloutConfig(num_actors=actors, show_progress=False)
            res = run_rollouts(problems, TeacherConfig(), tools, rc, work / f"rollouts-{actors}")
            rates[actors] = res.produced / res.seconds
            # after the first batch: actor start-up (imports, BM25 index) excluded
            steady[actors] = (res.produced - rc.batch_size) / (res.seconds - res.first_result_seconds)
            emit(f"rollout_traj_per_s_{actors}_actor", rates[actors], None, "traj/s",
                 {"rollouts": res.produced, "seconds": round(res.seconds, 2),
                  "first_result_seconds": round(res.first_result_seconds, 2),
                  "steady_traj_per_s": round(steady[actors], 2)})
        load = os.getloadavg()[0]
        emit("rollout_scaling_2_vs_1", rates[2] / rates[1], 1.8, "ratio",
             {"cpus": os.cpu_count(), "load_avg_1min": round(load, 2), "steady_ratio": round(steady[2] / steady[1], 3),
              "note": "2 cores shared with other work; value includes actor start-up, steady_ratio does not"})

        # filter throughput on one core: real converted logs, replicated with fresh ids
        box = build_toolbox(base_tools.model_copy(update={"cache_dir": work / "cache-2"}))
        knowledge = OracleKnowledge(problems)
        trajs = [mas_log_to_trajectory(run_mas(p, ScriptedOracleBackend(knowledge, 0.35, 0.3, i), box, TeacherConfig()))
                 for i, p in enumerate(problems[:200])]
    many = [replace(t, id=f"{t.id}/{k}") for k in range(100) for t in trajs]
    t0 = time.perf_counter()
    kept, _ = run_filters(many, problems, FilterConfig())
    seconds = time.perf_counter() - t0
    emit("filter_traj_per_s", len(many) / seconds, 10_000, "traj/s",
         {"trajectories": len(many), "kept": len(kept), "seconds": round(seconds, 3)})


if __name__ == "__main__":
    main(sys.argv[1:])
