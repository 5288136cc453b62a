"""Serve a trained agent with Ray Serve: OpenAI-compatible `/v1/chat/completions` and `/v1/models`, plus
`/v1/agent`, which runs the whole Chain-of-Agents loop with the tools and returns the answer and trajectory.

    afm serve models:/afm-rl@champion --port 8000            # or a policy directory / s3:// artifact
    python -c "from openai import OpenAI; c = OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='none'); \
               print(c.chat.completions.create(model='afm', messages=[{'role': 'user', 'content': 'hi'}]))"

On CPU the model runs in-process with the transformers engine (models/engines/hf.py). On GPU machines serve
with vLLM's own OpenAI server (or `ray.serve.llm`) for chat and keep this app for `/v1/agent`.
Binds 127.0.0.1 unless `host` says otherwise. No authentication: put it behind a gateway before exposing it.
"""
import tempfile
import time
import uuid
from pathlib import Path

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field
from ray import serve

from afm.config import Config
from afm.tracking import resolve_model_uri
from agents.tools.toolbox import ToolboxConfig, build_toolbox
from models.engines.hf import HFEngine
from models.format import render_segments
from models.policy import load_policy
from problems.records import Problem
from training.rl_rollout import RolloutConfig, run_rollouts


class ServeConfig(Config):
    model: str = Field(..., description="Policy: directory, s3:// artifact or MLflow URI (models:/afm-rl@champion).")
    model_name: str = Field("afm", description="Name reported by /v1/models and accepted in requests.")
    host: str = Field("127.0.0.1", description="Bind address (loopback by default).")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port.")
    max_new_tokens: int = Field(256, ge=1, description="Default completion length for /v1/chat/completions.")
    agent: RolloutConfig = Field(default_factory=lambda: RolloutConfig(group_size=1, temperature=0.0),
                                 description="CoA loop of /v1/agent (turns, budgets, sampling).")
    toolbox: ToolboxConfig = Field(default_factory=lambda: ToolboxConfig(tools=["code"]),
                                   description="Tools /v1/agent may call (web tools need corpus_path / endpoints).")


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatRequest(BaseModel):
    model: str = "afm"
    messages: list[ChatMessage]
    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] | str | None = None
    seed: int | None = None


class AgentRequest(BaseModel):
    question: str
    temperature: float | None = None


def resolve_policy(uri: str, cache_dir: Path) -> str:
    """What `load_policy` takes: MLflow URIs are downloaded to `cache_dir`; paths and s3:// pass through."""
    if uri.startswith(("models:/", "runs:/")):
        return str(resolve_model_uri(uri, cache_dir))
    return uri


class AgentService:
    """Model + engine + tools; the Ray Serve deployment below only translates HTTP requests to these calls."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.cache = tempfile.mkdtemp(prefix="afm-serve-")
        model, self.tokenizer = load_policy(resolve_policy(cfg.model, Path(self.cache)))
        model.eval()
        self.engine = HFEngine(model, self.tokenizer)
        self.toolbox = build_toolbox(cfg.toolbox)

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.cfg.model_name, "object": "model", "owned_by": "afm"}]}

    def chat(self, req: ChatRequest) -> dict:
        if req.model != self.cfg.model_name:
            raise HTTPException(404, f"model {req.model!r} not served; available: {self.cfg.model_name!r}")
        messages = [m.model_dump() for m in req.messages]
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                    return_dict=False)
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        gen = self.engine.generate([list(prompt)], max_new_tokens=req.max_tokens or self.cfg.max_new_tokens,
                                   temperature=req.temperature, top_p=req.top_p, stop=stop, seed=req.seed)[0]
        text = gen.text
        eos = self.tokenizer.eos_token
        if eos and text.endswith(eos):
            text = text[: -len(eos)]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
            "model": self.cfg.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "length" if gen.finish_reason == "length" else "stop"}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(gen.token_ids),
                      "total_tokens": len(prompt) + len(gen.token_ids)},
        }

    def agent(self, req: AgentRequest) -> dict:
        cfg = self.cfg.agent
        if req.temperature is not None:
            cfg = cfg.model_copy(update={"temperature": req.temperature})
        problem = Problem(id=uuid.uuid4().hex[:12], question=req.question, answers=[], family="user")
        ep = run_rollouts(self.engine, self.tokenizer, self.toolbox, [problem], cfg, seed=0)[0]
        answer = ep.segments[-1].text if ep.segments and ep.segments[-1].tag == "answer" else None
        return {
            "answer": answer, "status": ep.status, "turns": ep.turns,
            "tool_calls": [{"tag": c.tag, "argument": c.argument, "status": c.status} for c in ep.tool_calls],
            "trajectory": [{"tag": s.tag, "text": s.text} for s in ep.segments],
            "text": render_segments(ep.segments) if ep.parse_ok else "".join(ep.pieces),
            "usage": {"completion_tokens": sum(ep.loss_mask), "total_tokens": len(ep.response_ids)},
        }


api = FastAPI(title="afm-platform agent server")


@serve.deployment(name="afm-agent", num_replicas=1, ray_actor_options={"num_cpus": 1})
@serve.ingress(api)
class AgentDeployment:
    """The Ray Serve replica: holds one AgentService and maps the OpenAI-style routes onto it."""

    def __init__(self, cfg_json: str):
        self.service = AgentService(ServeConfig.model_validate_json(cfg_json))

    @api.get("/v1/models")
    def list_models(self):
        return self.service.models()

    @api.post("/v1/chat/completions")
    def chat_completions(self, req: ChatRequest):
        return self.service.chat(req)

    @api.post("/v1/agent")
    def agent(self, req: AgentRequest):
        return self.service.agent(req)


def run_server(cfg: ServeConfig, blocking: bool = True):
    """Start Ray Serve on cfg.host:cfg.port with one replica of the agent service; returns the app handle."""
    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    handle = serve.run(AgentDeployment.bind(cfg.model_dump_json()), name="afm", route_prefix="/", blocking=False)
    print(f"serving {cfg.model} as {cfg.model_name!r} at http://{cfg.host}:{cfg.port}/v1", flush=True)
    if blocking:
        while True:
            time.sleep(3600)
    return handle
