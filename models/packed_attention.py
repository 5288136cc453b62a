"""Varlen causal attention for packed training sequences: each packed example attends only to itself.

SFT flattens a micro-batch of packed examples into ONE sequence with `position_ids` restarting at 0 where each
example starts (training/sft_data.py). Stock transformers turns such position_ids into a dense block-diagonal
(N x N) mask, and sdpa then scores all N^2 pairs, the masked cross-example ones included: for a flattened
micro-batch of 8 x 1024 tokens that is 64x the work of the examples themselves. This attention instead runs one
causal sdpa call per example slice, so the cost is sum(L_i^2) and nothing is padded: what flash-attention-2's
varlen kernel does on GPU from the same position_ids.

    from models.packed_attention import PACKED_ATTENTION, packed_attention
    model.set_attn_implementation(PACKED_ATTENTION)          # registered with transformers on import
    out = model(input_ids=ids, position_ids=pos, use_cache=False)
    with packed_attention(model): ...                       # only inside a block (a model that also generates)

Contract: position_ids restart at 0 exactly where an example starts (an example never contains position 0
twice). Training forwards only: no KV cache, no attention mask (a given mask is ignored; the example boundaries
are the mask). Generation keeps sdpa.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

PACKED_ATTENTION = "sdpa_packed_varlen"


def example_bounds(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of every example in one row of position_ids: an example starts where the position is 0."""
    starts = (position_ids == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        raise ValueError("packed attention needs position_ids that start at 0 (one restart per packed example)")
    return list(zip(starts, starts[1:] + [position_ids.numel()]))


def packed_causal_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: query [B, H, T, D], key/value [B, H_kv, T, D] -> output [B, T, H, D]."""
    if position_ids is None:
        raise ValueError(f"{PACKED_ATTENTION} attention needs position_ids (restarting at 0 per packed example)")
    rows = []
    for b in range(query.shape[0]):
        parts = [
            F.scaled_dot_product_attention(
                query[b:b + 1, :, s:e], key[b:b + 1, :, s:e], value[b:b + 1, :, s:e], dropout_p=dropout,
                is_causal=True, scale=scaling, enable_gqa=query.shape[1] != key.shape[1],
            )
            for s, e in example_bounds(position_ids[b])
        ]
        rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows, dim=0).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def packed_attention(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`model` runs PACKED_ATTENTION inside the block and its previous attention afterwards (the RL learner's
    model is also the rollout engine's, whose KV-cached generation needs sdpa)."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(PACKED_ATTENTION)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


def _no_mask(*args, **kwargs) -> None:
    # The example boundaries come from position_ids inside the attention; building the dense mask would cost N^2.
    return None


AttentionInterface.register(PACKED_ATTENTION, packed_causal_attention)
AttentionMaskInterface.register(PACKED_ATTENTION, _no_mask)
