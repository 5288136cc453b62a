"""The model side of `afm serve`: one policy, its tokenizer and its tools, answering OpenAI chat completions
(whole or token by token) and running the Chain-of-Agents loop of /v1/agent (whole or segment by segment).
No HTTP here: serving/app.py maps routes onto AgentService and its errors (OpenAIError) onto status codes.

Two engines (`ServeConfig.engine`): `hf` runs the policy here with transformers (CPU); `vllm` starts vLLM's own
OpenAI server as a child process (serving/vllm_server.py), forwards chat completions to it after validating them
here, and runs the /v1/agent loop through it (models/engines/openai_http.OpenAIEngine); the policy's weights are
then never loaded in this process, only its tokenizer. `auto` is vllm where there are GPUs and the configured
interpreter has vLLM, else hf.

    cfg = ServeConfig(model="/path/to/policy")
    svc = AgentService(cfg)                     # cfg.model must already be a local directory (prepare_model)
    svc.chat(ChatRequest(model="afm", messages=[{"role": "user", "content": "hi"}]))
    for event in svc.agent_events(AgentRequest(question="What is 2+3?")): ...

Tools for /v1/agent, first that applies: `ServeConfig.toolbox` (`afm serve --tools`), the toolbox recorded
with the model (`<model>/afm_tools/toolbox.json`, written by afm/tracking.py when RL registered it, with its
search corpus), else the code tool alone. A corpus (recorded or `--corpus`) is served as the mini-web, as in RL
and evaluation (problems.miniweb.serve_corpus), so web_search and crawl_page see the pages the model saw.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field
from transformers import DynamicCache

from afm.config import Config
from afm.tracking import TOOLS_DIR
from agents.tools.toolbox import ToolboxConfig, build_toolbox
from models.engines.hf import HFEngine, cache_kwarg, sample_next_tokens
from models.engines.openai_http import OpenAIEngine
from models.format import STOP_STRINGS, render_segments
from models.policy import load_policy
from models.tokenizer import decode, encode_prompt, load_tokenizer
from problems.miniweb import serve_corpus
from problems.records import Problem
from serving.openai_schema import AgentRequest, ChatRequest, OpenAIError, chat_chunk, chat_completion, \
    completion_id, usage
from serving.vllm_server import VLLMConfig, VLLMServer, has_vllm, interpreter
from training.rl_rollout import Episode, RolloutConfig, advance_episode


class ServeConfig(Config):
    model: str = Field(..., description="Policy: directory, s3:// artifact or MLflow URI (models:/afm-rl@champion).")
    model_name: str = Field("afm", description="Name reported by /v1/models and accepted in requests.")
    host: str = Field("127.0.0.1", description="Bind address (loopback by default).")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port; in use is an error, not a silent reuse.")
    max_new_tokens: int = Field(256, ge=1, description="Completion length when a request gives no max_tokens.")
    max_tokens_limit: int = Field(2048, ge=1, description="Largest max_tokens a request may ask for (also capped "
                                                          "by the model's context minus the prompt); above: 400.")
    agent: RolloutConfig = Field(default_factory=lambda: RolloutConfig(group_size=1, temperature=0.0),
                                 description="CoA loop of /v1/agent (turns, budgets, sampling).")
    toolbox: ToolboxConfig | None = Field(None, description="Tools of /v1/agent; None: the toolbox recorded with "
                                                            "the model, else the code tool only.")
    corpus_path: Path | None = Field(None, description="Search corpus (JSONL) served as the mini-web for the web "
                                                       "tools; None: the corpus recorded with the model, if any.")
    engine: Literal["auto", "hf", "vllm"] = Field("auto", description="hf: transformers in the replica (CPU); vllm: "
                                                                      "vLLM's OpenAI server as the replica's child "
                                                                      "process; auto: vllm when the Ray cluster has "
                                                                      "GPUs and vllm.python has vLLM, else hf.")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="The vLLM server (engine vllm).")


def recorded_tools(model_dir: Path) -> tuple[ToolboxConfig | None, Path | None]:
    """The toolbox config and corpus file recorded inside a registered model's directory, or (None, None)."""
    record = model_dir / TOOLS_DIR / "toolbox.json"
    if not record.is_file():
        return None, None
    data = json.loads(record.read_text())
    corpus = model_dir / TOOLS_DIR / data["corpus_path"] if data.get("corpus_path") else None
    data["corpus_path"] = None  # serve_corpus sets it to wherever the corpus is served from
    return ToolboxConfig.model_validate(data), corpus


