"""The whole distillation stage as one function for the lead's Prefect task (no Prefect import here):

    generate worlds + problems -> corpus + mini-web -> teacher rollouts on Ray (MAS logs, sharded, resumable)
    -> MAS log -> CoA conversion -> progressive filters -> sft.jsonl; RL problem selection -> rl_problems.jsonl

Outputs in `out_dir`: problems.jsonl (the SFT problems), corpus.jsonl (search corpus of train AND held-out
worlds, also served as the mini-web), rollouts/ (MAS log shards), sft.jsonl (filtered trajectories),
rl_problems.jsonl, rl_selection.jsonl (per-problem baseline results: a re-run resumes), eval_heldout.jsonl
(held-out entities), eval_train.jsonl (train entities, unseen questions), report.json.

Usage:
    result = distill_dataset(DistillConfig(), Path("runs/distill"))
    python -m distill.pipeline --out runs/distill [key=value ...]     # e.g. rollout.num_actors=1
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import Field

from afm.config import Config, load_config
from afm.storage import open_store, sha256_file
from agents.teacher.mas import TeacherConfig
from agents.teacher.oracle import OracleKnowledge, ScriptedOracleBackend
from agents.tools.toolbox import ToolboxConfig
from distill.conversion import convert_logs, protocol_counts
from distill.filters import FilterConfig, run_filters
from distill.rl_problems import RLSelectionConfig, select_rl_problems
from distill.rollout_work import build_llm_backend
from distill.rollouts import RolloutConfig, run_rollouts
from distill.shards import iter_logs
from models.format import write_jsonl
from problems.computation import computation_problems
from problems.miniweb import MiniWeb
from problems.records import Problem, write_problems
from problems.world import WorldConfig, assert_entities_disjoint, generate_worlds, multihop_problems, world_corpus, world_html


class DistillConfig(Config):
    """Distillation defaults: the tiny offline setting (oracle teacher, local tools), ~2k trajectories."""

    world: WorldConfig = Field(default_factory=WorldConfig, description="Size of each generated world")
    n_worlds: int = Field(24, ge=1, description="Train worlds (names never repeat across worlds)")
    world_seed: int = Field(0, description="Seed of the first world; the others follow")
    multihop_per_world: int = Field(64, ge=0, description="SFT multi-hop problems per world")
    hops: tuple[int, int] = Field((1, 3), description="Hop range of multi-hop problems (lo, hi)")
    n_computation: int = Field(384, ge=0, description="SFT computation problems")
    rl_multihop_per_world: int = Field(10, ge=0, description="RL candidate multi-hop problems per world")
    rl_computation: int = Field(60, ge=0, description="RL candidate computation problems")
    n_heldout_worlds: int = Field(4, ge=0, description="Held-out worlds: entities never in any train world "
                                                       "(their pages join the corpus; their problems are eval-only)")
    eval_per_world: int = Field(10, ge=0, description="Eval multi-hop problems per held-out world "
                                                      "(eval_heldout.jsonl) and per train world up to 4 "
                                                      "(eval_train.jsonl: memorization vs generalization)")
    teacher: TeacherConfig = Field(default_factory=TeacherConfig, description="Teacher MAS and backend")
    toolbox: ToolboxConfig = Field(default_factory=ToolboxConfig,
                                   description="Tools; corpus_path / crawl_resolve are filled in by the pipeline, "
                                               "cache_dir defaults to <out>/tool_cache")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Ray rollout pool")
    filters: FilterConfig = Field(default_factory=FilterConfig, description="Progressive filter")
    rl_selection: RLSelectionConfig = Field(default_factory=RLSelectionConfig, description="RL problem selection")


@dataclass
class DistillResult:
    sft_path: Path
    rl_problems_path: Path
    corpus_path: Path
    filter_report: list[dict]
    counts: dict


def build_eval_sets(cfg: DistillConfig, train_worlds: list, sft_questions: set[str]) -> tuple[list, dict]:
    """(held-out worlds, {file: problems}): questions about held-out entities, and fresh questions about train
    entities (never an SFT question), so eval can tell generalization from memorization."""
    first = cfg.world_seed + cfg.n_worlds
    heldout_worlds = generate_worlds(cfg.world, range(first, first + cfg.n_heldout_worlds), split="heldout")
    assert_entities_disjoint(train_worlds, heldout_worlds)
    heldout = [p for w in heldout_worlds
               for p in multihop_problems(w, cfg.eval_per_world, hops=cfg.hops, split="heldout", rng_seed=2)]
    train = [p for w in train_worlds[:4] for p in multihop_problems(w, cfg.eval_per_world, hops=cfg.hops, rng_seed=2)]
    return heldout_worlds, {"eval_heldout.jsonl": heldout,
                            "eval_train.jsonl": [p for p in train if p.question not in sft_questions]}


def build_problems(cfg: DistillConfig) -> tuple[list, list[Problem], list[Problem]]:
    """(worlds, SFT problems, RL candidates). RL candidates use other generator seeds and never repeat an SFT
    question."""
    worlds = generate_worlds(cfg.world, range(cfg.world_seed, cfg.world_seed + cfg.n_worlds))
    sft = [p for w in worlds for p in multihop_problems(w, cfg.multihop_per_world, hops=cfg.hops, rng_seed=0)]
    sft += computation_problems(cfg.n_computation, rng_seed=0)
    sft_questions = {p.question for p in sft}
    rl = [p for w in worlds for p in multihop_problems(w, cfg.rl_multihop_per_world, hops=cfg.hops, rng_seed=1)]
    rl += computation_problems(cfg.rl_computation, rng_seed=1)
    return worlds, sft, [p for p in rl if p.question not in sft_questions]


def publish_corpus(corpus_path: Path, store_uri: str) -> str:
    """Upload the corpus to the artifact store as `corpora/<sha16>` (once per content) and return the file's URI,
    so rollout actors on other nodes read it from the store (ToolboxConfig.corpus_uri) instead of a driver path."""
    store = open_store(store_uri)
    name = f"corpora/{sha256_file(corpus_path)[:16]}"
    if store.read_manifest(name) is None:
        store.write_artifact(name, {"corpus.jsonl": corpus_path}, kind="corpus")
    return f"{store.uri}/{name}/corpus.jsonl"


def distill_dataset(cfg: DistillConfig, out_dir: Path, store_uri: str = "") -> DistillResult:
    """The whole stage into `out_dir`. With `store_uri`, the corpus is also published to that artifact store
    before the rollouts start (actors off this node load the search index from there)."""
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    worlds, problems, rl_candidates = build_problems(cfg)
    write_problems(out_dir / "problems.jsonl", problems)
    heldout_worlds, eval_sets = build_eval_sets(cfg, worlds, {p.question for p in problems})
    for name, eval_problems in eval_sets.items():
        write_problems(out_dir / name, eval_problems)
    corpus_path = out_dir / "corpus.jsonl"
    with open(corpus_path, "w", encoding="utf-8") as f:
        for doc in world_corpus(worlds + heldout_worlds):
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    pages = {path: page for w in worlds + heldout_worlds for path, page in world_html(w).items()}

    corpus_uri = publish_corpus(corpus_path, store_uri) if store_uri else cfg.toolbox.corpus_uri
    with MiniWeb(pages, host=cfg.toolbox.miniweb_bind, advertise_host=cfg.toolbox.miniweb_advertise) as web:
        toolbox_cfg = cfg.toolbox.model_copy(update={
            "corpus_path": corpus_path, "corpus_uri": corpus_uri,
            "crawl_resolve": {**cfg.toolbox.crawl_resolve, "miniweb.local": web.address},
            "cache_dir": cfg.toolbox.cache_dir or out_dir / "tool_cache",
        })
        rollout = run_rollouts(problems, cfg.teacher, toolbox_cfg, cfg.rollout, out_dir / "rollouts")
    t_rollout = time.perf_counter()

    # Actors write logs in completion order, which differs run to run (two runs of the default: 556 of 2,052 rows
    # placed differently), so SFT saw other batches each run. In problem order, one config gives one dataset.
    position = {p.id: i for i, p in enumerate(problems)}
    logs = sorted(iter_logs(out_dir / "rollouts"), key=lambda log: (position[log.problem_id], log.sample_idx))
    trajectories, conversion_failures = convert_logs(logs)
    protocol = protocol_counts(iter_logs(out_dir / "rollouts"))
    kept, report = run_filters(trajectories, problems, cfg.filters)
    # the report starts at the logs: what never became a trajectory, and why
    report.insert(0, {"stage": "conversion", "in": len(trajectories) + sum(conversion_failures.values()),
                      "out": len(trajectories), "reasons": dict(conversion_failures),
                      "with_parse_failures": protocol["logs_with_parse_failures"]})
    sft_path = out_dir / "sft.jsonl"
    tmp = sft_path.with_suffix(".jsonl.tmp")
    write_jsonl(tmp, kept)
    os.replace(tmp, sft_path)

    if cfg.teacher.backend == "oracle":
        baseline = ScriptedOracleBackend(OracleKnowledge(rl_candidates), 0.0, 0.0, cfg.teacher.seed)
    else:
        baseline = build_llm_backend(cfg.teacher)
    rl_kept, rl_stats = select_rl_problems(rl_candidates, baseline, cfg.rl_selection,
                                           results_path=out_dir / "rl_selection.jsonl")
    rl_path = out_dir / "rl_problems.jsonl"
    write_problems(rl_path, rl_kept)

    counts = {
        "problems": len(problems), "rollouts_new": rollout.produced, "rollouts_skipped": rollout.skipped,
        "rollouts_failed": rollout.failed, "actor_restarts": rollout.actor_restarts,
        "converted": len(trajectories), "conversion_failures": dict(conversion_failures),
        "parse_failures_total": sum(protocol["parse_failures"].values()), "protocol": protocol,
        "sft_trajectories": len(kept), "rl_problems": len(rl_kept), "rl_selection": rl_stats,
        "eval_heldout": len(eval_sets["eval_heldout.jsonl"]), "eval_train": len(eval_sets["eval_train.jsonl"]),
        "rollout_seconds": round(t_rollout - t0, 2), "total_seconds": round(time.perf_counter() - t0, 2),
    }
    # the teacher is recorded (its config: an env var or Secret block NAME, never a key) so that evaluating this
    # dataset compares against the teacher that made it (evaluation.teacher_eval.resolve_teacher)
    (out_dir / "report.json").write_text(json.dumps({"counts": counts, "filter_report": report,
                                                     "teacher": cfg.teacher.model_dump(mode="json")}, indent=2))
    return DistillResult(sft_path, rl_path, corpus_path, report, counts)


def main(argv: list[str]) -> None:
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else Path("runs/distill")
    overrides = [a for a in argv if "=" in a]
    result = distill_dataset(load_config(DistillConfig, None, overrides), out)
    print(json.dumps({**asdict(result), "sft_path": str(result.sft_path), "rl_problems_path":
                      str(result.rl_problems_path), "corpus_path": str(result.corpus_path)}, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
