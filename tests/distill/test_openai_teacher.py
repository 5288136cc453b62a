"""The teacher with `backend=openai` against a real OpenAI-compatible HTTP server on 127.0.0.1
(tests/models/openai_server.py serving a tiny untrained Qwen2): a whole `distill` with server-enforced JSON
replies, and MAS runs with plain-text replies read by the tolerant parser. The tiny model's answers are wrong;
what is checked is that nothing crashes, nothing is lost and every drop and parse failure is reported.

    .venv/bin/python -m pytest -q -m integration tests/distill/test_openai_teacher.py
"""
from __future__ import annotations

import json

import pytest
import torch

from agents.teacher.mas import TeacherConfig, run_mas
from distill.pipeline import DistillConfig, distill_dataset
from distill.rollout_work import build_llm_backend
from distill.shards import iter_logs
from models.format import read_jsonl
from tests.models.openai_server import serve_openai, tiny_teacher_engine

pytestmark = pytest.mark.integration

KEY_ENV = "AFM_TEST_UNSET_TEACHER_KEY"


@pytest.fixture(scope="module")
def server():
    torch.set_num_threads(1)
    engine, tok = tiny_teacher_engine()
    record: list[dict] = []
    # Ray actors see the environment Ray started with (the session fixture), not a key set here later; the server
    # takes the "EMPTY" key a local vLLM takes (the key path is tested in tests/teacher/test_openai_backend.py)
    with serve_openai(engine, tok, model_name="tiny", api_key="EMPTY", record=record,
                      skip_special_tokens=True) as url:
        yield url, record


def teacher_cfg(url: str, structured: str, **extra) -> TeacherConfig:
    return TeacherConfig(backend="openai", endpoint=url, model="tiny", api_key_env=KEY_ENV, max_tokens=24,
                         max_steps=10, observation_chars=120, temperature=0.7,
                         client={"structured_output": structured, "max_concurrency": 4, "timeout_s": 60}, **extra)


def test_distill_against_a_real_server_with_enforced_json(server, ray_session, tmp_path):
    url, _ = server
    cfg = DistillConfig(n_worlds=1, multihop_per_world=4, n_computation=2, rl_multihop_per_world=3, rl_computation=1,
                        n_heldout_worlds=1, eval_per_world=2, teacher=teacher_cfg(url, "json_schema"),
                        rollout={"num_actors": 1, "batch_size": 3, "show_progress": False})
    result = distill_dataset(cfg, tmp_path)
    counts, report = result.counts, result.filter_report
    # nothing lost: every problem has a log; nothing crashed: no rollout failed
    assert counts["problems"] == 6 and counts["rollouts_new"] == 6 and counts["rollouts_failed"] == 0
    logs = list(iter_logs(tmp_path / "rollouts"))
    assert sorted(log.problem_id for log in logs) == sorted(json.loads(line)["id"] for line in
                                                           (tmp_path / "problems.jsonl").read_text().splitlines())
    assert all(log.teacher == "openai:tiny" and log.prompt_tokens > 0 and log.completion_tokens > 0 for log in logs)
    # server-enforced JSON: every role reply parsed, the logs read like the line protocol
    assert counts["parse_failures_total"] == 0 and counts["protocol"]["logs_with_parse_failures"] == 0
    verifications = [e.content for log in logs for e in log.events if e.role == "verification"]
    assert verifications and all(v.startswith("score: ") for v in verifications)
    # the report accounts for every log and every drop, with reasons
    assert [r["stage"] for r in report] == ["conversion", "complexity", "quality", "reflection", "upsampling"]
    assert report[0]["in"] == 6 and report[0]["out"] == counts["converted"] >= 1
    for row in report[:-1]:
        assert row["in"] - row["out"] == sum(row["reasons"].values()), row
    assert counts["sft_trajectories"] == len(list(read_jsonl(result.sft_path)))
    assert counts["rl_selection"]["in"] >= 1


def test_plain_text_replies_are_parsed_re_asked_and_counted(server, world_setup, toolbox):
    url, record = server
    cfg = teacher_cfg(url, "off")
    backend = build_llm_backend(cfg)
    start = len(record)
    logs = [run_mas(p, backend, toolbox, cfg) for p in world_setup.problems[:2]]
    # an untrained model never writes a NEXT line: each miss is re-asked within the budget, then counted
    assert all(log.parse_retries.get("thinking", 0) >= 1 and log.parse_failures.get("thinking", 0) >= 1
               for log in logs)
    # re-asks are agent calls: they count toward the step budget (a turn may end it at most one turn over)
    thinking_retries = cfg.parse_retries["thinking"]
    assert all(cfg.max_steps <= sum(1 for e in log.events if e.prompt_tokens) + sum(log.parse_retries.values())
               <= cfg.max_steps + thinking_retries for log in logs)
    # stable prefixes: an agent's next request starts with everything it sent before (server prefix caches
    # reuse it), and one role's system prompt is the same for every problem
    requests = [r["messages"] for r in record[start:]]
    by_agent: dict[str, list[list[dict]]] = {}
    for messages in requests:
        by_agent.setdefault(messages[0]["content"], []).append(messages)
    grown = 0  # (only the coordinator is called here: its replies never name an agent)
    for sent in by_agent.values():
        for before, after in zip(sent, sent[1:]):
            if len(after) > len(before):
                assert after[:len(before)] == before
                grown += 1
    assert grown >= 2
    thinking = next(s for s in by_agent if s.startswith("You are the thinking agent"))
    assert sum(len(m) == 2 for m in by_agent[thinking]) == 2  # two problems, one shared system prompt
