"""Agentic RL trainer (GRPO with DAPO clip-higher and dynamic sampling) over multi-turn CoA rollouts.

Reads top to bottom as the loop it runs:
    setup (policy, reference, optimizer, rollout engine, toolbox, judge, MLflow run, resume)
    -> per step: rollout -> reward -> advantages (+ dynamic sampling) -> update -> weight sync -> log
    -> checkpoint every `checkpoint_every` steps -> final save + model registration -> cleanup.

Where it runs: in this process. On the CPU default the rollout engine (`HFEngine`) shares the learner's
module, so "weight sync" is a same-object load; on a GPU machine `engine="vllm"` keeps a vLLM engine and
`update_weights` pushes the learner's weights into it after every update. The learner is NOT wrapped in a
Ray Train TorchTrainer: with one learner worker there is no gradient all-reduce to distribute, rollouts and
tool calls must sit next to the policy weights, and Ray Train's start (~14 s) and per-report cost (~1.7 s)
would eat a large share of the 5-minute tiny run. Multi-GPU learners are verl's job (see verl_export.py).
The learner's logprob passes run the episodes as one flat sequence with per-episode attention and the LM head
at response tokens only (`grpo.token_logprobs` under `models.packed_attention.packed_attention`).

Resume is exact: a checkpoint (`training.checkpointing`, shared with SFT) holds the policy, optimizer,
scheduler and RNG state, the step and the metrics history; every random choice of step k (which problems,
rollout sampling) is also derived from (seed, k), so 2 steps + resume + 2 steps gives the
same weights as 4 steps straight — provided the tools answer the same calls the same way (set
`toolbox.cache_dir`: sandbox tracebacks name a random temp dir, so an uncached failing program's
observation differs from run to run).

Usage:
    result = train_rl(RLConfig(policy="runs/sft/policy", problems_path="data/rl_problems.jsonl",
                               toolbox=ToolboxConfig(tools=["code"]), output_dir="runs/rl"))
    result.model_dir, result.run_id, result.history[-1]["reward_mean"]
"""
from __future__ import annotations

import copy
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field
from tqdm import tqdm

from afm import tracking
from afm.config import Config
from afm.storage import sha256_file
from agents.tools.sandbox import SandboxLimits
from agents.tools.toolbox import ToolboxConfig, build_toolbox
from evaluation.lineage import lineage_tags
from models.engines.hf import HFEngine
from models.packed_attention import packed_attention
from models.policy import load_policy, save_policy
from problems.records import Problem, read_problems
from training.checkpointing import latest_checkpoint, load_checkpoint, save_checkpoint
from training.grpo import group_advantages, informative_groups, policy_loss, token_logprobs
from training.rewards import Judge, score_response
from training.rewards import build_judge as rewards_build_judge
from training.lr import warmup_schedule
from training.rl_rollout import Episode, RolloutConfig, rollout_stats, run_rollouts


class RLConfig(Config):
    """One agentic-RL job."""

    policy: str = Field("", description="Start policy (normally the SFT output): save_pretrained dir, s3://, runs:/ or "
                                        "models:/name@alias URI ('' only where the pipeline fills it in).")
    problems_path: str = Field("", description="JSONL of Problem records; rows with split='train' are used "
                                               "('' only where the pipeline fills it in).")
    output_dir: str = Field("runs/rl", description="Checkpoints and the final policy go here.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Group size, turns, token budgets, sampling.")
    toolbox: ToolboxConfig = Field(default_factory=lambda: ToolboxConfig(tools=["code"]), description="Tools the policy may call.")
    prompts_per_step: int = Field(4, ge=1, description="Problems per step; each gets rollout.group_size episodes.")
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
    micro_batch_size: int = Field(8, ge=1, description="Sequences per forward/backward; gradients accumulate to the minibatch.")
    dynamic_sampling: bool = Field(True, description="DAPO: drop groups whose rewards are all equal (zero advantage).")
    overlong_buffer_tokens: int = Field(0, ge=0, description="DAPO soft overlong penalty ramp (0 = off); max is rollout.token_budget.")
    judge: Literal["normalized_match", "llm"] = Field("normalized_match", description="Judge for web/QA rewards.")
    judge_base_url: str = Field("", description="OpenAI-compatible endpoint of the LLM judge (judge='llm').")
    judge_model: str = Field("", description="Model name at the judge endpoint (judge='llm').")
    qa_reward: Literal["em", "f1"] = Field("em", description="Multi-hop QA reward: exact match (AutoCoA) or token F1 "
                                                             "(partial credit for half-right names; accuracy stays EM).")
    engine: Literal["hf", "vllm"] = Field("hf", description="Rollout engine: in-process transformers, or vLLM (GPU machines; its logprobs are at temperature 1, the learner recomputes old logprobs either way).")
    use_gpu: bool = Field(False, description="Put the learner (and HF engine) on CUDA.")
    seed: int = Field(0, description="Seeds problem order, rollouts and the learner.")
    checkpoint_every: int = Field(10, ge=1, description="Save a resumable checkpoint every this many steps.")
    keep_last: int = Field(2, ge=1, description="Checkpoints kept on disk (older ones are deleted).")
    resume: bool = Field(True, description="Continue from the newest checkpoint in output_dir if there is one.")
    mlflow_experiment: str = Field("rl", description="MLflow experiment of the run.")
    run_name: str = Field("rl", description="MLflow run name.")
    registered_model_name: str = Field("afm-rl", description="Registry name the final policy is added to as a new version.")


