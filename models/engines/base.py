"""What every generation engine returns and offers: the interface rollouts, evaluation and serving call.

Engines: `models.engines.hf.HFEngine` (transformers, CPU or GPU, in process), `models.engines.vllm_engine.
VLLMEngine` (vLLM in process, GPU machines) and `models.engines.openai_http.OpenAIEngine` (any server with
the OpenAI completions API, e.g. `vllm serve`). Prompts and outputs are token ids, so the RL learner scores
exactly the ids that were sampled.

Usage:
    gens = engine.generate([prompt_ids], max_new_tokens=256, temperature=1.0, seed=0)
    gens[0].token_ids, gens[0].logprobs, gens[0].finish_reason, gens[0].stop
    engine.update_weights(model.state_dict())     # after an RL step
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

import torch

from models.format import STOP_STRINGS


@dataclass
class Generation:
    """One completion. `token_ids` include the stop token; `logprobs[i]` belongs to `token_ids[i]`.

    finish_reason: "stop" (a stop string or eos was produced) or "length" (max_new_tokens reached).
    stop: the stop string that ended generation, None for eos or length.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    stop: str | None


class GenerationEngine(Protocol):
    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: Sequence[str] = STOP_STRINGS,
        seed: int | Sequence[int] | None = None,
    ) -> list[Generation]:
        """Complete each prompt until a stop string, eos or `max_new_tokens`; temperature 0 is greedy. `seed`: an
        int seeds the call; a sequence gives one seed per prompt, and each prompt's sample then depends only on
        its own seed (not on the batch it shares), which is what rollout pools of any size rely on."""
        ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load new policy weights (same architecture) before the next generate."""
        ...
