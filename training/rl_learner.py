"""The RL learner: one data-parallel worker of the learner group (FSDP2 or DDP), computing the GRPO/DAPO update.

Every rank of the group gets the same `LearnerBatch` (rank 0 builds it from the step's episodes and broadcasts
it). Each minibatch's rows are dealt round-robin to the ranks (`rank_rows`); a rank with one row fewer than the
others runs a zero-weight copy of a row instead, so every rank runs the same number of forward/backward passes
(FSDP2's all-gathers are collectives: a rank that skipped one would hang the others). The loss of a micro-batch
is its token-level sum divided by the WHOLE minibatch's valid-token count and multiplied by the world size: DDP
and FSDP2 average gradients over ranks, so the reduced gradient is exactly the one-process gradient of the
token-level mean over all ranks' tokens. Hence 2 learners give the parameters 1 learner gives (test_rl_learner).

    parts = setup_learner(cfg, policy_dir, rank, world_size, device)
    stats = learner_update(parts, batch, cfg)          # collective: every rank calls it with the same batch
    full = gathered_weights(parts)                     # collective: full fp32 weights on rank 0 (CPU), {} elsewhere

No Ray and no MLflow here: Ray Train runs these functions on its workers (training/rl_trainer.py); tests run
them on spawned gloo processes or in one process.
"""
from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule

from models.packed_attention import packed_attention
from models.policy import load_policy
from training.grpo import policy_loss, token_logprobs
from training.lr import warmup_schedule
from training.parallel import clip_grad_norm, fill_from_rank0, grad_sync, hf_model, parallelize
from training.rl_rollout import Episode


@dataclass
class LearnerBatch:
    """Right-padded sequences; everything indexed by target position t (predicting input_ids[:, t + 1])."""

    input_ids: torch.Tensor       # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor       # [B, T-1] 1 on generated response tokens only
    advantages: torch.Tensor      # [B]
    rollout_logprobs: torch.Tensor  # [B, T-1]

    def rows(self, index: list[int]) -> "LearnerBatch":
        """The batch restricted to rows `index` (repeats allowed)."""
        at = torch.tensor(index, dtype=torch.long)
        return LearnerBatch(self.input_ids[at], self.attention_mask[at], self.loss_mask[at], self.advantages[at],
                            self.rollout_logprobs[at])


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


def rank_rows(rows: range, rank: int, world_size: int) -> tuple[list[int], list[float]]:
    """This rank's rows of a minibatch (round-robin) and their weights: every rank gets ceil(n / world_size) rows;
    where it runs out it repeats its first row (or the minibatch's first row) with weight 0."""
    per_rank = -(-len(rows) // world_size)
    mine = list(rows)[rank::world_size]
    filler = mine[0] if mine else rows.start
    return mine + [filler] * (per_rank - len(mine)), [1.0] * len(mine) + [0.0] * (per_rank - len(mine))


@dataclass
class LearnerParts:
    """What `setup_learner` builds and `learner_update` mutates."""

    model: torch.nn.Module          # the wrapped (FSDP2 / DDP / bare) policy, fp32 master weights
    tokenizer: Any
    ref_model: torch.nn.Module | None  # frozen start policy for the KL term (kl_coef > 0), full copy per rank
    optimizer: torch.optim.Optimizer
    scheduler: Any
    rank: int
    world_size: int
    device: torch.device
    policy_dtype: torch.dtype       # what the exported policy is stored in (bf16 on GPU with bf16)


def setup_learner(cfg: Any, policy_dir: Path, rank: int, world_size: int, device: torch.device) -> LearnerParts:
    """Load the start policy (fp32), wrap it for `cfg.parallelism`, build AdamW + schedule. `cfg` is an RLConfig.
    FSDP on several ranks: only rank 0 reads the weights; the others get their shards from it."""
    torch.manual_seed(cfg.seed)
    from_rank0 = cfg.parallelism == "fsdp" and world_size > 1
    model, tokenizer = load_policy(policy_dir, dtype=torch.float32,
                                   device="meta" if from_rank0 and rank != 0 else "cpu")
    ref_model = None
    if cfg.kl_coef > 0:
        source = model if not (from_rank0 and rank != 0) else load_policy(policy_dir, dtype=torch.float32)[0]
        ref_model = copy.deepcopy(source).to(device).eval().requires_grad_(False)
    full_state = model.state_dict() if from_rank0 and rank == 0 else {}
    model = parallelize(model, cfg.parallelism, device, world_size, cfg.bf16, activation_checkpointing=False)
    if from_rank0:
        fill_from_rank0(model, full_state, rank, device)
        del full_state
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = warmup_schedule(optimizer, "constant", cfg.warmup_steps, total_steps=0)
    policy_dtype = torch.bfloat16 if cfg.bf16 and device.type == "cuda" else torch.float32
    return LearnerParts(model, tokenizer, ref_model, optimizer, scheduler, rank, world_size, device, policy_dtype)


def _all_reduce(values: list[float], parts: LearnerParts) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=parts.device)
    if parts.world_size > 1:
        dist.all_reduce(tensor)
    return tensor.tolist()


@torch.no_grad()
def _logprobs(model: torch.nn.Module, batch: LearnerBatch, temperature: float, micro: int, device) -> torch.Tensor:
    out = []
    for s in range(0, batch.input_ids.shape[0], micro):
        sl = slice(s, s + micro)
        lp, _ = token_logprobs(model, batch.input_ids[sl].to(device), batch.attention_mask[sl].to(device),
                               batch.loss_mask[sl].to(device), temperature, False)
        out.append(lp.cpu())
    return torch.cat(out)


