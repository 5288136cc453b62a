"""LLM backends for the teacher MAS, all behind one interface: `complete(agent, messages, stop) -> Completion`.

- `OpenAIChatBackend`: any OpenAI-compatible chat endpoint (a vLLM server, the platform's Ray Serve app, a hosted
  API). The key is read from the environment variable the config names; usage counts come from the server.
- `LocalEngineBackend`: a local model through `models.engines` (`GenerationEngine.generate`) and the tokenizer's
  chat template; token counts are the real prompt / generated token ids.
- `agents.teacher.oracle.ScriptedOracleBackend`: the offline default for generated problem families.

When a backend has no tokenizer, `estimate_tokens` is used: ceil(characters / 4), the usual rule of thumb for
English BPE vocabularies (it over-counts for a tiny byte-level vocabulary by a constant factor, which cancels
when MAS and trained-model counts use the same rule). Every agent call counts ALL messages sent (system prompt,
the agent's own history and the new user turn), so MAS cost grows with history like a real MAS.

Usage:
    backend = OpenAIChatBackend(endpoint="http://127.0.0.1:8000/v1", model="teacher", api_key_env="OPENAI_API_KEY")
    out = backend.complete("planning", [{"role": "user", "content": "..."}], stop=None)
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int


class LLMBackend(Protocol):
    """What every teacher backend implements. `agent` names the calling agent (thinking, planning, ...)."""

    name: str

    def complete(self, agent: str, messages: list[dict[str, str]], stop: list[str] | None) -> Completion: ...


def estimate_tokens(text: str) -> int:
    """Token estimate without a tokenizer: ceil(chars / 4) (see module docstring)."""
    return math.ceil(len(text) / 4)


def estimate_message_tokens(messages: list[dict[str, str]]) -> int:
    # +4 per message for the role markers a chat template adds.
    return sum(estimate_tokens(m["content"]) + 4 for m in messages)


class OpenAIChatBackend:
    """An OpenAI-compatible chat endpoint. Works with vLLM's server, Ray Serve and hosted APIs alike."""

    def __init__(self, endpoint: str, model: str, api_key_env: str, temperature: float, max_tokens: int,
                 timeout_s: float = 60.0):
        from openai import OpenAI

        # Local servers (vLLM, Ray Serve) accept any key; a hosted API needs the real one in `api_key_env`.
        api_key = os.environ.get(api_key_env, "EMPTY")
        self._client = OpenAI(base_url=endpoint, api_key=api_key, timeout=timeout_s)
        self._model = model
        self._temperature = temperature
        self._max_tokens = max_tokens
        self.name = f"openai:{model}"

    def complete(self, agent: str, messages: list[dict[str, str]], stop: list[str] | None) -> Completion:
        resp = self._client.chat.completions.create(
            model=self._model, messages=messages, stop=stop or None, max_tokens=self._max_tokens,
            temperature=self._temperature,
        )
        text = resp.choices[0].message.content or ""
        usage = resp.usage
        if usage is None:  # some servers omit usage; fall back to the documented estimate
            return Completion(text, estimate_message_tokens(messages), estimate_tokens(text))
        return Completion(text, int(usage.prompt_tokens), int(usage.completion_tokens))


class LocalEngineBackend:
    """A local model: the tokenizer's chat template builds the prompt, a `models.engines` engine generates."""

    def __init__(self, engine: Any, tokenizer: Any, max_new_tokens: int, temperature: float, name: str = "local"):
        self._engine = engine
        self._tokenizer = tokenizer
        self._max_new_tokens = max_new_tokens
        self._temperature = temperature
        self.name = name

    def complete(self, agent: str, messages: list[dict[str, str]], stop: list[str] | None) -> Completion:
        # transformers 5 returns a BatchEncoding by default; ask for the ids directly.
        prompt_ids = list(self._tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                              return_dict=False))
        gen = self._engine.generate([prompt_ids], max_new_tokens=self._max_new_tokens,
                                    temperature=self._temperature, stop=tuple(stop or ()))[0]
        return Completion(gen.text, len(prompt_ids), len(gen.token_ids))
