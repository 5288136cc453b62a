"""Agentic RL (GRPO with DAPO clip-higher and dynamic sampling with refill) over multi-turn CoA rollouts, on Ray.

The topology (docs/rl-distributed.md), one code path from 2 CPU cores to GPU nodes; the config picks the sizes:
    driver (train_rl, in the Prefect task)   MLflow run, the rollout pool's actors, Ray Train's TorchTrainer
    rollout pool (training/rl_pool.py)       `pool.rollout_workers` engine replicas + `pool.tool_actors` tool actors
    learner group (Ray Train workers)        `num_learners` ranks, FSDP2 or DDP (training/rl_learner.py)
Rank 0 of the learner group drives each step: rollout on the pool -> scores (judge calls concurrent, bounded) ->
advantages, DAPO refill until `prompts_per_step` informative groups -> broadcast of the learner batch -> the
update on every rank -> gathered weights -> sync into every rollout actor -> metrics to MLflow -> a sharded
checkpoint (DCP, every rank its shard) through Ray Train every `checkpoint_every` steps. The 2-core default is
the 1-actor, 1-learner case of the same code.

One-step off-policy (`one_step_off_policy`): rank 0 rolls out step k+1 on a thread while update k runs, and
the loss's importance ratios use the sampler's (stale) logprobs.

Faults: a rollout actor that dies is restarted by Ray, re-synced and given its unit again (every episode exactly
once); a learner worker that dies makes Ray Train restart the group from the newest checkpoint (`max_failures`).
Resume across invocations: the same `output_dir` (hence Ray storage path and run name) continues from the
newest checkpoint; every random choice of step k (problems, rollout sampling per episode) derives from
(seed, k) and the problem cursor saved in the checkpoint, so 2 steps + resume + 2 steps gives the weights of
4 steps straight, provided the tools answer the same calls the same way (set `toolbox.cache_dir`).

Usage:
    result = train_rl(RLConfig(policy="runs/sft/policy", problems_path="data/rl_problems.jsonl",
                               toolbox=ToolboxConfig(tools=["code"]), output_dir="runs/rl"))
    result.model_dir, result.run_id, result.history[-1]["reward_mean"]
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import Field

from afm.config import Config
from agents.tools.sandbox import SandboxLimits
from agents.tools.toolbox import ToolboxConfig
from problems.records import Problem, read_problems
from training.dynamic_sampling import fill_informative_groups
from training.grpo import group_advantages
from training.rewards import Judge, RewardBreakdown, score_response
from training.rewards import build_judge as rewards_build_judge
from training.rl_learner import LearnerBatch, build_learner_batch, gathered_weights, learner_update, setup_learner
from training.rl_pool import PoolConfig
from training.rl_rollout import Episode, RolloutConfig, rollout_stats
from training.parallel import Parallelism, hf_model


class RLConfig(Config):
    """One agentic-RL job."""

    policy: str = Field("", description="Start policy (normally the SFT output): save_pretrained dir, s3://, runs:/ or "
                                        "models:/name@alias URI ('' only where the pipeline fills it in).")
    problems_path: str = Field("", description="JSONL of Problem records; rows with split='train' are used "
                                               "('' only where the pipeline fills it in).")
    output_dir: str = Field("runs/rl", description="The final policy goes here; Ray Train's checkpoints under "
                                                   "<output_dir>/ray unless checkpoint_uri says otherwise.")
    checkpoint_uri: str = Field("", description="Ray Train storage for checkpoints: a directory every node sees, or "
                                                "s3://bucket/prefix ('' = <output_dir>/ray).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Group size, turns, token budgets, sampling.")
    pool: PoolConfig = Field(default_factory=PoolConfig, description="Rollout actors (engine replicas) and tool actors.")
    toolbox: ToolboxConfig = Field(default_factory=lambda: ToolboxConfig(tools=["code"]), description="Tools the policy may call.")
    num_learners: int = Field(1, ge=1, description="Learner workers (Ray Train; one GPU each with use_gpu).")
    parallelism: Parallelism = Field("ddp", description="Learner data parallelism: ddp (full replica per worker) or "
                                                        "fsdp (FSDP2: parameters, gradients and AdamW state sharded).")
    bf16: bool = Field(True, description="On GPU: bf16 compute with fp32 master weights (FSDP2 mixed precision); "
                                         "the exported policy is bf16. fp32 on CPU whatever this says.")
    use_gpu: bool = Field(False, description="Learner workers on GPUs.")
    prompts_per_step: int = Field(4, ge=1, description="Groups the learner trains on per step (informative ones with "
                                                       "dynamic_sampling); each is rollout.group_size episodes.")
    steps: int = Field(20, ge=0, description="RL steps (one rollout batch + its updates each).")
    time_budget_s: float = Field(0.0, ge=0.0, description="Stop after this much wall time (0 = no limit); the last step finishes.")
    lr: float = Field(1e-4, gt=0.0, description="AdamW learning rate (AFM: 1e-6 on real models; the tiny default wants ~1e-4).")
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear LR warmup, then constant.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradient clipping norm.")
    eps_low: float = Field(0.2, ge=0.0, description="Lower clip: ratio >= 1 - eps_low (DAPO/AFM 0.2).")
    eps_high: float = Field(0.28, ge=0.0, description="Upper clip (clip-higher): ratio <= 1 + eps_high (DAPO/AFM 0.28).")
    kl_coef: float = Field(0.0, ge=0.0, description="k3 KL-to-reference coefficient (AFM: 0 web/code, 0.001 MHQA); 0 skips the reference model.")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each rollout batch.")
    minibatches: int = Field(1, ge=1, description="Optimizer steps per pass (the batch is split into this many minibatches).")
    micro_batch_size: int = Field(8, ge=1, description="Sequences per forward/backward on one learner; gradients accumulate to the minibatch.")
    one_step_off_policy: bool = Field(False, description="Generate step k+1's episodes (with the weights before update "
                                                         "k) while update k runs; the loss's ratios use the sampler's "
                                                         "logprobs. Needs rollout.temperature 1 with vLLM engines.")
    dynamic_sampling: bool = Field(True, description="DAPO: train only on groups whose rewards differ, sampling more "
                                                     "problems until prompts_per_step such groups are found.")
    max_refill_rounds: int = Field(4, ge=1, description="Sampling rounds per step at most (the first included) when "
                                                        "refilling informative groups; short steps train on what they have.")
    overlong_buffer_tokens: int = Field(0, ge=0, description="DAPO soft overlong penalty ramp (0 = off); max is rollout.token_budget.")
    judge: Literal["normalized_match", "llm"] = Field("normalized_match", description="Judge for web/QA rewards.")
    judge_base_url: str = Field("", description="OpenAI-compatible endpoint of the LLM judge (judge='llm').")
    judge_model: str = Field("", description="Model name at the judge endpoint (judge='llm').")
    judge_concurrency: int = Field(8, ge=1, description="Episodes scored at once (LLM-judge requests and answer test "
                                                        "runs in flight).")
    qa_reward: Literal["em", "f1"] = Field("em", description="Multi-hop QA reward: exact match (AutoCoA) or token F1 "
                                                             "(partial credit for half-right names; accuracy stays EM).")
    seed: int = Field(0, description="Seeds problem order, rollouts and the learner.")
    checkpoint_every: int = Field(10, ge=1, description="Save a resumable checkpoint every this many steps.")
    keep_last: int = Field(2, ge=1, description="Checkpoints kept (older ones are deleted by Ray Train).")
    max_failures: int = Field(2, ge=0, description="Learner-group restarts from the newest checkpoint before the job fails.")
    resume: bool = Field(True, description="Continue from the newest checkpoint of this output_dir if there is one.")
    mlflow_experiment: str = Field("rl", description="MLflow experiment of the run.")
    run_name: str = Field("rl", description="MLflow run name.")
    registered_model_name: str = Field("afm-rl", description="Registry name the final policy is added to as a new version.")


@dataclass
class RLResult:
    model_dir: Path
    run_id: str
    model_version: str
    history: list[dict[str, float]] = field(default_factory=list)
    real_tool_calls: int = 0  # tools actually run over every step of the run (simulated_env's imagined calls: none)
    wall_s: float = 0.0  # this invocation of train_rl, start to registered model


# ---------------------------------------------------------------- rank 0's part of a step: episodes -> batch

def next_problems(problems: list[Problem], cursor: int, count: int, seed: int) -> list[Problem]:
    """Problems `cursor` .. `cursor + count - 1` of the stream of seeded per-epoch shuffles of `problems`."""
    picked = []
    for k in range(cursor, cursor + count):
        epoch, pos = divmod(k, len(problems))
        order = list(range(len(problems)))
        random.Random(seed * 100_003 + epoch).shuffle(order)
        picked.append(problems[order[pos]])
    return picked


def build_judge(cfg: RLConfig) -> Judge:
    """The configured judge; LLM verdicts cached under <output_dir>/judge-cache (a resumed run re-asks nothing)."""
    return rewards_build_judge(cfg.judge, cfg.judge_base_url, cfg.judge_model, Path(cfg.output_dir) / "judge-cache")


def answer_test_limits(toolbox_cfg: ToolboxConfig) -> SandboxLimits:
    """Sandbox limits for running an answer against its problem's tests (HumanEval): the limits the policy's own
    code tool runs under."""
    return SandboxLimits(timeout_s=toolbox_cfg.code_timeout_s, cpu_s=int(toolbox_cfg.code_timeout_s) + 1,
                         memory_mb=toolbox_cfg.code_memory_mb)


def score_episodes(episodes: list[Episode], judge: Judge, cfg: RLConfig) -> list[RewardBreakdown]:
    """Rewards of a batch of episodes, `judge_concurrency` at a time (LLM-judge calls and HumanEval test runs
    wait on the network and on sandboxes), in episode order. training.scoring grades, as evaluation does."""
    limits = answer_test_limits(cfg.toolbox)

    def score(ep: Episode) -> RewardBreakdown:
        return score_response(ep.problem.family, ep.model_text, ep.problem.answers, judge, ep.problem.question,
                              response_tokens=len(ep.response_ids),
                              overlong_max_tokens=cfg.rollout.token_budget if cfg.overlong_buffer_tokens else 0,
                              overlong_buffer_tokens=cfg.overlong_buffer_tokens, qa_metric=cfg.qa_reward,
                              tests=ep.problem.metadata, test_limits=limits)

    with ThreadPoolExecutor(max_workers=cfg.judge_concurrency, thread_name_prefix="rl-judge") as pool:
        return list(pool.map(score, episodes))


@dataclass
class StepBatch:
    """What rank 0 sends the learner group for one step."""

    batch: LearnerBatch | None  # None when no group was informative
    metrics: dict[str, float]
    cursor: int                 # the problem stream's position after this step


def collect_step(pool: Any, problems: list[Problem], cursor: int, step: int, cfg: RLConfig, judge: Judge,
                 pad_id: int) -> StepBatch:
    """Roll out, score and (with dynamic sampling) refill until `prompts_per_step` informative groups; the
    learner batch with group-normalized advantages."""
    G, seed = cfg.rollout.group_size, cfg.seed * 7919 + step
    timing = {"generation": 0.0, "tools": 0.0, "rollout": 0.0, "scoring": 0.0}
    state = {"cursor": cursor, "index": 0}
    episodes_all: list[Episode] = []
    scores_all: list[RewardBreakdown] = []

    def sample(count: int, _round: int) -> list[tuple[list[Episode], list[float]]]:
        batch_problems = next_problems(problems, state["cursor"], count, cfg.seed)
        indices = list(range(state["index"], state["index"] + count))  # unique in the step: per-episode seeds
        state["cursor"] += count
        state["index"] += count
        started = time.perf_counter()
        episodes = pool.rollout(batch_problems, indices, cfg.rollout, seed)
        scored_at = time.perf_counter()
        scores = score_episodes(episodes, judge, cfg)
        timing["rollout"] += scored_at - started
        timing["scoring"] += time.perf_counter() - scored_at
        episodes_all.extend(episodes)
        scores_all.extend(scores)
        return [(episodes[g * G:(g + 1) * G], [s.score for s in scores[g * G:(g + 1) * G]]) for g in range(count)]

    if cfg.dynamic_sampling:
        filled = fill_informative_groups(sample, cfg.prompts_per_step, cfg.max_refill_rounds)
        groups, sampled, rounds = filled.groups, filled.sampled_groups, filled.rounds
    else:
        groups, sampled, rounds = sample(cfg.prompts_per_step, 0), cfg.prompts_per_step, 1
    batch = None
    if groups:
        advantages = group_advantages(torch.tensor([rewards for _, rewards in groups], dtype=torch.float))
        batch = build_learner_batch([ep for eps, _ in groups for ep in eps], advantages.flatten().tolist(), pad_id)
    stats = rollout_stats(episodes_all)
    rewards = torch.tensor([s.score for s in scores_all])
    lengths = [sum(ep.loss_mask) for ep in episodes_all]
    metrics = {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "accuracy": sum(s.correct for s in scores_all) / len(scores_all),
        "format_ok": sum(s.format_score for s in scores_all) / len(scores_all),
        "response_tokens_mean": sum(lengths) / len(lengths),
        "tool_calls_per_episode": stats.tool_calls_per_episode,
        "real_tool_calls": float(stats.real_tool_calls),  # refill rounds' episodes included: their tools ran too
        "real_tool_calls_per_episode": stats.real_tool_calls_per_episode,
        "turns_mean": sum(ep.turns for ep in episodes_all) / len(episodes_all),
        "groups_kept": float(len(groups)),
        "groups_sampled": float(sampled),
        "oversampling_ratio": sampled / cfg.prompts_per_step,
        "refill_rounds": float(rounds),
        "time_rollout_s": timing["rollout"],
        "time_scoring_s": timing["scoring"],
        # the episodes' shares of generation and tool wall time, summed: the step's time in each phase
        "time_generation_s": stats.generation_s,
        "time_tools_s": stats.tool_s,
        **{f"status_{k}": v / len(episodes_all) for k, v in stats.status_counts.items()},
    }
    return StepBatch(batch, metrics, state["cursor"])


def reward_curve_figure(history: list[dict[str, float]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [h["step"] for h in history]
    ax.plot(steps, [h["reward_mean"] for h in history], label="reward mean")
    ax.plot(steps, [h["accuracy"] for h in history], label="accuracy", alpha=0.7)
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward")
    ax.legend()
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- the learner group's loop (every rank)

def _broadcast(obj: Any, rank: int, world_size: int, device: torch.device) -> Any:
    """rank 0's `obj` on every rank (pickled; the step's batch is small next to the weights)."""
    if world_size == 1:
        return obj
    box = [obj if rank == 0 else None]
    dist.broadcast_object_list(box, src=0, device=device if device.type == "cuda" else None)
    return box[0]


def rl_worker_loop(config: dict[str, Any]) -> None:
    """Ray Train entry point on every learner worker: setup -> train -> save_checkpoint -> cleanup."""
    import ray.train

    from training.rl_sink import RLCheckpointSink
    from training.sft_tracking import StepMetricsLogger
    from training.sft_trainer import worker_device

    cfg = RLConfig.model_validate(config["cfg"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = worker_device(cfg, context.get_local_rank())
    if device.type == "cpu":
        torch.set_num_threads(max(1, int(config["cpus_per_learner"])))

    # setup
    parts = setup_learner(cfg, Path(config["policy_dir"]), rank, world, device)
    sink = RLCheckpointSink(rank)
    state = sink.load(parts)  # {"step", "cursor", "history", "elapsed_s"}; zeros on a fresh run
    pool = config["pool"] if rank == 0 else None
    logger = StepMetricsLogger(config["tracking_uri"], config["run_id"]) if rank == 0 else None
    problems = [p for p in read_problems(cfg.problems_path) if p.split == "train"] if rank == 0 else []
    judge = build_judge(cfg) if rank == 0 else None
    weights = gathered_weights(parts)
    if rank == 0:
        pool.sync(weights)  # a resumed or restarted group brings the actors to its checkpoint's weights
    del weights

    # train
    step, history, started = state["step"], state["history"], time.perf_counter()
    pad_id = parts.tokenizer.pad_token_id
    # One-step off-policy (rank 0): the next step's rollouts run on a thread while this step's update runs. The
    # actors run one call at a time, so the weight sync after the update waits for those rollouts to finish:
    # every step's episodes come from the weights one update old.
    ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rl-next-step") \
        if rank == 0 and cfg.one_step_off_policy else None
    next_step = None
    while step < cfg.steps:
        tick = time.perf_counter()
        collected = None
        if rank == 0:
            collected = next_step.result() if next_step is not None else \
                collect_step(pool, problems, state["cursor"], step, cfg, judge, pad_id)
            next_step = None
            if ahead is not None and step + 1 < cfg.steps:
                next_step = ahead.submit(collect_step, pool, problems, collected.cursor, step + 1, cfg, judge, pad_id)
            if next_step is None:
                pool.sleep()  # colocated engines free the GPU for the update (and wake with the sync)
        collected = _broadcast(collected, rank, world, device)
        update: dict[str, float] = {}
        if collected.batch is not None:
            update_started = time.perf_counter()
            update = learner_update(parts, collected.batch, cfg)
            update["time_training_s"] = time.perf_counter() - update_started
        # Synced even without an update: the sync is also what wakes sleeping engines.
        weights = gathered_weights(parts)
        if rank == 0:
            update["sync_s"] = pool.sync(weights)
        del weights
        step += 1
        state["cursor"] = collected.cursor
        metrics = {"step": step - 1, **collected.metrics, **update, "step_time_s": time.perf_counter() - tick}
        history.append(metrics)
        if logger is not None:
            logger.log({k: v for k, v in metrics.items() if k != "step"}, step - 1)
            logger.flush()
        out_of_time = bool(cfg.time_budget_s) and state["elapsed_s"] + time.perf_counter() - started > cfg.time_budget_s
        out_of_time = _broadcast(out_of_time, rank, world, device)
        final = step == cfg.steps or out_of_time
        if step % cfg.checkpoint_every == 0 or final:
            elapsed = state["elapsed_s"] + time.perf_counter() - started
            sink.save(parts, {"step": step, "cursor": state["cursor"], "history": history, "elapsed_s": elapsed},
                      {k: v for k, v in metrics.items() if isinstance(v, (int, float))}, final=final)
        if out_of_time:
            break
    if step == state["step"] and step >= cfg.steps:  # nothing left to do (a finished run resumed): export again
        sink.save(parts, {**state, "history": history}, {"step": step}, final=True)

    # cleanup
    if ahead is not None:  # a budget stop leaves the next step's rollouts unused (resume regenerates them)
        ahead.shutdown(wait=True, cancel_futures=True)
    if logger is not None:
        logger.flush()


# ---------------------------------------------------------------- the driver

def cpus_per_learner(cfg: RLConfig) -> int:
    """CPUs a CPU learner reserves: the node's CPUs / learners. Rollout and tool actors reserve none on CPU
    (synchronous RL: generation and the update take turns on the same cores)."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)) // cfg.num_learners)