def learner_update(parts: LearnerParts, batch: LearnerBatch, cfg: Any) -> dict[str, float]:
    """Collective. `ppo_epochs` x `minibatches` optimizer steps over `batch` (the same on every rank). Each
    minibatch's loss is token-level over ALL its valid tokens on all ranks. Returns the averaged stats (same on
    every rank), including `rollout_logprob_abs_diff` (sampler vs learner logprobs before the update: ~0 on-policy,
    the policy's one-step drift with `one_step_off_policy`)."""
    model, device = parts.model, parts.device
    rows = batch.input_ids.shape[0]
    per_mb = -(-rows // cfg.minibatches)
    minibatches = [range(s, min(s + per_mb, rows)) for s in range(0, rows, per_mb)]
    # Each rank's share of each minibatch, fixed for the whole update (old logprobs are per share).
    shares = [rank_rows(mb, parts.rank, parts.world_size) for mb in minibatches]
    with packed_attention(hf_model(model)):
        model.eval()
        old = [_logprobs(model, batch.rows(index), cfg.rollout.temperature, cfg.micro_batch_size, device)
               for index, _ in shares]
        refs = [None] * len(shares)
        if parts.ref_model is not None:
            with packed_attention(parts.ref_model):
                refs = [_logprobs(parts.ref_model, batch.rows(index), cfg.rollout.temperature, cfg.micro_batch_size,
                                  device) for index, _ in shares]
        # Sampler's logprobs vs the learner's recomputation before the update, over this rank's real rows.
        diff_sum, diff_count = 0.0, 0.0
        for (index, weights), old_lp in zip(shares, old):
            mine = batch.rows(index)
            valid = (mine.loss_mask > 0) & (torch.tensor(weights)[:, None] > 0)
            diff_sum += float((old_lp - mine.rollout_logprobs).abs()[valid].sum())
            diff_count += float(valid.sum())
        if cfg.one_step_off_policy:
            # The episodes came from the weights before the previous update: the ratio's denominator is the
            # behaviour policy's own logprobs (the sampler's), not the current policy's recomputation.
            old = [batch.rows(index).rollout_logprobs for index, _ in shares]
        model.train()
        totals: dict[str, float] = {}
        steps = 0
        for _ in range(cfg.ppo_epochs):
            for mb, (index, weights), old_lp, ref_lp in zip(minibatches, shares, old, refs):
                stats = _minibatch_step(parts, batch, mb, index, weights, old_lp, ref_lp, cfg)
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0.0) + value
                steps += 1
    out = {key: value / steps for key, value in totals.items()}
    diff_sum, diff_count = _all_reduce([diff_sum, diff_count], parts)
    out["rollout_logprob_abs_diff"] = diff_sum / max(diff_count, 1.0)
    return out


def _minibatch_step(parts: LearnerParts, batch: LearnerBatch, mb: range, index: list[int], weights: list[float],
                    old_lp: torch.Tensor, ref_lp: torch.Tensor | None, cfg: Any) -> dict[str, float]:
    """One optimizer step on this rank's share (`index`, zero-weight fillers masked out) of minibatch `mb`."""
    model, device = parts.model, parts.device
    valid = float(batch.loss_mask[mb.start:mb.stop].sum().clamp(min=1.0))  # the whole minibatch, all ranks
    mine = batch.rows(index)
    mine.loss_mask = mine.loss_mask * torch.tensor(weights)[:, None]
    micro = cfg.micro_batch_size
    starts = list(range(0, len(index), micro))
    parts.optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}
    for i, s in enumerate(starts):
        sl = slice(s, s + micro)
        mask = mine.loss_mask[sl].to(device)
        with grad_sync(model, enabled=i == len(starts) - 1):
            lp, ent = token_logprobs(model, mine.input_ids[sl].to(device), mine.attention_mask[sl].to(device),
                                     mask, cfg.rollout.temperature, True)
            loss, stats = policy_loss(
                lp, old_lp[sl].to(device), mine.advantages[sl].to(device), mask, eps_low=cfg.eps_low,
                eps_high=cfg.eps_high, ref_logprobs=None if ref_lp is None else ref_lp[sl].to(device),
                kl_coef=cfg.kl_coef, entropy=ent.detach(), num_valid_tokens=valid,
            )
            # DDP/FSDP average gradients over ranks: x world_size makes the reduced gradient the token-level sum
            # over every rank's tokens / valid.
            (loss * parts.world_size).backward()
        sums["loss"] = sums.get("loss", 0.0) + float(loss.detach())
        share = float(mask.sum()) / valid
        for key, value in stats.items():
            sums[key] = sums.get(key, 0.0) + value * share
    grad_norm = clip_grad_norm(model, cfg.max_grad_norm)
    parts.optimizer.step()
    parts.scheduler.step()
    keys = sorted(sums)
    reduced = dict(zip(keys, _all_reduce([sums[k] for k in keys], parts)))
    return {**reduced, "grad_norm": grad_norm}


def gathered_weights(parts: LearnerParts) -> dict[str, torch.Tensor]:
    """Collective: the full fp32 state dict on CPU at rank 0 ({} on the other ranks of a sharded group)."""
    if parts.world_size == 1 and not isinstance(parts.model, FSDPModule):
        return {k: v.detach().cpu() for k, v in hf_model(parts.model).state_dict().items()}
    full = get_model_state_dict(parts.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return full if parts.rank == 0 else {}


def weights_checksum(state_dict: Mapping[str, torch.Tensor]) -> str:
    """sha256 over names, dtypes, shapes and bytes of a state dict (what a weight sync must reproduce exactly)."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()
