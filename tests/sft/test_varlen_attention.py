"""Varlen attention for packed rows: example boundaries, the kernel choice per device, and (on a GPU) the same
outputs and gradients as the per-example sdpa loop."""
from __future__ import annotations

import pytest
import torch

from models.packed_attention import PACKED_ATTENTION
from models.tiny import build_tiny_model
from training.sft_data import build_examples, collate_rows
from training.sft_loss import token_loss_sum
from training.varlen_attention import VARLEN_ATTENTION, cu_seqlens, packed_attention_for, varlen_attn


def test_cu_seqlens_marks_every_packed_example():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    bounds, longest = cu_seqlens(positions)
    assert bounds.tolist() == [0, 3, 5, 9] and bounds.dtype == torch.int32 and longest == 4
    with pytest.raises(ValueError):
        cu_seqlens(torch.tensor([[1, 2, 0]]))


def test_cpu_keeps_the_sdpa_loop():
    assert packed_attention_for(torch.device("cpu"), bf16=True, choice="auto") == PACKED_ATTENTION
    with pytest.raises(ValueError):
        packed_attention_for(torch.device("cpu"), bf16=True, choice="varlen")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or varlen_attn is None, reason="needs CUDA and torch's varlen attention")
def test_varlen_matches_the_sdpa_loop_on_gpu(trajectories, tokenizer, tiny_model_cfg):
    assert packed_attention_for(torch.device("cuda"), bf16=True, choice="auto") == VARLEN_ATTENTION
    examples, _ = build_examples(trajectories[:6], tokenizer, None, max_len=512)
    batch = {k: v.cuda() for k, v in collate_rows([examples]).items()}
    outputs = []
    for attn in (PACKED_ATTENTION, VARLEN_ATTENTION):
        model = build_tiny_model(tiny_model_cfg, tokenizer).to("cuda", torch.bfloat16)
        model.set_attn_implementation(attn)
        loss = token_loss_sum(model, batch)
        loss.backward()
        outputs.append((loss.detach().float(), torch.cat([p.grad.float().flatten() for p in model.parameters()])))
    (loss_a, grads_a), (loss_b, grads_b) = outputs
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-2, atol=0)  # bf16 kernels: agreement to bf16 precision
    torch.testing.assert_close(grads_a, grads_b, rtol=5e-2, atol=5e-3)
