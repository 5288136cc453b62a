"""Memory-lean loss and activation checkpointing change memory, not numbers: same loss, same gradients."""
from __future__ import annotations

import torch

from models.packed_attention import PACKED_ATTENTION
from models.tiny import build_tiny_model
from training.parallel import enable_activation_checkpointing
from training.sft_data import build_examples, collate_rows, count_targets
from training.sft_loss import token_loss_sum


def _loss_and_grads(model, batch, chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss = token_loss_sum(model, batch, chunk_tokens)
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


def _packed_batch(trajectories, tokenizer):
    examples, _ = build_examples(trajectories[:6], tokenizer, None, max_len=512)
    return collate_rows([examples])


def test_chunked_loss_equals_plain_loss_and_gradients(trajectories, tokenizer, tiny_model_cfg):
    batch = _packed_batch(trajectories, tokenizer)
    model = build_tiny_model(tiny_model_cfg, tokenizer).train()
    model.set_attn_implementation(PACKED_ATTENTION)
    n = count_targets(batch)
    plain = _loss_and_grads(model, batch, chunk_tokens=n)  # one chunk: logits of every target at once
    chunked = _loss_and_grads(model, batch, chunk_tokens=8)  # many chunks, the last one short
    assert n > 8 * 10 and n % 8
    torch.testing.assert_close(chunked[0], plain[0], atol=1e-4, rtol=1e-6)
    torch.testing.assert_close(chunked[1], plain[1], atol=1e-5, rtol=1e-4)  # fp32 summation order


def test_activation_checkpointing_gives_the_same_gradients(trajectories, tokenizer, tiny_model_cfg):
    batch = _packed_batch(trajectories, tokenizer)
    results = []
    for checkpointing in (False, True):
        model = build_tiny_model(tiny_model_cfg, tokenizer).train()
        model.set_attn_implementation(PACKED_ATTENTION)
        if checkpointing:
            enable_activation_checkpointing(model)
        results.append(_loss_and_grads(model, batch, chunk_tokens=64))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b, atol=0, rtol=0)
    torch.testing.assert_close(grads_a, grads_b, atol=1e-7, rtol=1e-6)
