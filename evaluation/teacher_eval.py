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

The scripted oracle only knows generated problems (metadata 'solution'); with it, other problems (HumanEval,
user datasets) get no teacher rows and drop out of the efficiency comparison.

Usage:
    records = evaluate_teacher(problem_sets, teacher_cfg, toolbox_cfg, n_samples=3, ray_actors=0, judge=judge,
                               limits=limits, scratch_dir=tmp)
"""
from __future__ import annotations

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


def logs_in_process(problems: list[Problem], teacher_cfg: TeacherConfig, toolbox_cfg: ToolboxConfig,
                    n_samples: int, desc: str) -> dict[tuple[str, int], MASLog | str]:
    """{(problem id, sample): log, or the error text of a run that failed after retries}."""
    worker = RolloutWorker(problems, teacher_cfg, toolbox_cfg, max_retries=1)
    out: dict[tuple[str, int], MASLog | str] = {}
    keys = [(p.id, s) for p in problems for s in range(n_samples)]
    for key in tqdm(keys, desc=desc, unit="run"):
        (result,) = worker.run_batch([key])
        out[key] = MASLog.from_dict(result["log"]) if "log" in result else result["error"]
    return out


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
        for p in problems:
            for s in range(n_samples):
                log = logs[(p.id, s)]
                records.append(mas_log_to_record(log, p, set_label, judge, limits, model=TEACHER_LABEL)
                               if isinstance(log, MASLog) else failed_run_record(TEACHER_LABEL, set_label, p, s, log))
    return records
