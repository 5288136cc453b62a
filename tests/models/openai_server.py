"""A small real HTTP server speaking the OpenAI completions/chat API shape (with vLLM's token-id extensions),
backed by HFEngine, for testing OpenAIEngine on 127.0.0.1 without vLLM.

Usage (tests):
    with serve_openai(engine, tokenizer, model_name="tiny", api_key="k") as base_url: ...
"""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

from models.engines.hf import HFEngine


def _handler(engine: HFEngine, tokenizer, model_name: str, api_key: str):
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
                ids = tokenizer.apply_chat_template(request["messages"], tokenize=False, add_generation_prompt=True)
                gen = engine.generate([tokenizer.encode(ids, add_special_tokens=False)], **kwargs)[0]
                text = gen.text[: -len(gen.stop)] if gen.stop else gen.text  # OpenAI: stop string excluded
                return self._reply(200, {
                    "id": "c", "object": "chat.completion", "created": 0, "model": model_name,
                    "choices": [{"index": 0, "finish_reason": gen.finish_reason,
                                 "message": {"role": "assistant", "content": text}}],
                })
            return self._reply(404, {"error": {"message": f"no route {self.path}"}})

    return Handler


@contextmanager
def serve_openai(engine: HFEngine, tokenizer, model_name: str, api_key: str) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(engine, tokenizer, model_name, api_key))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
