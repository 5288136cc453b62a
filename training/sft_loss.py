"""SFT loss: summed next-token cross-entropy over target positions, LM head and softmax in chunks.

    loss_sum = token_loss_sum(model, batch, chunk_tokens=2048)   # divide by the step's global target count

Only target positions (whose next token carries a label) reach the LM head: prompt and observation positions
(~60% of CoA tokens) never pay for the (hidden x vocab) projection. Those positions are then projected and
scored `chunk_tokens` at a time, each chunk under a non-reentrant torch checkpoint: backward keeps only the
chunk's hidden states and recomputes its logits, so at most one chunk's (chunk_tokens x vocab) fp32 logits
exist at once. For a 32k-token row of Qwen2.5 (152k vocab) the full fp32 logits would be ~20 GB; a 2,048-token
chunk is 1.2 GB. A micro-batch with no more targets than one chunk takes the plain path (no recompute), which
is the 2-core default's case (2 x 1024 tokens a micro-batch).

The hidden states come from the same forward call as before (`output_hidden_states`, with `logits_to_keep` set
to no position so the model itself projects nothing), so DDP's and FSDP2's forward hooks wrap it as usual;
the LM head then runs on the root module's parameters, which FSDP2 leaves unsharded between the root's forward
and the end of backward (the root is not resharded after forward).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from training.parallel import hf_model
from training.sft_data import model_inputs, target_positions


def chunked_cross_entropy_sum(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """sum_t CE(head(hidden[t]), targets[t]) in float32, never holding more than `chunk_tokens` rows of logits."""

    def piece(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(head(h).float(), t, reduction="sum")

    if hidden.shape[0] <= chunk_tokens:
        return piece(hidden, targets)
    return sum(
        checkpoint(piece, hidden[s:s + chunk_tokens], targets[s:s + chunk_tokens], use_reentrant=False)
        for s in range(0, hidden.shape[0], chunk_tokens)
    )


def token_loss_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor], chunk_tokens: int = 2048) -> torch.Tensor:
    """Sum over target tokens of next-token cross-entropy (float32). Divide by the step's target count.

    Summing (not averaging) per micro-batch is what makes gradient accumulation and data parallelism
    token-weighted: every target token of a step counts once, whatever micro-batch or worker it landed in.
    """
    keep = target_positions(batch).to(batch["input_ids"].device)
    out = model(**model_inputs(batch), logits_to_keep=keep[:0], output_hidden_states=True)
    hidden = out.hidden_states[-1][0, keep]  # after the final norm: what the LM head reads
    targets = batch["labels"][0, keep + 1]
    return chunked_cross_entropy_sum(hf_model(model).get_output_embeddings(), hidden, targets, chunk_tokens)
