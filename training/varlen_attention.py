"""Packed-row attention on GPU through torch's own varlen flash attention, and the choice of kernel per device.

    attn = packed_attention_for(device, bf16, "auto")    # VARLEN_ATTENTION on a bf16 GPU with torch's varlen,
    model.set_attn_implementation(attn)                  # else models.packed_attention's per-example sdpa loop

The flat micro-batch (training/sft_data.py) restarts `position_ids` at 0 per packed example. The CPU path runs
one causal sdpa call per example (models/packed_attention.py): on a GPU that is one kernel launch per example
per layer, which starves the GPU on rows of many short examples. Here the example boundaries become cumulative
sequence lengths (`cu_seqlens`) and ONE `torch.nn.attention.varlen.varlen_attn` call per layer attends every
example causally within itself: the same result (tests/sft/test_varlen_attention.py compares them on GPU),
flash-attention memory (O(tokens)), no padding. Flash kernels need fp16/bf16 and CUDA, hence the choice by
device and dtype; flash-attn (the package) is not needed.
"""
from __future__ import annotations

import inspect
from typing import Literal

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from models.packed_attention import PACKED_ATTENTION

try:  # torch >= 2.10
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # older torch: the sdpa loop only
    varlen_attn = None

VARLEN_ATTENTION = "torch_varlen_packed"
PackedAttention = Literal["auto", "sdpa", "varlen"]


def cu_seqlens(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(int32 cumulative example lengths [0, l0, l0+l1, ..., N], longest example) of flattened position_ids
    whose every example starts at position 0 (rows of a batch start at 0 too)."""
    flat = position_ids.flatten()
    starts = (flat == 0).nonzero().flatten()
    if starts.numel() == 0 or starts[0] != 0:
        raise ValueError("varlen attention needs position_ids that start at 0 (one restart per packed example)")
    bounds = torch.cat([starts, starts.new_tensor([flat.numel()])]).to(torch.int32)
    return bounds, int((bounds[1:] - bounds[:-1]).max())


def _causal_kwargs() -> dict:
    # torch 2.10/2.11 take `is_causal`; later releases express causality as window_size=(-1, 0).
    params = inspect.signature(varlen_attn).parameters
    return {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}


def varlen_causal_attention(
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
        raise ValueError(f"{VARLEN_ATTENTION} attention needs position_ids (restarting at 0 per packed example)")
    batch, heads, length, dim = query.shape
    if key.shape[1] != heads:  # grouped-query attention: every query head reads its group's K/V head
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
        value = value.repeat_interleave(heads // value.shape[1], dim=1)
    bounds, longest = cu_seqlens(position_ids)
    q, k, v = (t.transpose(1, 2).reshape(batch * length, heads, dim) for t in (query, key, value))
    out = varlen_attn(q, k, v, bounds, bounds, longest, longest, scale=scaling, **_causal_kwargs())
    return out.reshape(batch, length, heads, dim), None


def packed_attention_for(device: torch.device, bf16: bool, choice: PackedAttention) -> str:
    """The attention implementation for packed rows: `varlen` where it runs (CUDA, bf16 compute, torch's
    varlen present), else the per-example sdpa loop; `auto` picks varlen whenever it can."""
    varlen_runs = varlen_attn is not None and device.type == "cuda" and bf16
    if choice == "varlen" and not varlen_runs:
        raise ValueError("packed_attention=varlen needs CUDA, bf16 and torch.nn.attention.varlen (torch >= 2.10)")
    return VARLEN_ATTENTION if choice != "sdpa" and varlen_runs else PACKED_ATTENTION


AttentionInterface.register(VARLEN_ATTENTION, varlen_causal_attention)
# The example boundaries come from position_ids inside the attention; no dense mask is built.
AttentionMaskInterface.register(VARLEN_ATTENTION, lambda *args, **kwargs: None)