def ray_run_name(cfg: RLConfig, output_dir: Path) -> str:
    """The Ray Train run of the job writing `output_dir`: the same name on every invocation, so a rerun resumes
    from the newest checkpoint of the last one (`resume`). Under the default storage (`<output_dir>/ray`) the
    directory already tells jobs apart; a shared `checkpoint_uri` (one S3 prefix for every job) gets a name per
    output_dir, so one job never resumes from another's checkpoints."""
    if not cfg.checkpoint_uri:
        return "rl"
    return "rl-" + hashlib.sha256(str(output_dir.resolve()).encode()).hexdigest()[:12]


def train_rl(cfg: RLConfig) -> RLResult:
    """Run the RL job described by `cfg` on Ray (a local cluster unless one is running); one MLflow run.
    Returns the final policy dir, MLflow run id, model version and per-step history."""
    import mlflow
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from afm import tracking
    from afm.ray_local import init_local_ray
    from afm.storage import file_identity
    from afm.lineage import lineage_tags, model_run_id
    from training.rl_pool import RolloutPool
    from training.sft_ray import move_policy, ray_storage

    started = time.perf_counter()
    if not ray.is_initialized():
        init_local_ray()
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if not any(p.split == "train" for p in read_problems(cfg.problems_path)):
        raise ValueError(f"{cfg.problems_path}: no problems with split='train'; RL needs training problems")
    storage = cfg.checkpoint_uri or str(output_dir / "ray")
    if not cfg.resume and not cfg.checkpoint_uri:
        shutil.rmtree(storage, ignore_errors=True)
    storage_path, filesystem = ray_storage(storage)
    # A local dir (or a registered version whose one copy is on this machine) is used in place; other
    # models:/name@alias, runs:/ and s3:// URIs are downloaded first.
    policy_dir = tracking.resolve_model_uri(cfg.policy, output_dir / "start-policy")
    with tracking.start_run(cfg.mlflow_experiment, cfg.run_name, params=cfg.model_dump(mode="json"),
                            tags={"stage": "rl"}) as run:
        pool = RolloutPool(cfg.pool, policy_dir, cfg.toolbox)
        try:
            trainer = TorchTrainer(
                rl_worker_loop,
                train_loop_config={"cfg": cfg.model_dump(), "pool": pool, "policy_dir": str(policy_dir),
                                   "run_id": run.info.run_id, "tracking_uri": mlflow.get_tracking_uri(),
                                   "cpus_per_learner": cpus_per_learner(cfg)},
                scaling_config=ScalingConfig(num_workers=cfg.num_learners, use_gpu=cfg.use_gpu,
                                             resources_per_worker=None if cfg.use_gpu else {"CPU": cpus_per_learner(cfg)}),
                run_config=RunConfig(name=ray_run_name(cfg, output_dir), storage_path=storage_path, storage_filesystem=filesystem,
                                     checkpoint_config=CheckpointConfig(num_to_keep=cfg.keep_last),
                                     failure_config=FailureConfig(max_failures=cfg.max_failures)),
            )
            result = trainer.fit()
        finally:
            pool.shutdown()
        model_dir = output_dir / "policy"
        move_policy(result.checkpoint, model_dir)
        with result.checkpoint.as_directory() as checkpoint_dir:
            history = json.loads((Path(checkpoint_dir) / "trainer_state.json").read_text())["history"]
        if history:
            fig = reward_curve_figure(history)
            tracking.log_figure(fig, "reward_curve.png")
            fig.savefig(output_dir / "reward_curve.png")
        (output_dir / "history.json").write_text(json.dumps(history, indent=1))
        run_id = run.info.run_id
        # Lineage: the parent is the start policy (a models:/ URI when it came from the registry) and the
        # data is the RL problem set: its store URI and sha256 when it was fetched from the store.
        tags = lineage_tags("rl", run_id, cfg.policy, model_run_id(cfg.policy), *file_identity(Path(cfg.problems_path)))
        version = tracking.register_model(model_dir, cfg.registered_model_name, tags={**tags, "steps": len(history)})
        # AutoCoA's cost comparison (simulated-then-real vs all-real RL): the run's real tool calls and wall time
        real_calls, wall_s = int(sum(h.get("real_tool_calls", 0) for h in history)), time.perf_counter() - started
        tracking.log_metrics({"total_real_tool_calls": real_calls, "wall_s": wall_s}, step=len(history))
    return RLResult(model_dir=model_dir, run_id=run_id, model_version=version, history=history,
                    real_tool_calls=real_calls, wall_s=wall_s)
