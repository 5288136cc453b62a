"""The work one rollout actor does, as plain Python (no Ray): build a ToolBox and a backend, run the MAS on
(problem, sample) keys with per-item retries. `distill.rollouts` wraps this in Ray actors.

Each (problem, sample) gets its own seed, derived from (teacher seed, problem id, sample index), so a re-run or a
re-submission after an actor died reproduces the same log no matter which actor runs it.

Usage:
    worker = RolloutWorker(problems, TeacherConfig(), ToolboxConfig(corpus_path=...), max_retries=2)
    results = worker.run_batch([("mh-0", 0), ("mh-0", 1)])   # [{"key": [...], "log": {...}} | {"key", "error"}]
"""
from __future__ import annotations

import traceback
import zlib

from agents.teacher.backends import LLMBackend, LocalEngineBackend, OpenAIChatBackend
from agents.teacher.mas import TeacherConfig, run_mas
from agents.teacher.oracle import OracleKnowledge, ScriptedOracleBackend
from agents.tools.toolbox import ToolboxConfig, build_toolbox
from problems.records import Problem


def build_llm_backend(cfg: TeacherConfig) -> LLMBackend:
    """The model-backed teacher (`openai` or `local`); the oracle is built per rollout instead."""
    if cfg.backend == "openai":
        return OpenAIChatBackend(cfg.endpoint, cfg.model, cfg.api_key_env, cfg.temperature, cfg.max_tokens,
                                 client=cfg.client, seed=cfg.seed)
    if cfg.backend == "local":
        if not cfg.model_path:
            raise ValueError("TeacherConfig: field 'model_path' is required for backend 'local'")
        from models.engines.hf import HFEngine
        from models.policy import load_policy

        model, tokenizer = load_policy(cfg.model_path)
        return LocalEngineBackend(HFEngine(model, tokenizer), tokenizer, cfg.max_tokens, cfg.temperature,
                                  name=f"local:{cfg.model_path}")
    raise ValueError(f"TeacherConfig: backend {cfg.backend!r} is not model-backed")


def rollout_seed(base_seed: int, problem_id: str, sample_idx: int) -> int:
    return zlib.crc32(f"{base_seed}:{problem_id}:{sample_idx}".encode("utf-8"))


class RolloutWorker:
    def __init__(self, problems: list[Problem], teacher_cfg: TeacherConfig, toolbox_cfg: ToolboxConfig,
                 max_retries: int):
        self.problems = {p.id: p for p in problems}
        self.teacher_cfg = teacher_cfg
        self.toolbox = build_toolbox(toolbox_cfg)
        self.max_retries = max_retries
        # The oracle is rebuilt per rollout (cheap: it shares this index) so that each one has its own seed.
        self.knowledge = OracleKnowledge(problems) if teacher_cfg.backend == "oracle" else None
        self.shared_backend = build_llm_backend(teacher_cfg) if self.knowledge is None else None

    def backend_for(self, seed: int) -> LLMBackend:
        if self.knowledge is not None:
            t = self.teacher_cfg
            return ScriptedOracleBackend(self.knowledge, t.mistake_rate, t.reflection_rate, seed)
        return self.shared_backend

    def run_one(self, problem_id: str, sample_idx: int) -> dict:
        problem = self.problems[problem_id]
        seed = rollout_seed(self.teacher_cfg.seed, problem_id, sample_idx)
        log = run_mas(problem, self.backend_for(seed), self.toolbox, self.teacher_cfg,
                      log_id=f"{problem_id}#{sample_idx}", sample_idx=sample_idx)
        return log.to_dict()

    def run_batch(self, keys: list[tuple[str, int]]) -> list[dict]:
        """One result per key: {"key", "log"} or, after `max_retries` failed retries, {"key", "error"}."""
        out = []
        for problem_id, sample_idx in keys:
            error = ""
            for _ in range(self.max_retries + 1):
                try:
                    out.append({"key": [problem_id, sample_idx], "log": self.run_one(problem_id, sample_idx)})
                    break
                except Exception:  # noqa: BLE001 - any failure of one rollout is retried, then reported, not fatal
                    error = traceback.format_exc(limit=3)
            else:
                out.append({"key": [problem_id, sample_idx], "error": error})
        return out