def serving_tools(cfg: ServeConfig, model_dir: Path) -> tuple[ToolboxConfig, Path | None, str]:
    """(toolbox, corpus, where they came from) for /v1/agent; see the module docstring for the order."""
    recorded, recorded_corpus = recorded_tools(model_dir)
    corpus = cfg.corpus_path or recorded_corpus
    if cfg.toolbox is not None:
        return cfg.toolbox, corpus, "--tools"
    if recorded is not None:
        return recorded, corpus, f"recorded with the model ({TOOLS_DIR}/toolbox.json)"
    return ToolboxConfig(tools=["code"]), corpus, "default (code only; no toolbox recorded with the model)"


class ServeError(RuntimeError):
    """A serving setup that cannot work (`afm serve` prints the message and exits 1)."""


def resolve_engine(cfg: ServeConfig, gpus: bool) -> Literal["hf", "vllm"]:
    """The engine `cfg.engine` means on a cluster with (or without) GPUs. An explicit vllm whose interpreter
    lacks vLLM is an error here, in the driver, rather than a replica that never comes up."""
    if cfg.engine == "hf" or (cfg.engine == "auto" and not gpus):
        return "hf"
    if has_vllm(interpreter(cfg.vllm)):
        return "vllm"
    if cfg.engine == "auto":
        return "hf"
    raise ServeError(f"engine=vllm, but {interpreter(cfg.vllm)} cannot import vllm: install it there (pip install "
                     f"'.[gpu]') or set vllm.python to an interpreter that has it (e.g. .vllm-venv/bin/python)")


def check_tools(toolbox: ToolboxConfig, corpus: Path | None) -> None:
    """Fail in the driver, with the fix in the message, rather than in the replica with a traceback."""
    needs_corpus = "wiki_search" in toolbox.tools or (
        "web_search" in toolbox.tools and toolbox.web_search_backend == "local")
    if needs_corpus and corpus is None:
        raise ServeError(f"/v1/agent tools {toolbox.tools} search a local corpus, and none is recorded with the "
                         f"model: pass --corpus <distill dataset>/corpus.jsonl (or --tools code)")


@dataclass
class Completion:
    """Filled in while `stream_text` runs: why it ended and how many tokens it generated."""

    finish_reason: str = "length"
    completion_tokens: int = 0


