"""Builds a copy circuit into a freshly initialised tiny Qwen2: a previous-token head and an induction head.

Why: the student answers an unseen-entity question only by copying the entity's name, token for token, from the
question or an observation into its tool call and answer. A real base model (Qwen) arrives with induction
heads; the 2-layer tiny model trained from scratch did not form one within `make run`'s budget (copy task,
1,500 steps: 0.000 of held-out names copied; docs/figures.md). Initialising one makes the circuit present from
step 0 and leaves SFT to learn when to use it: the same copy task copied 0.31 of the names.

The circuit (Olsson et al. 2022, "In-context learning and induction heads"), in the first two layers:
  1. The residual stream is split: token embeddings live in a (hidden - head_dim)-dim subspace T, and the
     previous-token head writes into the orthogonal head_dim-dim subspace P, so the two do not blur.
  2. Layer 0, query head 0: attends to the previous position through its q/k *biases* alone (RoPE turns
     constant vectors into a pattern of relative position; the weights are set so the score peaks at
     distance 1), and writes a code of that token, G0 · x, into P.
  3. Layer 1, query head 0: its query is the current token's code (G0 · x, read from T) and its key is the
     previous-token code (read from P), both on RoPE's low-frequency dims, where rotation changes the score
     little over COPY_DISTANCE tokens. It attends where "the token before was the current token" and copies
     that position's token back into T, where the tied output embedding reads it as a logit.
Only query head 0 (and its key/value head) of layers 0 and 1 are set; everything else keeps its random
init and all of it trains as usual. The result is a plain Qwen2 checkpoint: vLLM, transformers and the
platform's trainers load it unchanged.

Usage:
    model = Qwen2ForCausalLM(config)       # rope_theta 1e6 gives head_dim 32 eight low-frequency pairs
    install_copy_circuit(model, seed=0)
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import linprog
from transformers import Qwen2ForCausalLM

# Token distances over which the induction head's content match must hold: a RoPE pair rotates by less than
# 1 radian over this many tokens to count as low-frequency. Trajectories are <= 1,024 tokens; the names a
# student copies are mostly within a few hundred tokens of where it writes them.
COPY_DISTANCE = 512
# Softmax logit margin of the previous-token head's peak over any other distance (~e^10: sharp from step 0).
PREV_TOKEN_SHARPNESS = 10.0
# Scales, chosen on the untrained 2-layer default (hidden 128) so that the induction head's attention lands on
# the right position (0.77 of its weight) and a repeated random-token sequence is predicted 0.55 of the time
# before any training; also the values of the copy-task probe in docs/figures.md.
PREV_TOKEN_WRITE = 0.1     # o_proj scale of the previous-token code written into P
INDUCTION_QK = 5.0         # q/k scale of the induction head's match
INDUCTION_WRITE = 1.0      # o_proj scale of the copied token written back into T


def previous_token_pair_weights(head_dim: int, rope_theta: float, max_distance: int) -> tuple[np.ndarray, float]:
    """Per RoPE frequency pair, the weight of a constant q.k term so that the score peaks at distance 1.

    score(d) = sum_i w_i cos((d - 1) theta_i) for d in [0, max_distance]; a linear program maximises the margin
    score(1) - max_{d != 1} score(d) under sum w = 1, w >= 0. Returns (w, margin).
    """
    freqs = rope_theta ** (-np.arange(head_dim // 2) * 2 / head_dim)
    others = np.array([d for d in range(max_distance + 1) if d != 1])
    n = len(freqs)
    # Variables [w_0..w_{n-1}, t]; maximise t subject to (cos((d-1)theta) - 1) . w + t <= 0 for every d.
    result = linprog(
        c=np.r_[np.zeros(n), -1.0],
        A_ub=np.hstack([np.cos((others[:, None] - 1) * freqs[None, :]) - 1.0, np.ones((len(others), 1))]),
        b_ub=np.zeros(len(others)),
        A_eq=np.r_[np.ones(n), 0.0][None, :], b_eq=[1.0],
        bounds=[(0, None)] * n + [(None, None)],
    )
    if not result.success or result.x[-1] <= 0:
        raise ValueError(f"no previous-token pattern for head_dim={head_dim}, rope_theta={rope_theta}: {result.message}")
    return result.x[:n], float(result.x[-1])


def low_frequency_dims(head_dim: int, rope_theta: float) -> list[int]:
    """Head dims of the RoPE pairs that rotate by < 1 radian over COPY_DISTANCE tokens (HF's rotate_half layout)."""
    half = head_dim // 2
    freqs = rope_theta ** (-np.arange(half) * 2 / head_dim)
    pairs = [i for i in range(half) if freqs[i] * COPY_DISTANCE < 1.0]
    return pairs + [i + half for i in pairs]


@torch.no_grad()
def install_copy_circuit(model: Qwen2ForCausalLM, seed: int) -> Qwen2ForCausalLM:
    """Set layer 0's and layer 1's query head 0 to a previous-token and an induction head (see module doc)."""
    cfg = model.config
    hidden, head_dim = cfg.hidden_size, cfg.hidden_size // cfg.num_attention_heads
    theta = cfg.rope_parameters["rope_theta"]
    match_dims = low_frequency_dims(head_dim, theta)
    if cfg.num_hidden_layers < 2 or not match_dims or hidden <= head_dim:
        raise ValueError(
            f"install_copy_circuit needs >= 2 layers, hidden_size > head_dim and RoPE pairs slow enough to match "
            f"tokens over {COPY_DISTANCE} positions; got {cfg.num_hidden_layers} layers, hidden {hidden}, head_dim "
            f"{head_dim}, rope_theta {theta}. Raise rope_theta (1e6 as in Qwen2) or set copy_circuit: false.")
    gen = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(hidden, hidden, generator=gen))
    token_space, prev_space = basis[:, : hidden - head_dim], basis[:, hidden - head_dim:]

    def code_matrix() -> torch.Tensor:  # head_dim x hidden, reads the token subspace only
        return torch.randn(head_dim, hidden - head_dim, generator=gen) / math.sqrt(hidden - head_dim) @ token_space.T

    embed = model.model.embed_tokens.weight  # tied with lm_head in the tiny model
    embed.copy_(embed @ token_space @ token_space.T * math.sqrt(hidden / (hidden - head_dim)))

    # Layer 0, query head 0 (key/value head 0): previous-token attention from constant q and k.
    weights, margin = previous_token_pair_weights(head_dim, theta, cfg.max_position_embeddings)
    half = head_dim // 2
    freqs = theta ** (-np.arange(half) * 2 / head_dim)
    # q.k per pair is amp_q * amp_k * cos(d*theta_i + phase); the phase -theta_i puts the peak at d = 1.
    amp = np.sqrt(weights * PREV_TOKEN_SHARPNESS * math.sqrt(head_dim) / margin)
    q_bias = np.r_[amp * np.cos(freqs), -amp * np.sin(freqs)]
    k_bias = np.r_[amp, np.zeros(half)]
    attn0 = model.model.layers[0].self_attn
    attn0.q_proj.weight[:head_dim] = 0
    attn0.k_proj.weight[:head_dim] = 0
    attn0.q_proj.bias[:head_dim] = torch.tensor(q_bias, dtype=attn0.q_proj.bias.dtype)
    attn0.k_proj.bias[:head_dim] = torch.tensor(k_bias, dtype=attn0.k_proj.bias.dtype)
    token_code = code_matrix()
    attn0.v_proj.weight[:head_dim] = token_code
    attn0.v_proj.bias[:head_dim] = 0
    attn0.o_proj.weight[:, :head_dim] = PREV_TOKEN_WRITE * prev_space

    # Layer 1, query head 0 (key/value head 0): match current token's code against the previous-token code.
    attn1 = model.model.layers[1].self_attn
    for proj in (attn1.q_proj, attn1.k_proj):
        proj.weight[:head_dim] = 0
        proj.bias[:head_dim] = 0
    n = len(match_dims)
    attn1.q_proj.weight[match_dims] = INDUCTION_QK * token_code[:n]
    attn1.k_proj.weight[match_dims] = INDUCTION_QK * prev_space[:, :n].T
    copy_code = code_matrix()
    attn1.v_proj.weight[:head_dim] = copy_code
    attn1.v_proj.bias[:head_dim] = 0
    attn1.o_proj.weight[:, :head_dim] = INDUCTION_WRITE * torch.linalg.pinv(copy_code)
    return model
