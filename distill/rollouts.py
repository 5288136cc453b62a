"""Teacher rollouts on a pool of Ray actors, streamed to atomic JSONL shards, resumable, exactly once per key.

The driver splits the requested (problem, sample) keys not already in `out_dir`'s shards into batches, keeps at
most `max_in_flight_per_actor` batches per actor, and writes one shard per finished batch. If an actor dies
(OOM, a crash, `ray.kill`), its unfinished batches go to a fresh actor; results are deduplicated by
(problem_id, sample_idx) before writing, so each key is produced exactly once. Items that fail after the
worker's retries go to `failures.jsonl` (not a shard), so a re-run tries them again.

Tools: each actor builds its own ToolBox. The mini-web for crawl_page is ONE server the caller starts (the
driver process) and names in `toolbox_cfg.crawl_resolve`; actors on this machine reach it over 127.0.0.1.
On a multi-node cluster (RAY_ADDRESS) set `toolbox.miniweb_bind: 0.0.0.0` so actors on other nodes reach it at
the driver's IP, and the search index comes from `toolbox_cfg.corpus_uri` (the artifact store) where the
driver's corpus_path does not exist (distill_dataset publishes the corpus there when given a store).

Usage:
    result = run_rollouts(problems, TeacherConfig(), toolbox_cfg, RolloutConfig(num_actors=2), Path("out/rollouts"))
"""
from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import ray
from pydantic import Field
from ray.exceptions import RayActorError
from tqdm import tqdm

from afm.config import Config
from afm.ray_local import init_local_ray
from agents.teacher.mas import TeacherConfig
from agents.tools.toolbox import ToolboxConfig
from distill.rollout_work import RolloutWorker
from distill.shards import done_keys, write_shard
from problems.records import Problem


class RolloutConfig(Config):
    """The Ray rollout pool."""

    num_actors: int = Field(2, ge=1, description="Rollout actors")
    cpus_per_actor: float = Field(1.0, gt=0, description="Ray CPUs reserved per actor")
    samples_per_problem: int = Field(1, ge=1, description="Rollouts per problem (sample_idx 0..n-1)")
    batch_size: int = Field(16, ge=1, description="Keys per actor call (and per shard)")
    max_in_flight_per_actor: int = Field(2, ge=1, description="Batches queued per actor (bounds driver memory)")
    max_retries: int = Field(1, ge=0, description="Retries of one failed rollout inside the actor")
    max_resubmits: int = Field(3, ge=0, description="Times one batch is re-sent after its actor died")
    ray_num_cpus: int | None = Field(None, description="ray.init num_cpus when starting a local Ray "
                                                       "(default: num_actors * cpus_per_actor, rounded up)")
    show_progress: bool = Field(True, description="tqdm progress bar")


@dataclass
class RolloutResult:
    produced: int  # new logs written this run
    skipped: int  # keys already present in completed shards
    failed: int  # keys that failed after retries (see failures.jsonl)
    actor_restarts: int
    seconds: float
    first_result_seconds: float  # until the first batch came back: Ray + actor start-up + one batch


@ray.remote
class RolloutActor:
    def __init__(self, problems: list[dict], teacher_cfg: dict, toolbox_cfg: dict, max_retries: int):
        self.worker = RolloutWorker([Problem.from_dict(p) for p in problems], TeacherConfig(**teacher_cfg),
                                    ToolboxConfig(**toolbox_cfg), max_retries)

    def pid(self) -> int:
        return os.getpid()

    def run_batch(self, keys: list[tuple[str, int]]) -> list[dict]:
        return self.worker.run_batch(keys)


