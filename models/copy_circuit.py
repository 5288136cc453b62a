"""Builds a copy circuit into a freshly initialised tiny Qwen2: previous-token heads and an induction head.

Why: the student answers an unseen-entity question only by copying the entity's name, token for token, from the
question or an observation into its tool call and answer, and the numbers it compares into its code. A real
base model (Qwen) arrives with induction heads; the 2-layer tiny model trained from scratch did not form one
within `make run`'s budget (copy task, 1,500 steps: 0.000 of held-out names copied; docs/figures.md).
Initialising one makes the circuit present from step 0 and leaves SFT to learn when to use it.

The circuit (Olsson et al. 2022, "In-context learning and induction heads"), in the first two layers:
  1. The residual stream is split: token embeddings live in a (hidden - head_dim)-dim subspace T; two
     orthogonal (head_dim / 2)-dim subspaces P1 and P2 hold codes of the previous and the second-previous token.
  2. Layer 0, query heads 0 and 1: attend to distance 1 and distance 2 through their q/k *biases* alone (RoPE
     turns constant vectors into a pattern of relative position; a linear program picks the pair weights so
     the score peaks at that distance), and write a code of that token, G0 x, into P1 and P2.
  3. Layer 1, query head 0: matches two tokens, not one. On half of RoPE's low-frequency dims (where rotation
     changes the score little over COPY_DISTANCE tokens) its query is the current token's code and its key the
     P1 code; on the other half its query is the P1 code (the token before the current one) and its key the P2
     code. It attends where "the two tokens before were the current two" and copies that position's token
     back into T, where the tied output embedding reads it as a logit. Matching two tokens is what copies a
     name made of common syllables or a number made of digits, where one token recurs all over the context.
Only those heads (and their key/value heads) are set; everything else keeps its random init and all of it
trains as usual. The result is a plain Qwen2 checkpoint: vLLM, transformers and the platform's trainers load
it unchanged.

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
# Scales, chosen on the untrained 2-layer default (hidden 128): before any training it predicts the second
# copy of a 100-token sequence of distinct tokens 0.83-0.92 of the time (one-token match: 0.40-0.46) and of
# a 10-symbol sequence (digits) 0.25-0.28 (one-token match: 0.00).
PREV_TOKEN_WRITE = 0.1     # o_proj scale of the previous-token codes written into P1, P2
INDUCTION_QK = 5.0         # q/k scale of the induction head's match
INDUCTION_WRITE = 1.0      # o_proj scale of the copied token written back into T


def previous_token_pair_weights(head_dim: int, rope_theta: float, max_distance: int) -> tuple[np.ndarray, float]:
    """Per RoPE frequency pair, the weight of a constant q.k term so that the score peaks at distance 1.

    score(d) = sum_i w_i cos((d - 1) theta_i) for d in [0, max_distance]; a linear program maximises the margin
    score(1) - max_{d != 1} score(d) under sum w = 1, w >= 0. Returns (w, margin).
    """
    freqs = rope_frequencies(head_dim, rope_theta)
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


def rope_frequencies(head_dim: int, rope_theta: float) -> np.ndarray:
    """Radians per token of each RoPE pair i (dims i and i + head_dim/2 in HF's rotate_half layout)."""
    return rope_theta ** (-np.arange(head_dim // 2) * 2 / head_dim)


def slow_pairs(head_dim: int, rope_theta: float) -> list[int]:
    """The RoPE pairs that rotate by < 1 radian over COPY_DISTANCE tokens."""
    return [i for i, freq in enumerate(rope_frequencies(head_dim, rope_theta)) if freq * COPY_DISTANCE < 1.0]


def _distance_bias(amp: np.ndarray, freqs: np.ndarray, distance: int) -> np.ndarray:
    """Constant query of a head whose q.k with the constant key [amp, 0] peaks at `distance` (rotate_half layout).

    Per pair, q.k = amp^2 cos(d theta_i - distance theta_i) after RoPE: largest at d = distance."""
    return np.r_[amp * np.cos(distance * freqs), -amp * np.sin(distance * freqs)]


@torch.no_grad()
def install_copy_circuit(model: Qwen2ForCausalLM, seed: int) -> Qwen2ForCausalLM:
    """Set layer 0's query heads 0-1 to previous-token heads and layer 1's head 0 to an induction head."""
    cfg = model.config
    hidden, head_dim = cfg.hidden_size, cfg.hidden_size // cfg.num_attention_heads
    theta = cfg.rope_parameters["rope_theta"]
    pairs = slow_pairs(head_dim, theta)
    if cfg.num_hidden_layers < 2 or cfg.num_attention_heads < 2 or len(pairs) < 2 or hidden <= head_dim:
        raise ValueError(
            f"install_copy_circuit needs >= 2 layers, >= 2 heads, hidden_size > head_dim and >= 2 RoPE pairs slow "
            f"enough to match tokens over {COPY_DISTANCE} positions; got {cfg.num_hidden_layers} layers, "
            f"{cfg.num_attention_heads} heads, hidden {hidden}, head_dim {head_dim}, rope_theta {theta}. Raise "
            "rope_theta (1e6 as in Qwen2) or set copy_circuit: false.")
    code = head_dim // 2
    gen = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(hidden, hidden, generator=gen))
    token_space = basis[:, : hidden - 2 * code]
    prev1, prev2 = basis[:, hidden - 2 * code: hidden - code], basis[:, hidden - code:]

    def code_matrix() -> torch.Tensor:  # head_dim x hidden, reads the token subspace only
        return torch.randn(head_dim, hidden - 2 * code, generator=gen) / math.sqrt(hidden - 2 * code) @ token_space.T

    embed = model.model.embed_tokens.weight  # tied with lm_head in the tiny model
    embed.copy_(embed @ token_space @ token_space.T * math.sqrt(hidden / (hidden - 2 * code)))

    # Layer 0, query heads 0 and 1: distance-1 and distance-2 attention from constant q and k; both write the
    # token code G0 x of the position they attend to, into P1 and P2.
    weights, margin = previous_token_pair_weights(head_dim, theta, cfg.max_position_embeddings)
    freqs = rope_frequencies(head_dim, theta)
    amp = np.sqrt(weights * PREV_TOKEN_SHARPNESS * math.sqrt(head_dim) / margin)
    attn0 = model.model.layers[0].self_attn
    token_code = code_matrix()
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    for head, (distance, space) in enumerate(((1, prev1), (2, prev2))):
        q, kv = slice(head * head_dim, (head + 1) * head_dim), slice((head // group) * head_dim, (head // group + 1) * head_dim)
        attn0.q_proj.weight[q] = 0
        attn0.q_proj.bias[q] = torch.tensor(_distance_bias(amp, freqs, distance), dtype=attn0.q_proj.bias.dtype)
        attn0.k_proj.weight[kv] = 0
        attn0.k_proj.bias[kv] = torch.tensor(np.r_[amp, np.zeros(code)], dtype=attn0.k_proj.bias.dtype)
        attn0.v_proj.weight[kv] = token_code
        attn0.v_proj.bias[kv] = 0
        attn0.o_proj.weight[:, q] = 0
        attn0.o_proj.weight[:, head * head_dim: head * head_dim + code] = PREV_TOKEN_WRITE * space

    # Layer 1, query head 0 (key/value head 0): current token vs P1 on one half of the slow dims, P1 vs P2 on
    # the other half, so the score counts matches of both tokens.
    attn1 = model.model.layers[1].self_attn
    for proj in (attn1.q_proj, attn1.k_proj):
        proj.weight[:head_dim] = 0
        proj.bias[:head_dim] = 0
    def dims(pair_ids: list[int]) -> list[int]:  # both dims of each pair (rotate_half layout)
        return pair_ids + [i + head_dim // 2 for i in pair_ids]

    first, second = dims(pairs[: len(pairs) // 2]), dims(pairs[len(pairs) // 2:])
    attn1.q_proj.weight[first] = INDUCTION_QK * token_code[: len(first)]
    attn1.k_proj.weight[first] = INDUCTION_QK * prev1[:, : len(first)].T
    attn1.q_proj.weight[second] = INDUCTION_QK * prev1[:, : len(second)].T
    attn1.k_proj.weight[second] = INDUCTION_QK * prev2[:, : len(second)].T
    copy_code = code_matrix()
    attn1.v_proj.weight[:head_dim] = copy_code
    attn1.v_proj.bias[:head_dim] = 0
    attn1.o_proj.weight[:, :head_dim] = INDUCTION_WRITE * torch.linalg.pinv(copy_code)
    return model
