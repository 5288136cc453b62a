"""LLM backends for the teacher MAS, all behind one interface:
`complete(agent, messages, stop, schema=None) -> Completion`.

- `OpenAIChatBackend`: any OpenAI-compatible chat endpoint (a vLLM server, the platform's Ray Serve app, a hosted
  API), configured by `OpenAIClientConfig`:
  * timeouts: `connect_timeout_s` to open a connection, `timeout_s` for a whole reply (size it for max_tokens at
    the server's decode speed under load, not for an idle server);
  * retries with exponential backoff and jitter on the named transient errors only, `TRANSIENT_ERRORS`: 429
    (rate limit; a Retry-After header is honoured up to `backoff_max_s`), 5xx, timeouts and connection errors.
    Any other 4xx (400 bad request, 401 key, 404 model) is raised at once: repeating it cannot help;
  * a concurrency limit per endpoint: one semaphore per base URL per PROCESS (`endpoint_slots`), shared by every
    backend object in it. In a Ray rollout pool each actor is a process, so the endpoint sees up to
    num_actors x max_concurrency requests; size the two together;
  * structured output: with `structured_output` on, role agents that have a reply schema
    (`agents.teacher.protocol.ROLE_SCHEMAS`) get it enforced by the server. Servers differ, so it is a flag:
    `json_schema` (OpenAI `response_format`), `guided_json` (older vLLM `extra_body`; removed in vLLM 0.12),
    `structured_outputs` (recent vLLM `extra_body`, the only form from 0.12 on);
  * token counts from the server's `usage` (the estimate below only when a server omits it);
  * the API key from the environment variable `api_key_env`, or from a Prefect Secret block when
    `api_key_secret_block` names one. The key lives only inside the OpenAI client: it is never logged, never in
    a config, a repr, a MAS log or an error message this module raises. NOT covered: a server that echoes the
    key back in its own error body, and what a debugger or `OPENAI_LOG=debug` shows.
- `LocalEngineBackend`: a local model through `models.engines` (`GenerationEngine.generate`) and the tokenizer's
  chat template; token counts are the real prompt / generated token ids. No schema enforcement.
- `agents.teacher.oracle.ScriptedOracleBackend`: the offline default for generated problem families.

When a backend has no tokenizer, `estimate_tokens` is used: ceil(characters / 4), the usual rule of thumb for
English BPE vocabularies (it over-counts for a tiny byte-level vocabulary by a constant factor, which cancels
when MAS and trained-model counts use the same rule). Every agent call counts ALL messages sent (system prompt,
the agent's own history and the new user turn), so MAS cost grows with history like a real MAS.

Usage:
    backend = OpenAIChatBackend("http://127.0.0.1:8000/v1", "teacher", "OPENAI_API_KEY", temperature=0.7,
                                max_tokens=512, client=OpenAIClientConfig(max_concurrency=8))
    out = backend.complete("planning", [{"role": "user", "content": "..."}], stop=None)
"""
from __future__ import annotations

import math
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal, Protocol, TypeVar

import openai
from pydantic import Field

from afm.config import Config
from agents.teacher.protocol import with_string_caps

T = TypeVar("T")

# What is worth retrying: the server is busy (429), broken for now (5xx) or unreachable / slow (timeouts and
# connection errors; APITimeoutError is an APIConnectionError).
TRANSIENT_ERRORS = (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError)


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int


class LLMBackend(Protocol):
    """What every teacher backend implements. `agent` names the calling agent (thinking, planning, ...);
    `schema` is the JSON schema of that agent's reply, which a backend with `structured` set has enforced;
    `max_concurrency` is how many calls the backend serves at once (callers size their thread pools by it)."""

    name: str
    structured: bool
    max_concurrency: int

    def complete(self, agent: str, messages: list[dict[str, str]], stop: list[str] | None,
                 schema: dict | None = None) -> Completion: ...


def estimate_tokens(text: str) -> int:
    """Token estimate without a tokenizer: ceil(chars / 4) (see module docstring)."""
    return math.ceil(len(text) / 4)


def estimate_message_tokens(messages: list[dict[str, str]]) -> int:
    # +4 per message for the role markers a chat template adds.
    return sum(estimate_tokens(m["content"]) + 4 for m in messages)


class OpenAIClientConfig(Config):
    """How the teacher talks to an OpenAI-compatible endpoint (the endpoint and model are TeacherConfig's)."""

    timeout_s: float = Field(300.0, gt=0, description="Seconds one reply may take (read timeout); size it for "
                                                      "max_tokens at the server's decode speed under full load")
    connect_timeout_s: float = Field(10.0, gt=0, description="Seconds to open a connection")
    max_retries: int = Field(5, ge=0, description="Retries of one call after a transient error (429, 5xx, "
                                                  "timeout, connection error); never after another 4xx")
    backoff_base_s: float = Field(1.0, ge=0, description="First retry waits ~this, then doubling (with jitter)")
    backoff_max_s: float = Field(60.0, ge=0, description="Cap on one wait, also on a server's Retry-After")
    max_concurrency: int = Field(8, ge=1, description="Calls in flight to one endpoint (base URL) from one "
                                                      "process; a Ray pool multiplies it by num_actors")
    structured_output: Literal["off", "json_schema", "guided_json", "structured_outputs"] = Field(
        "off", description="Server-enforced role replies: json_schema (OpenAI response_format), guided_json "
                           "(older vLLM extra_body, removed in 0.12), structured_outputs (recent vLLM); off: "
                           "plain text read by the tolerant parser")
    structured_string_chars: int = Field(400, ge=1, description="guided_json / structured_outputs: maxLength of each "
                                                                "free-text field, so a guided reply closes within "
                                                                "max_tokens (a cut reply is invalid JSON)")
    api_key_secret_block: str = Field("", description="Name of a Prefect Secret block holding the API key; "
                                                      "'' = read the env var TeacherConfig.api_key_env")


