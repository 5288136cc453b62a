"""Preflight of cluster recipes (cli.preflight.check_cluster): GPU count against the workers the config asks for,
vLLM importable when a pool uses it, teacher/judge endpoints answering. No GPU needed: torch.cuda is
monkeypatched and the OpenAI-compatible endpoint is a fake on 127.0.0.1 started here."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
import yaml

from cli import preflight
from cli.preflight import check_cluster, requested_gpus

CLUSTER_YAML = Path(__file__).resolve().parents[2] / "configs" / "qwen7b-cluster.yaml"


@pytest.fixture(scope="module")
def fake_openai():
    """GET /v1/models -> {"data": [{"id": "judge-72b"}]}; 401 without `Authorization: Bearer sk-test`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.headers.get("Authorization") != "Bearer sk-test":
                self.send_response(401)
                self.end_headers()
                return
            body = json.dumps({"object": "list", "data": [{"id": "judge-72b", "object": "model"}]}).encode()
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def gpu_recipe(**rl_over) -> dict:
    return {"sft": {"use_gpu": True, "num_workers": 8},
            "rl": {"use_gpu": True, "num_learners": 4, "judge": "rule",
                   "pool": {"engine": "hf", "use_gpu": True, "rollout_workers": 4}, **rl_over}}


def test_requested_gpus_of_the_cluster_recipe():
    cfg = yaml.safe_load(CLUSTER_YAML.read_text())
    assert requested_gpus(cfg) == {"sft": 8, "rl": 8, "eval": 8}
    assert requested_gpus({"sft": {"use_gpu": False, "num_workers": 8}}) == {}
    colocated = {"rl": {"use_gpu": True, "num_learners": 2,
                        "pool": {"use_gpu": True, "rollout_workers": 2, "gpus_per_worker": 0.5}}}
    assert requested_gpus(colocated) == {"rl": 3}


def test_too_few_gpus_says_how_many_and_what_to_do(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    problems = check_cluster(gpu_recipe(), env={})
    assert len(problems) == 1
    assert "asks for 8 at once" in problems[0] and "has 4" in problems[0]
    assert "torch.cuda.device_count" in problems[0] and "rl.num_learners" in problems[0]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert check_cluster(gpu_recipe(), env={}) == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert check_cluster(gpu_recipe(), env={preflight.GPU_ENV_SKIP: "1"}) == []  # autoscaling cluster
    assert "has 0" in check_cluster(gpu_recipe(), env={})[0]


def test_ray_address_counts_the_clusters_gpus():
    seen = []
    problems = check_cluster(gpu_recipe(), env={"RAY_ADDRESS": "afm-ray-head-svc:6379"},
                             gpu_count=lambda: (seen.append(1) or 6, "the Ray cluster"))
    assert seen and "the Ray cluster has 6" in problems[0]


def test_vllm_engine_needs_vllm_importable():
    cfg = gpu_recipe(pool={"engine": "vllm", "use_gpu": True, "rollout_workers": 4})
    ok = {"gpu_count": lambda: (8, "here")}
    assert check_cluster(cfg, env={}, vllm_probe=lambda: None, **ok) == []
    problems = check_cluster(cfg, env={}, vllm_probe=lambda: "ModuleNotFoundError: No module named 'vllm'", **ok)
    assert len(problems) == 1 and "rl.pool.engine" in problems[0] and "No module named 'vllm'" in problems[0]
    assert "infra/Dockerfile.worker" in problems[0]
    # engine: hf never imports vLLM
    assert check_cluster(gpu_recipe(), env={}, vllm_probe=lambda: pytest.fail("probed"), **ok) == []


def test_vllm_probe_runs_a_real_import_in_a_subprocess():
    error = preflight.vllm_import_error(timeout_s=120)
    try:
        import vllm  # noqa: F401
    except ImportError:
        assert error is not None and "vllm" in error
    else:
        assert error is None


def test_judge_and_teacher_endpoints_must_answer(fake_openai):
    env = {"OPENAI_API_KEY": "sk-test", "TEACHER_KEY": "sk-test"}
    cfg = {"distill": {"teacher": {"backend": "openai", "endpoint": fake_openai, "model": "judge-72b",
                                   "api_key_env": "TEACHER_KEY"}},
           "rl": {"judge": "llm", "judge_base_url": fake_openai, "judge_model": "judge-72b"},
           "eval": {"judge": "llm", "judge_base_url": fake_openai + "/", "judge_model": "judge-72b"}}
    assert check_cluster(cfg, env=env) == []

    wrong_model = {"rl": {"judge": "llm", "judge_base_url": fake_openai, "judge_model": "other"}}
    [problem] = check_cluster(wrong_model, env=env)
    assert "rl judge" in problem and "does not serve model 'other'" in problem and "judge-72b" in problem
    assert "rl.judge_model" in problem

    [problem] = check_cluster({"distill": cfg["distill"]}, env={})  # no key set
    assert "HTTP 401" in problem and "$TEACHER_KEY" in problem

    down = closed_port_url()
    [problem] = check_cluster({"eval": {"judge": "llm", "judge_base_url": down, "judge_model": "m"}}, env=env)
    assert f"eval judge at {down} (eval.judge_base_url) unreachable" in problem and "Start that server" in problem

    [problem] = check_cluster({"rl": {"judge": "llm", "judge_base_url": ""}}, env=env)
    assert "rl.judge_base_url is empty" in problem
    # rule judges and the oracle teacher name no endpoint
    assert check_cluster({"rl": {"judge": "rule"}, "distill": {"teacher": {"backend": "oracle"}}}, env=env) == []