@dataclass
class RLResult:
    model_dir: Path
    run_id: str
    model_version: str
    history: list[dict[str, float]] = field(default_factory=list)


# ---------------------------------------------------------------- batch building and the update

@dataclass
class LearnerBatch:
    """Right-padded sequences; everything indexed by target position t (predicting input_ids[:, t + 1])."""

    input_ids: torch.Tensor       # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor       # [B, T-1] 1 on generated response tokens only
    advantages: torch.Tensor      # [B]
    rollout_logprobs: torch.Tensor  # [B, T-1]


def build_learner_batch(episodes: list[Episode], advantages: list[float], pad_id: int) -> LearnerBatch:
    """Pack episodes for the learner: prompt and observation tokens get loss mask 0."""
    width = max(len(ep.prompt_ids) + len(ep.response_ids) for ep in episodes)
    batch = len(episodes)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    loss_mask = torch.zeros((batch, width - 1))
    rollout_lp = torch.zeros((batch, width - 1))
    for row, ep in enumerate(episodes):
        ids = ep.prompt_ids + ep.response_ids
        input_ids[row, :len(ids)] = torch.tensor(ids)
        attention[row, :len(ids)] = 1
        start = len(ep.prompt_ids) - 1  # target position of the first response token
        loss_mask[row, start:start + len(ep.response_ids)] = torch.tensor(ep.loss_mask, dtype=torch.float)
        rollout_lp[row, start:start + len(ep.response_ids)] = torch.tensor(ep.rollout_logprobs)
    return LearnerBatch(input_ids, attention, loss_mask, torch.tensor(advantages, dtype=torch.float), rollout_lp)


@torch.no_grad()
def batch_logprobs(model, batch: LearnerBatch, temperature: float, micro: int, device) -> torch.Tensor:
    out = []
    for s in range(0, batch.input_ids.shape[0], micro):
        sl = slice(s, s + micro)
        lp, _ = token_logprobs(model, batch.input_ids[sl].to(device), batch.attention_mask[sl].to(device),
                               batch.loss_mask[sl].to(device), temperature, False)
        out.append(lp.cpu())
    return torch.cat(out)


