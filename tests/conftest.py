"""Suite-wide fixtures: a real moto S3 server on 127.0.0.1 (free port) with boto3 pointed at it, the smoke
pipeline's two runs shared by the flow and reliability suites, and isolation: a test module that leaves a Ray
session running (e.g. a flow whose stages call ray.init) must not leak it into the next module, whose own
`ray.init` would then fail. At the very end the process leaves through `afm.hard_exit` (atexit handlers run,
native teardown skipped): Ray's C++ threads outlive `ray.shutdown()` and would otherwise race the interpreter's
teardown (docs/reliability.md, "Exit crash")."""
from __future__ import annotations

import socket
import sys

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    """A ThreadedMotoServer for the whole session; tests use their own bucket names to stay independent."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_env(moto_endpoint, monkeypatch):
    """Point boto3 at the moto server with dummy credentials; returns a client for assertions."""
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture(scope="session")
def smoke_pipeline(tmp_path_factory):
    """The smoke pipeline's failed run and its resumed re-run, once per session (tests/smoke_pipeline.py): the
    flow suite checks the resume, the reliability suite the canaries and sockets of the same two runs."""
    import shutil

    from tests.smoke_pipeline import run_smoke_pipeline

    runs = run_smoke_pipeline(tmp_path_factory.mktemp("smoke"))
    yield runs
    shutil.rmtree(runs.ray_tmp, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def no_ray_session_leaks_between_modules():
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


_session_status: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _session_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Last hook of the run (after the summary is printed): leave without the interpreter's native teardown.
    Skipped in pytest's own sub-runs (pytester) and when the session never finished (collection errors exit
    through pytest's normal path)."""
    if _session_status and config.pluginmanager.has_plugin("terminalreporter"):
        from afm.hard_exit import exit_after_python_cleanup

        exit_after_python_cleanup(_session_status[-1])


def memorize_trajectory(model, tokenizer, traj, system_prompt, max_steps: int):
    """Train `model` until it reproduces `traj`'s model tokens (observations masked), so greedy decoding with
    real tool observations inserted is a genuine multi-turn rollout of that trajectory. Seconds on CPU."""
    import torch

    from models.tokenizer import encode_trajectory

    ex = encode_trajectory(tokenizer, traj, system_prompt)
    ids = torch.tensor([ex.input_ids])
    labels = torch.tensor([[t if m else -100 for t, m in zip(ex.input_ids, ex.loss_mask)]])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(max_steps):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    assert loss.item() < 0.05, f"memorization did not converge: loss {loss.item()}"
    return model.eval()