def ensure_ray(num_cpus: int) -> None:
    """Connect to RAY_ADDRESS if set, else start a local Ray once per process (~15 s here)."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"])
    else:
        init_local_ray(num_cpus)


def actor_name(run_id: str, slot: int, generation: int) -> str:
    return f"afm-rollout-{run_id}-{slot}-g{generation}"


def run_rollouts(problems: list[Problem], teacher_cfg: TeacherConfig, toolbox_cfg: ToolboxConfig,
                 cfg: RolloutConfig, out_dir: Path, run_id: str | None = None) -> RolloutResult:
    """Produce a MAS log for every (problem, sample) key missing from `out_dir`. `run_id` names actors
    (`afm-rollout-<run_id>-<slot>-g<generation>`) and shards; default: a random one."""
    start = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    run_id = run_id or uuid.uuid4().hex[:8]
    done = done_keys(out_dir)
    wanted = [(p.id, s) for p in problems for s in range(cfg.samples_per_problem)]
    pending = [k for k in wanted if k not in done]
    skipped = len(wanted) - len(pending)
    if not pending:
        return RolloutResult(0, skipped, 0, 0, time.perf_counter() - start, 0.0)

    ensure_ray(cfg.ray_num_cpus or math.ceil(cfg.num_actors * cfg.cpus_per_actor))
    problems_ref = ray.put([p.to_dict() for p in problems])
    args = (problems_ref, teacher_cfg.model_dump(mode="json"), toolbox_cfg.model_dump(mode="json"), cfg.max_retries)
    generations = [0] * cfg.num_actors

    def spawn(slot: int):
        return RolloutActor.options(num_cpus=cfg.cpus_per_actor,
                                    name=actor_name(run_id, slot, generations[slot])).remote(*args)

    actors = [spawn(i) for i in range(cfg.num_actors)]
    queue = deque((pending[i:i + cfg.batch_size], 0) for i in range(0, len(pending), cfg.batch_size))
    in_flight: dict = {}  # ref -> (slot, generation, batch, resubmits)
    per_slot = [0] * cfg.num_actors
    produced = failed = restarts = 0
    # continue this run id's numbering, so a resumed run with the same id never overwrites a shard
    taken = [int(p.stem.rsplit("-", 1)[1]) for p in out_dir.glob(f"shard-{run_id}-*.jsonl")]
    shard_no = max(taken) + 1 if taken else 0
    first_result = 0.0
    failures_path = out_dir / "failures.jsonl"
    bar = tqdm(total=len(pending), desc="teacher rollouts", unit="traj", disable=not cfg.show_progress)
    try:
        while queue or in_flight:
            for slot in range(cfg.num_actors):
                while queue and per_slot[slot] < cfg.max_in_flight_per_actor:
                    batch, resubmits = queue.popleft()
                    in_flight[actors[slot].run_batch.remote(batch)] = (slot, generations[slot], batch, resubmits)
                    per_slot[slot] += 1
            [ref], _ = ray.wait(list(in_flight), num_returns=1)
            slot, generation, batch, resubmits = in_flight.pop(ref)
            if generation == generations[slot]:
                per_slot[slot] -= 1
            try:
                results = ray.get(ref)
            except RayActorError:
                if generation == generations[slot]:  # first failure seen from this actor: replace it once
                    ray.kill(actors[slot], no_restart=True)
                    generations[slot] += 1
                    per_slot[slot] = 0
                    actors[slot] = spawn(slot)
                    restarts += 1
                if resubmits >= cfg.max_resubmits:
                    raise RuntimeError(f"rollout batch starting at {batch[0]} lost its actor {resubmits + 1} times; "
                                       "see the Ray logs for why actors die (memory?)") from None
                queue.appendleft((batch, resubmits + 1))
                continue
            first_result = first_result or time.perf_counter() - start
            fresh, errors = [], []
            for r in results:
                key = (r["key"][0], int(r["key"][1]))
                if key in done:
                    continue  # a batch that finished twice (re-sent after a death): keep the first
                if "log" in r:
                    done.add(key)
                    fresh.append(r["log"])
                else:
                    errors.append(r)
            if fresh:
                write_shard(out_dir, f"{run_id}-{shard_no:05d}", fresh)
                shard_no += 1
            if errors:
                with open(failures_path, "a", encoding="utf-8") as f:
                    for e in errors:
                        f.write(json.dumps(e) + "\n")
            produced += len(fresh)
            failed += len(errors)
            bar.update(len(results))
    finally:
        bar.close()
        for actor in actors:
            ray.kill(actor, no_restart=True)
    return RolloutResult(produced, skipped, failed, restarts, time.perf_counter() - start, first_result)