_SLOTS: dict[str, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def endpoint_slots(base_url: str, limit: int) -> threading.BoundedSemaphore:
    """The process-wide semaphore of one endpoint. The first caller's `limit` sets it: one endpoint, one bound."""
    key = base_url.rstrip("/")
    with _SLOTS_LOCK:
        if key not in _SLOTS:
            _SLOTS[key] = threading.BoundedSemaphore(limit)
        return _SLOTS[key]


def backoff_delay(attempt: int, base_s: float, max_s: float, rng: random.Random,
                  retry_after_s: float | None = None) -> float:
    """Wait before retry `attempt` (0-based): base * 2^attempt capped, half of it jittered so that many clients
    throttled together do not come back together; at least the server's Retry-After (capped too)."""
    ceiling = min(max_s, base_s * 2 ** attempt)
    delay = ceiling / 2 + rng.uniform(0, ceiling / 2)
    return min(max_s, max(delay, retry_after_s or 0.0))


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    try:
        return float(response.headers.get("retry-after")) if response is not None else None
    except (TypeError, ValueError):  # absent, or an HTTP date (not worth parsing for a capped wait)
        return None


def call_with_retries(fn: Callable[[], T], cfg: OpenAIClientConfig, rng: random.Random,
                      sleep: Callable[[float], None] = time.sleep) -> T:
    """`fn()`, retried on TRANSIENT_ERRORS up to `cfg.max_retries` times; other errors propagate at once."""
    for attempt in range(cfg.max_retries + 1):
        try:
            return fn()
        except TRANSIENT_ERRORS as exc:
            if attempt == cfg.max_retries:
                raise
            sleep(backoff_delay(attempt, cfg.backoff_base_s, cfg.backoff_max_s, rng, _retry_after(exc)))
    raise AssertionError("unreachable")  # the loop returns or raises


def resolve_api_key(api_key_env: str, secret_block: str) -> str:
    """The key from the Prefect Secret block if one is named, else the env var; 'EMPTY' for local servers that
    accept any key. The Prefect import is deferred: only a run that names a block needs a Prefect server."""
    if secret_block:
        from prefect.blocks.system import Secret

        return str(Secret.load(secret_block).get())
    return os.environ.get(api_key_env) or "EMPTY"


def structured_request(cfg: OpenAIClientConfig, agent: str, schema: dict | None) -> dict[str, Any]:
    """The request arguments that make a server enforce `schema` (none when structured output is off or the
    agent has no schema)."""
    mode = cfg.structured_output
    if mode == "off" or schema is None:
        return {}
    if mode == "json_schema":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": f"{agent}_reply", "schema": schema, "strict": True}}}
    capped = with_string_caps(schema, cfg.structured_string_chars)
    if mode == "guided_json":
        return {"extra_body": {"guided_json": capped}}
    return {"extra_body": {"structured_outputs": {"json": capped}}}


class OpenAIChatBackend:
    """An OpenAI-compatible chat endpoint. Works with vLLM's server, Ray Serve and hosted APIs alike."""

    def __init__(self, endpoint: str, model: str, api_key_env: str, temperature: float, max_tokens: int,
                 client: OpenAIClientConfig | None = None, seed: int = 0):
        self.cfg = client or OpenAIClientConfig()
        # The SDK's own retries are off: ours retry only the named transient errors, with jitter.
        self._client = openai.OpenAI(
            base_url=endpoint, api_key=resolve_api_key(api_key_env, self.cfg.api_key_secret_block), max_retries=0,
            timeout=openai.Timeout(self.cfg.timeout_s, connect=self.cfg.connect_timeout_s))
        self._endpoint = endpoint
        self._model = model
        self._temperature = temperature
        self._max_tokens = max_tokens
        self._slots = endpoint_slots(endpoint, self.cfg.max_concurrency)
        self._rng = random.Random(seed)
        self.name = f"openai:{model}"
        self.structured = self.cfg.structured_output != "off"
        self.max_concurrency = self.cfg.max_concurrency

    def __repr__(self) -> str:
        return f"OpenAIChatBackend(endpoint={self._endpoint!r}, model={self._model!r})"  # never the key

    def _create(self, agent: str, messages: list[dict[str, str]], stop: list[str] | None, schema: dict | None):
        with self._slots:  # held per attempt, not across backoff waits: a waiting call frees its slot
            return self._client.chat.completions.create(
                model=self._model, messages=messages, stop=stop or None, max_tokens=self._max_tokens,
                temperature=self._temperature, **structured_request(self.cfg, agent, schema))

    def complete(self, agent: str, messages: list[dict[str, str]], stop: list[str] | None,
                 schema: dict | None = None) -> Completion:
        resp = call_with_retries(lambda: self._create(agent, messages, stop, schema), self.cfg, self._rng)
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
        self.structured = False  # a local engine enforces no schema; the tolerant parser reads its replies
        self.max_concurrency = 1  # one engine in this process: calls queue anyway

    def complete(self, agent: str, messages: list[dict[str, str]], stop: list[str] | None,
                 schema: dict | None = None) -> Completion:
        # transformers 5 returns a BatchEncoding by default; ask for the ids directly.
        prompt_ids = list(self._tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                              return_dict=False))
        gen = self._engine.generate([prompt_ids], max_new_tokens=self._max_new_tokens,
                                    temperature=self._temperature, stop=tuple(stop or ()))[0]
        return Completion(gen.text, len(prompt_ids), len(gen.token_ids))