class AgentService:
    """Model + engine + tools for one served policy (cfg.model is a local directory here)."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        model_dir = Path(cfg.model)
        self._resources = ExitStack()  # the vLLM server and the mini-web live as long as the service
        try:
            self._start(model_dir, resolve_engine(cfg, gpus=torch.cuda.is_available()))
        except BaseException:
            self._resources.close()
            raise

    def _start(self, model_dir: Path, engine: str) -> None:
        self.vllm: VLLMServer | None = None
        if engine == "vllm":
            self.tokenizer = load_tokenizer(model_dir)
            self.vllm = self._resources.enter_context(VLLMServer(self.cfg.vllm, model_dir, self.cfg.model_name))
            self.engine = OpenAIEngine(self.vllm.url, self.cfg.model_name)
            self.context = self.vllm.max_model_len
        else:
            self.model, self.tokenizer = load_policy(model_dir)
            self.model.eval()
            self.engine = HFEngine(self.model, self.tokenizer)
            self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 2048)
        toolbox_cfg, corpus, self.tools_source = serving_tools(self.cfg, model_dir)
        if corpus is not None:
            toolbox_cfg = self._resources.enter_context(serve_corpus(toolbox_cfg, corpus))
        self.toolbox_cfg = toolbox_cfg
        self.toolbox = build_toolbox(toolbox_cfg)

    def close(self) -> None:
        self._resources.close()

    def check_health(self) -> None:
        """Raise when the engine is gone (vLLM exited): Ray Serve then replaces the replica."""
        if self.vllm is not None and not self.vllm.alive():
            raise RuntimeError(f"the vLLM server exited (code {self.vllm.proc.returncode}); "
                               f"see {self.vllm.log_path}")

    def models(self) -> dict:
        return {"object": "list", "data": [self.model_card(self.cfg.model_name)]}

    def model_card(self, name: str) -> dict:
        if name != self.cfg.model_name:
            raise OpenAIError(404, f"The model '{name}' does not exist; this server serves "
                                   f"'{self.cfg.model_name}'.", param="model", code="model_not_found")
        return {"id": name, "object": "model", "created": 0, "owned_by": "afm"}

    # -- chat completions -------------------------------------------------------------------------------------

    def _prompt(self, req: ChatRequest) -> tuple[list[int], int]:
        """(prompt ids, completion budget); 404 for another model, 400 for a max_tokens that cannot fit."""
        self.model_card(req.model)  # 404 for another model
        prompt = list(self.tokenizer.apply_chat_template(self._messages(req), add_generation_prompt=True,
                                                         tokenize=True, return_dict=False))
        room = min(self.cfg.max_tokens_limit, self.context - len(prompt))
        if room <= 0:
            raise OpenAIError(400, f"The prompt is {len(prompt)} tokens; this model's context is {self.context} "
                                   f"tokens.", param="messages", code="context_length_exceeded")
        asked = req.token_limit()
        if asked is not None and asked > room:
            raise OpenAIError(400, f"max_tokens is too large: {asked}. This model supports at most {room} "
                                   f"completion tokens for this prompt ({len(prompt)} prompt tokens, context "
                                   f"{self.context}, server cap {self.cfg.max_tokens_limit}).",
                              param="max_tokens", code="invalid_value")
        return prompt, asked or min(self.cfg.max_new_tokens, room)

    @staticmethod
    def _messages(req: ChatRequest) -> list[dict[str, str]]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages]

    def _vllm_body(self, req: ChatRequest, max_new: int) -> dict[str, Any]:
        """The request as vLLM gets it: the prompt and sampling the hf engine would use (same defaults, the
        validated max_tokens, tags kept in the text as models/tokenizer.decode keeps them)."""
        body = {"model": self.cfg.model_name, "messages": self._messages(req), "max_tokens": max_new,
                "temperature": 1.0 if req.temperature is None else req.temperature,
                "top_p": 1.0 if req.top_p is None else req.top_p, "stop": req.stop, "seed": req.seed,
                "stream": req.stream, "skip_special_tokens": False, "spaces_between_special_tokens": False}
        if req.stream and req.stream_options is not None:
            body["stream_options"] = req.stream_options.model_dump()
        return body

    def _tokens(self, prompt: list[int], max_new: int, temperature: float, top_p: float,
                seed: int | None) -> Iterator[int]:
        """Sampled token ids one at a time (KV cache, same sampling as HFEngine), until eos or `max_new`."""
        generator = torch.Generator().manual_seed(seed) if seed is not None and temperature > 0 else None
        cache, ids = {cache_kwarg(self.model): DynamicCache()}, torch.tensor([prompt])
        with torch.no_grad():
            for _ in range(max_new):
                logits = self.model(input_ids=ids, **cache, use_cache=True, logits_to_keep=1).logits[:, -1]
                token, _ = sample_next_tokens(logits, temperature, top_p, generator)
                if int(token[0]) in self.engine.eos_ids:
                    return
                yield int(token[0])
                ids = token[:, None]

    def stream_text(self, req: ChatRequest, prompt: list[int], max_new: int, done: Completion) -> Iterator[str]:
        """Text deltas of one completion as tokens are sampled. A stop string ends it and is not returned, so
        text that could be the start of one is held back until the next token decides."""
        temperature = 1.0 if req.temperature is None else req.temperature
        top_p = 1.0 if req.top_p is None else req.top_p
        hold = max((len(s) for s in req.stop), default=1) - 1
        generated: list[int] = []
        sent = 0
        for token in self._tokens(prompt, max_new, temperature, top_p, req.seed):
            generated.append(token)
            text = decode(self.tokenizer, generated)
            if text.endswith("\ufffd"):
                continue  # an incomplete UTF-8 character: wait for the rest of its bytes
            cut = min((i for s in req.stop if (i := text.find(s)) >= 0), default=-1)
            if cut >= 0:
                done.finish_reason, done.completion_tokens = "stop", len(generated)
                if cut > sent:
                    yield text[sent:cut]
                return
            if len(text) - hold > sent:
                yield text[sent:len(text) - hold]
                sent = len(text) - hold
        done.completion_tokens = len(generated)
        done.finish_reason = "length" if len(generated) == max_new else "stop"
        text = decode(self.tokenizer, generated)
        if len(text) > sent:
            yield text[sent:]

    def chat(self, req: ChatRequest) -> dict:
        prompt, max_new = self._prompt(req)
        if self.vllm is not None:
            return self.vllm.chat(self._vllm_body(req, max_new))
        done = Completion()
        text = "".join(self.stream_text(req, prompt, max_new, done))
        return chat_completion(completion_id(), self.cfg.model_name, text, done.finish_reason, len(prompt),
                               done.completion_tokens)

    def chat_chunks(self, req: ChatRequest) -> Iterator[dict]:
        """`chat.completion.chunk`s: the role, content deltas, the finish reason, then usage if asked."""
        prompt, max_new = self._prompt(req)  # raises before the first chunk: a bad request is still a 4xx
        if self.vllm is not None:
            return self.vllm.chat_chunks(self._vllm_body(req, max_new))
        return self._chunks(req, prompt, max_new)

    def _chunks(self, req: ChatRequest, prompt: list[int], max_new: int) -> Iterator[dict]:
        cid, created, name = completion_id(), int(time.time()), self.cfg.model_name
        yield chat_chunk(cid, created, name, {"role": "assistant", "content": ""})
        done = Completion()
        for delta in self.stream_text(req, prompt, max_new, done):
            yield chat_chunk(cid, created, name, {"content": delta})
        yield chat_chunk(cid, created, name, {}, finish_reason=done.finish_reason)
        if req.stream_options is not None and req.stream_options.include_usage:
            yield chat_chunk(cid, created, name, {}, usage_=usage(len(prompt), done.completion_tokens))

    # -- the agent --------------------------------------------------------------------------------------------

    def agent_events(self, req: AgentRequest) -> Iterator[dict]:
        """One `agent.turn` event per model turn (the segments it produced, tool observations included), then
        the `agent.result`. The episode advances turn by turn, as in RL rollouts (training/rl_rollout.py)."""
        cfg = self.cfg.agent
        temperature = cfg.temperature if req.temperature is None else req.temperature
        problem = Problem(id="request", question=req.question, answers=[], family="user")
        ep = Episode(problem, 0, 0, list(encode_prompt(self.tokenizer, req.question, cfg.system_prompt)))
        while not ep.status:
            seen_segments, seen_pieces = len(ep.segments), len(ep.pieces)
            gen = self.engine.generate([ep.prompt_ids + ep.response_ids], max_new_tokens=cfg.max_new_tokens,
                                       temperature=temperature, top_p=cfg.top_p, stop=STOP_STRINGS,
                                       seed=ep.turns * 1_009)[0]
            advance_episode(ep, gen, self.tokenizer, self.toolbox, cfg)
            yield {"object": "agent.turn", "turn": ep.turns,
                   "segments": [{"tag": s.tag, "text": s.text} for s in ep.segments[seen_segments:]],
                   "text": "".join(ep.pieces[seen_pieces:])}
        yield self._result(ep)

    def _result(self, ep: Episode) -> dict[str, Any]:
        answer = ep.segments[-1].text if ep.segments and ep.segments[-1].tag == "answer" else None
        return {
            "object": "agent.result", "model": self.cfg.model_name, "answer": answer, "status": ep.status,
            "turns": ep.turns, "tools": list(self.toolbox_cfg.tools),
            "tool_calls": [{"tag": c.tag, "argument": c.argument, "status": c.status} for c in ep.tool_calls],
            "trajectory": [{"tag": s.tag, "text": s.text} for s in ep.segments],
            "text": render_segments(ep.segments) if ep.parse_ok else "".join(ep.pieces),
            "usage": {"prompt_tokens": len(ep.prompt_ids), "completion_tokens": sum(ep.loss_mask),
                      "total_tokens": len(ep.prompt_ids) + len(ep.response_ids)},
        }

    def agent(self, req: AgentRequest) -> dict:
        *_, result = self.agent_events(req)
        return result
