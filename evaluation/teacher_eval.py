"""The teacher MAS as an evaluated system: n runs per problem, graded like the models, tokens = every agent
call's prompt + completion tokens.

It reuses the distillation stage's rollout machinery rather than a second copy of it:
  * `ray_actors == 0` (default): `distill.rollout_work.RolloutWorker` in this process. With the scripted
    oracle a run costs ~0.3 s here (mostly its sandboxed code runs), and starting Ray costs ~15 s on 2 cores,
    more than an eval-sized teacher pass;
  * `ray_actors > 0`: `distill.rollouts.run_rollouts`, the Ray actor pool (resubmits work of dead actors,
    exactly once per key), for LLM-backed teachers or big sets. Its shards go to a scratch dir of this
    evaluation, so logs of an earlier run with another config are never reused.
Per-run seeds derive from (teacher seed, problem id, sample), so both paths produce the same logs.
A run that fails after the worker's retries is recorded as an unanswered episode whose rationale is the error.

In process, an LLM teacher's runs (and their grading, which may call an LLM judge) go through a thread pool of
the backend's `max_concurrency` (the endpoint's semaphore bounds them too); the oracle runs one at a time.

Which teacher: `resolve_teacher` — the one the eval config names, else the one that distilled the dataset the
problem sets come from (`report.json` next to them records it), else the default (the scripted oracle). So
"efficiency vs the teacher" compares against the configured multi-agent system; the oracle only when it is the
teacher. The scripted oracle only knows generated problems (metadata 'solution'); with it, other problems
(HumanEval, user datasets) get no teacher rows and drop out of the efficiency comparison.

Usage:
    records = evaluate_teacher(problem_sets, teacher_cfg, toolbox_cfg, n_samples=3, ray_actors=0, judge=judge,
                               limits=limits, scratch_dir=tmp)
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from agents.teacher.log import MASLog
from agents.teacher.mas import TeacherConfig
from agents.tools.sandbox import SandboxLimits
from agents.tools.toolbox import ToolboxConfig
from distill.rollout_work import RolloutWorker
from distill.rollouts import RolloutConfig as TeacherPoolConfig
from distill.rollouts import run_rollouts as run_teacher_pool
from distill.shards import iter_logs
from evaluation.grading import failed_run_record, mas_log_to_record
from evaluation.records import EvalRecord
from problems.records import Problem
from training.rewards import Judge

TEACHER_LABEL = "teacher"


def teacher_problems(problems: list[Problem], teacher_cfg: TeacherConfig) -> list[Problem]:
    """The problems the configured teacher can be asked: all of them, or for the oracle the generated ones."""
    if teacher_cfg.backend == "oracle":
        return [p for p in problems if "solution" in p.metadata]
    return list(problems)


def resolve_teacher(explicit: TeacherConfig | None, problem_set_sources: list[str]) -> TeacherConfig:
    """The teacher to evaluate: `explicit`, else the `teacher` recorded in the report.json of the dataset a
    problem-set file belongs to (distill.pipeline writes it), else TeacherConfig() (the scripted oracle)."""
    if explicit is not None:
        return explicit
    for source in problem_set_sources:
        report = Path(source).parent / "report.json"
        if "://" not in source and report.is_file():
            recorded = json.loads(report.read_text(encoding="utf-8")).get("teacher")
            if recorded is not None:
                return TeacherConfig(**recorded)
    return TeacherConfig()


def logs_in_process(problems: list[Problem], teacher_cfg: TeacherConfig, toolbox_cfg: ToolboxConfig,
                    n_samples: int, desc: str) -> dict[tuple[str, int], MASLog | str]:
    """{(problem id, sample): log, or the error text of a run that failed after retries}."""
    worker = RolloutWorker(problems, teacher_cfg, toolbox_cfg, max_retries=1)
    out: dict[tuple[str, int], MASLog | str] = {}
    keys = [(p.id, s) for p in problems for s in range(n_samples)]
    with ThreadPoolExecutor(concurrency(worker)) as pool:
        results = pool.map(lambda key: worker.run_batch([key])[0], keys)
        for key, result in zip(keys, tqdm(results, total=len(keys), desc=desc, unit="run")):
            out[key] = MASLog.from_dict(result["log"]) if "log" in result else result["error"]
    return out


def concurrency(worker: RolloutWorker) -> int:
    """Runs at once in process: the LLM backend's bound; 1 for the oracle (pure Python, per-run seeds)."""
    return worker.shared_backend.max_concurrency if worker.shared_backend is not None else 1


def logs_on_ray(problems: list[Problem], teacher_cfg: TeacherConfig, toolbox_cfg: ToolboxConfig, n_samples: int,
                ray_actors: int, shard_dir: Path) -> dict[tuple[str, int], MASLog | str]:
    """The same as `logs_in_process`, from the distillation stage's Ray actor pool."""
    pool = TeacherPoolConfig(num_actors=ray_actors, samples_per_problem=n_samples)
    run_teacher_pool(problems, teacher_cfg, toolbox_cfg, pool, shard_dir)
    out: dict[tuple[str, int], MASLog | str] = {(log.problem_id, log.sample_idx): log for log in iter_logs(shard_dir)}
    for p in problems:
        for s in range(n_samples):
            out.setdefault((p.id, s), f"teacher run failed after retries; see {shard_dir / 'failures.jsonl'}")
    return out


def evaluate_teacher(problem_sets: dict[str, list[Problem]], teacher_cfg: TeacherConfig, toolbox_cfg: ToolboxConfig,
                     n_samples: int, ray_actors: int, judge: Judge, limits: SandboxLimits,
                     scratch_dir: Path) -> list[EvalRecord]:
    """Teacher records for every set, in problem then sample order."""
    records: list[EvalRecord] = []
    for set_label, all_problems in problem_sets.items():
        problems = teacher_problems(all_problems, teacher_cfg)
        if not problems:
            continue
        if ray_actors:
            logs = logs_on_ray(problems, teacher_cfg, toolbox_cfg, n_samples, ray_actors,
                               scratch_dir / "teacher_logs" / set_label)
        else:
            logs = logs_in_process(problems, teacher_cfg, toolbox_cfg, n_samples, desc=f"teacher {set_label}")
        def grade(item: tuple[Problem, int]) -> EvalRecord:
            p, s = item
            log = logs[(p.id, s)]
            return (mas_log_to_record(log, p, set_label, judge, limits, model=TEACHER_LABEL)
                    if isinstance(log, MASLog) else failed_run_record(TEACHER_LABEL, set_label, p, s, log))

        # grading may call an LLM judge: as many at once as the teacher's endpoint takes (order kept)
        workers = 1 if teacher_cfg.backend == "oracle" else teacher_cfg.client.max_concurrency
        with ThreadPoolExecutor(workers) as pool:
            records += pool.map(grade, [(p, s) for p in problems for s in range(n_samples)])
    return records