def update_policy(model, optimizer, scheduler, batch: LearnerBatch, old_lp: torch.Tensor, ref_lp: torch.Tensor | None,
                  cfg: RLConfig, device) -> dict[str, float]:
    """`ppo_epochs` x `minibatches` optimizer steps; each minibatch's loss is token-level over ALL its valid
    tokens (micro-batch losses are normalized by the minibatch token count, so accumulation is exact)."""
    model.train()
    rows = batch.input_ids.shape[0]
    per_mb = -(-rows // cfg.minibatches)
    totals: dict[str, float] = {}
    count = 0
    for _ in range(cfg.ppo_epochs):
        for mb_start in range(0, rows, per_mb):
            mb = range(mb_start, min(mb_start + per_mb, rows))
            valid = float(batch.loss_mask[mb.start:mb.stop].sum().clamp(min=1.0))
            optimizer.zero_grad(set_to_none=True)
            loss_sum, mb_stats = 0.0, {}
            for s in range(mb.start, mb.stop, cfg.micro_batch_size):
                sl = slice(s, min(s + cfg.micro_batch_size, mb.stop))
                ids, att = batch.input_ids[sl].to(device), batch.attention_mask[sl].to(device)
                lp, ent = token_logprobs(model, ids, att, batch.loss_mask[sl].to(device), cfg.rollout.temperature, True)
                loss, stats = policy_loss(
                    lp, old_lp[sl].to(device), batch.advantages[sl].to(device), batch.loss_mask[sl].to(device),
                    eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                    ref_logprobs=None if ref_lp is None else ref_lp[sl].to(device), kl_coef=cfg.kl_coef,
                    entropy=ent.detach(), num_valid_tokens=valid,
                )
                loss.backward()
                loss_sum += float(loss.detach())
                share = float(batch.loss_mask[sl].sum()) / valid
                for key, value in stats.items():
                    mb_stats[key] = mb_stats.get(key, 0.0) + value * share
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            mb_stats.update(loss=loss_sum, grad_norm=float(grad_norm))
            for key, value in mb_stats.items():
                totals[key] = totals.get(key, 0.0) + value
            count += 1
    return {key: value / count for key, value in totals.items()}


# ---------------------------------------------------------------- setup helpers

def step_problems(problems: list[Problem], step: int, per_step: int, seed: int) -> list[Problem]:
    """Problems of `step`: consecutive slices of a seeded per-epoch shuffle (deterministic in (seed, step))."""
    picked = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, pos = divmod(k, len(problems))
        order = list(range(len(problems)))
        random.Random(seed * 100_003 + epoch).shuffle(order)
        picked.append(problems[order[pos]])
    return picked


def build_judge(cfg: RLConfig) -> Judge:
    return rewards_build_judge(cfg.judge, cfg.judge_base_url, cfg.judge_model)


def build_engine(cfg: RLConfig, model, tokenizer, output_dir: Path):
    """HF: shares the learner's module. vLLM: its own copy, loaded from a local save of the current weights
    (vLLM cannot read s3:// URIs) and updated after every step."""
    if cfg.engine == "hf":
        return HFEngine(model, tokenizer)
    from models.engines.vllm_engine import VLLMEngine  # GPU machines only

    local = save_policy(model, tokenizer, output_dir / "rollout-policy")
    return VLLMEngine(str(local), max_model_len=model.config.max_position_embeddings)


def answer_test_limits(toolbox_cfg: ToolboxConfig) -> SandboxLimits:
    """Sandbox limits for running an answer against its problem's tests (HumanEval): the limits the policy's own
    code tool runs under."""
    return SandboxLimits(timeout_s=toolbox_cfg.code_timeout_s, cpu_s=int(toolbox_cfg.code_timeout_s) + 1,
                         memory_mb=toolbox_cfg.code_memory_mb)


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


# ---------------------------------------------------------------- the loop

@dataclass
class RLSession:
    """Everything one RL job holds between steps (built by `setup_session`)."""

    cfg: RLConfig
    problems: list[Problem]
    model: Any
    tokenizer: Any
    ref_model: Any  # frozen initial policy for the KL term; None when kl_coef == 0
    optimizer: torch.optim.Optimizer
    scheduler: Any
    engine: Any
    toolbox: Any
    judge: Judge
    device: torch.device
    start_step: int
    history: list[dict[str, float]]


def setup_session(cfg: RLConfig) -> RLSession:
    """Load problems and policy, build optimizer, resume from the newest checkpoint, start engine and tools."""
    torch.manual_seed(cfg.seed)
    device = torch.device("cuda" if cfg.use_gpu else "cpu")
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    problems = [p for p in read_problems(cfg.problems_path) if p.split == "train"]
    if not problems:
        raise ValueError(f"{cfg.problems_path}: no problems with split='train'; RL needs training problems")
    # A local dir is used in place; models:/name@alias, runs:/ and s3:// URIs are downloaded first.
    policy_dir = tracking.resolve_model_uri(cfg.policy, output_dir / "start-policy")
    model, tokenizer = load_policy(policy_dir, device=str(device))
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = warmup_schedule(optimizer, "constant", cfg.warmup_steps, total_steps=0)
    start_step, history = 0, []
    latest = latest_checkpoint(output_dir / "checkpoints") if cfg.resume else None
    if latest is not None:
        state = load_checkpoint(latest, model, optimizer, scheduler)
        start_step, history = state["step"], state["history"]
    return RLSession(
        cfg=cfg, problems=problems, model=model, tokenizer=tokenizer, ref_model=ref_model, optimizer=optimizer,
        scheduler=scheduler, engine=build_engine(cfg, model, tokenizer, output_dir),
        toolbox=build_toolbox(cfg.toolbox), judge=build_judge(cfg), device=device, start_step=start_step,
        history=history,
    )


def rl_step(s: RLSession, step: int) -> dict[str, float]:
    """One RL step: rollout -> reward -> advantages -> update -> weight sync. Returns its metrics."""
    cfg, tokenizer, model, device = s.cfg, s.tokenizer, s.model, s.device
    started = time.perf_counter()
    batch_problems = step_problems(s.problems, step, cfg.prompts_per_step, cfg.seed)
    episodes = run_rollouts(s.engine, tokenizer, s.toolbox, batch_problems, cfg.rollout, seed=cfg.seed * 7919 + step)
    rollout_s = time.perf_counter() - started
    stats = rollout_stats(episodes)

    # training.scoring grades (the grader evaluation uses); HumanEval answers run against the problem's tests
    test_limits = answer_test_limits(cfg.toolbox)
    scored = [
        score_response(ep.problem.family, ep.model_text, ep.problem.answers, s.judge, ep.problem.question,
                       response_tokens=len(ep.response_ids),
                       overlong_max_tokens=cfg.rollout.token_budget if cfg.overlong_buffer_tokens else 0,
                       overlong_buffer_tokens=cfg.overlong_buffer_tokens, qa_metric=cfg.qa_reward,
                       tests=ep.problem.metadata, test_limits=test_limits)
        for ep in episodes
    ]
    rewards = torch.tensor([s.score for s in scored]).view(len(batch_problems), cfg.rollout.group_size)
    advantages = group_advantages(rewards)
    keep = informative_groups(rewards) if cfg.dynamic_sampling else torch.ones(len(batch_problems), dtype=torch.bool)
    kept = [(ep, float(advantages[ep.prompt_index, ep.sample_index])) for ep in episodes if keep[ep.prompt_index]]

    train_started = time.perf_counter()
    update: dict[str, float] = {}
    if kept:
        batch = build_learner_batch([ep for ep, _ in kept], [a for _, a in kept], tokenizer.pad_token_id)
        # The learner's passes run flat sequences with per-episode attention; generation (same module) keeps sdpa.
        with packed_attention(model):
            old_lp = batch_logprobs(model, batch, cfg.rollout.temperature, cfg.micro_batch_size, device)
            ref_lp = None
            if s.ref_model is not None:
                with packed_attention(s.ref_model):
                    ref_lp = batch_logprobs(s.ref_model, batch, cfg.rollout.temperature, cfg.micro_batch_size, device)
            update = update_policy(model, s.optimizer, s.scheduler, batch, old_lp, ref_lp, cfg, device)
        gen_mask = batch.loss_mask > 0
        # Token-in/token-out check: the sampler's logprobs vs the learner's recomputation before the update.
        update["rollout_logprob_abs_diff"] = float((old_lp - batch.rollout_logprobs).abs()[gen_mask].mean())
        s.engine.update_weights(model.state_dict())  # weight sync learner -> rollout engine
    train_s = time.perf_counter() - train_started

    lengths = [sum(ep.loss_mask) for ep in episodes]
    metrics = {
        "step": step,
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "accuracy": sum(s.correct for s in scored) / len(scored),
        "format_ok": sum(s.format_score for s in scored) / len(scored),
        "response_tokens_mean": sum(lengths) / len(lengths),
        "tool_calls_per_episode": stats.tool_calls_per_episode,
        "turns_mean": sum(ep.turns for ep in episodes) / len(episodes),
        "groups_kept": float(keep.sum()),
        "time_generation_s": rollout_s - stats.tool_s,
        "time_tools_s": stats.tool_s,
        "time_training_s": train_s,
        "step_time_s": time.perf_counter() - started,
        **{f"status_{k}": v / len(episodes) for k, v in stats.status_counts.items()},
        **update,
    }
    return metrics


def train_rl(cfg: RLConfig) -> RLResult:
    """Run the RL job described by `cfg`; returns the final policy dir, MLflow run id, version and history."""
    session = setup_session(cfg)
    output_dir, history = Path(cfg.output_dir), session.history
    with tracking.start_run(cfg.mlflow_experiment, cfg.run_name, params=cfg.model_dump(mode="json"),
                            tags={"stage": "rl", "resumed_from_step": session.start_step}) as run:
        started = time.perf_counter()
        for step in tqdm(range(session.start_step, cfg.steps), desc="rl", initial=session.start_step, total=cfg.steps):
            metrics = rl_step(session, step)
            history.append(metrics)
            tracking.log_metrics({k: v for k, v in metrics.items() if k != "step"}, step=step)
            done = step + 1
            out_of_time = bool(cfg.time_budget_s) and time.perf_counter() - started > cfg.time_budget_s
            if done % cfg.checkpoint_every == 0 or done == cfg.steps or out_of_time:
                save_checkpoint(output_dir / "checkpoints", done, session.model, session.optimizer, session.scheduler,
                                {"history": history}, cfg.keep_last)
            if out_of_time:
                break
        model_dir = save_policy(session.model, session.tokenizer, output_dir / "policy")
        if history:
            fig = reward_curve_figure(history)
            tracking.log_figure(fig, "reward_curve.png")
            fig.savefig(output_dir / "reward_curve.png")
        (output_dir / "history.json").write_text(json.dumps(history, indent=1))
        run_id = run.info.run_id
        # Lineage: the parent is the start policy (a models:/ URI when it came from the registry) and the
        # data is the RL problem set, identified by its sha256.
        tags = lineage_tags("rl", run_id, cfg.policy, "", cfg.problems_path, sha256_file(Path(cfg.problems_path)))
        version = tracking.register_model(model_dir, cfg.registered_model_name, tags={**tags, "steps": len(history)})
    # Cleanup: on CPU the engine shares the learner's module and tools hold no processes between calls.
    return RLResult(model_dir=model_dir, run_id=run_id, model_version=version, history=history)
