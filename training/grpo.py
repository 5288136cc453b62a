"""GRPO / DAPO learner math as pure torch functions (no Ray, no Prefect, no model-specific code).

- `group_advantages`: GRPO group-normalized outcome advantage (r - mean_g) / (std_g + eps), one value per episode
  broadcast over its tokens; std is the unbiased sample std, as verl computes it.
- `informative_groups`: DAPO dynamic sampling — groups whose rewards are all equal carry no signal (their
  advantages are all 0) and are dropped.
- `policy_loss`: PPO clipped surrogate with DAPO clip-higher (ratio clipped to [1 - eps_low, 1 + eps_high]),
  token-level aggregation (sum over every valid token of the batch / number of valid tokens, so long episodes
  are not down-weighted per token), optional KL to a reference policy with the k3 estimator, plus entropy and
  clip-fraction statistics. Observation and prompt tokens have mask 0 and never reach the loss.
- `token_logprobs`: per-token log-probabilities (and entropies) of a causal LM on given ids, at the response
  positions only (flat, unpadded forward; see its docstring).

Why a torch learner and not TRL's GRPOTrainer: TRL is not installed here, and its trainer owns the generation
loop (single-turn completions from a prompt dataset); a CoA episode interleaves policy tokens with tool
observations that must be masked out of the loss while keeping the exact generated ids and their rollout
logprobs. Expressing that means replacing TRL's rollout, masking and batching — most of the trainer — so
the ~100 lines below are the smaller, clearer option.

Usage:
    adv = group_advantages(rewards.view(P, G))                       # [P, G]
    logp, ent = token_logprobs(model, ids, attention_mask, loss_mask, temperature=1.0)   # [B, T-1] each
    loss, stats = policy_loss(logp, old_logp, adv_per_token, loss_mask, eps_low=0.2, eps_high=0.28)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """rewards [num_groups, G] -> advantages [num_groups, G] = (r - mean) / (std + eps) within each group.
    A group of one sample gets advantage 0 (no baseline to compare with)."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [num_groups, group_size], got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=True)
    return (rewards - mean) / (std + eps)


def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """rewards [num_groups, G] -> bool [num_groups]: True where not every reward in the group is equal."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) > 0


def token_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
    temperature: float = 1.0, with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each next token under `model` at the sampling temperature (what the rollout engine reports
    for a sampled token), and the entropy there, where `loss_mask` is 1: [B, T-1] each for targets
    input_ids[:, 1:], 0 where the mask is 0.

    The right-padded rows (attention_mask = a prefix of ones) run as ONE flat sequence of their real tokens,
    position ids restarting per row, and only the masked-in positions reach the LM head: no padding, no
    (hidden x vocab) projection for prompt and observation tokens. Under `models.packed_attention` each row
    attends only to itself at sum(L_i^2) cost; stock sdpa/eager give the same values from the same position
    ids through a dense block-diagonal mask."""
    lengths = attention_mask.sum(dim=1)
    if not torch.equal(attention_mask.cumprod(dim=1), attention_mask):
        raise ValueError("token_logprobs needs right-padded rows (attention_mask a prefix of ones per row)")
    rows, cols = loss_mask.nonzero(as_tuple=True)
    offsets = torch.cumsum(lengths, dim=0) - lengths
    flat_ids = torch.cat([input_ids[b, :n] for b, n in enumerate(lengths.tolist())])[None]
    positions = torch.cat([torch.arange(n, device=input_ids.device) for n in lengths.tolist()])[None]
    logits = model(input_ids=flat_ids, position_ids=positions, attention_mask=None, use_cache=False,
                   logits_to_keep=offsets[rows] + cols).logits[0].float()
    if temperature > 0:
        logits = logits / temperature
    logp, entropy = logprobs_from_logits(logits, input_ids[rows, cols + 1], with_entropy)
    dense_logp = torch.zeros(loss_mask.shape, dtype=logp.dtype, device=logp.device).index_put((rows, cols), logp)
    if entropy is None:
        return dense_logp, None
    return dense_logp, torch.zeros_like(dense_logp).index_put((rows, cols), entropy)


def logprobs_from_logits(
    logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [B, T, V], targets [B, T] -> (log p(target) [B, T], entropy [B, T] or None)."""
    log_probs = F.log_softmax(logits, dim=-1)
    token_logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1) if with_entropy else None
    return token_logp, entropy


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 (>= 0, unbiased)."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    num_valid_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped-surrogate loss with token-level aggregation. All tensors [B, T] (advantages may be [B] or
    [B, 1]: one value per episode). `num_valid_tokens` is the denominator; pass the count over the whole
    minibatch when it is split into micro-batches so accumulated gradients equal the full-batch gradient
    (default: the valid tokens of this call). Returns (loss, stats)."""
    mask = loss_mask.to(logprobs.dtype)
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    denom = float(num_valid_tokens) if num_valid_tokens is not None else mask.sum().clamp(min=1.0)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    stats: dict[str, float] = {}
    if ref_logprobs is not None and kl_coef > 0:
        kl = kl_k3(logprobs, ref_logprobs)
        per_token = per_token + kl_coef * kl
        stats["kl"] = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1.0))
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        valid = mask.sum().clamp(min=1.0)
        stats["clip_fraction"] = float(((clipped > unclipped).to(mask.dtype) * mask).sum() / valid)
        stats["ratio_mean"] = float((ratio * mask).sum() / valid)
        if entropy is not None:
            stats["entropy"] = float((entropy * mask).sum() / valid)
    return loss, stats
