"""The wire format of the serving app, as OpenAI's API defines it: request bodies (validated: a bad request is
a 400, never a 500 or a silent 200), response and stream-chunk bodies, the error body, and SSE framing.

    from serving.openai_schema import ChatRequest, OpenAIError, chat_chunk, sse
    req = ChatRequest.model_validate(body)                  # pydantic.ValidationError -> 400 (serving/app.py)
    raise OpenAIError(404, "model 'x' not served", param="model", code="model_not_found")
    yield sse(chat_chunk(cid, created, "afm", {"content": "Hi"}))  # b'data: {...}\\n\\n'; then sse("[DONE]")

Used by serving/app.py (HTTP) and serving/service.py (the model side). Only text is supported: a content part
of another type (image_url, input_audio) is a 400 naming it. Fields OpenAI defines that this server does not
implement (presence_penalty, logit_bias, ...) are accepted and ignored, as vLLM's server does; `n` > 1 is a 400.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class OpenAIError(Exception):
    """An error the client should see as OpenAI's `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def validation_error(exc: ValidationError | Any) -> OpenAIError:
    """A 400 from pydantic's (or FastAPI's) list of errors: the first one, with its field path as `param`."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": str(exc)}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    message = f"{param}: {first['msg']}" if param else first["msg"]
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    return OpenAIError(400, message, param=param, code="invalid_value")


class Request(BaseModel):
    # Clients send fields this server does not implement (user, logit_bias, ...): accepted and ignored.
    model_config = ConfigDict(extra="ignore")


class TextPart(BaseModel):
    type: Literal["text"] = Field(description="Only text parts are supported.")
    text: str = Field(description="The text of this part.")


class ChatMessage(Request):
    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(description="Who wrote the message.")
    content: str | list[TextPart] | None = Field(None, description="Text, or a list of text parts (joined).")

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(Request):
    include_usage: bool = Field(False, description="Send a last chunk with `usage` and no choices.")


class ChatRequest(Request):
    """POST /v1/chat/completions. Ranges as OpenAI documents them; the `max_tokens` upper bound depends on the
    model and the prompt, so the service checks it (AgentService.completion_budget)."""

    model: str = Field(description="Served model name (GET /v1/models).")
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation; at least one message.")
    max_tokens: int | None = Field(None, gt=0, description="Completion length cap; default: the server's.")
    max_completion_tokens: int | None = Field(None, gt=0, description="Newer name of max_tokens (wins if both).")
    temperature: float | None = Field(None, ge=0, le=2, description="Sampling temperature; 0 = greedy; default 1.")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling mass; default 1.")
    n: int = Field(1, ge=1, le=1, description="Choices per request; only 1 is supported.")
    stop: list[str] | str | None = Field(default_factory=list, description="Up to 4 strings that end the completion (not returned).")
    seed: int | None = Field(None, description="Sampling seed (same seed, same request -> same completion).")
    stream: bool = Field(False, description="Send the completion as server-sent events.")
    stream_options: StreamOptions | None = Field(None, description="Streaming options (include_usage).")

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: list[str] | str | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop: up to 4 non-empty strings")
        return stops

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class AgentRequest(Request):
    """POST /v1/agent: one question, the whole CoA loop with tools."""

    question: str = Field(min_length=1, description="The task for the agent.")
    temperature: float | None = Field(None, ge=0, le=2, description="Sampling temperature; default the server's.")
    stream: bool = Field(False, description="Send trajectory segments as server-sent events as they are produced.")


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chat_completion(cid: str, model: str, text: str, finish_reason: str, prompt_tokens: int,
                    completion_tokens: int) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish_reason}],
            "usage": usage(prompt_tokens, completion_tokens)}


def chat_chunk(cid: str, created: int, model: str, delta: dict[str, Any], finish_reason: str | None = None,
               usage_: dict[str, int] | None = None) -> dict[str, Any]:
    """One `chat.completion.chunk`; with `usage_` it is the final usage chunk (empty `choices`, as OpenAI's)."""
    choices = [] if usage_ is not None else [{"index": 0, "delta": delta, "logprobs": None,
                                              "finish_reason": finish_reason}]
    chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices}
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: `data: <json>` (or a literal such as `[DONE]`) and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()
