"""`afm serve` as a user runs it, in a subprocess: a port in use, or search tools without a corpus, is exit 1
with a clear message (before Ray starts); serve a registered model, stream a chat through the official `openai` client, SIGTERM, and the
process exits 0, the port is free and no `afm-serve-*` model copy is made (a local version is served in place).

    .venv/bin/pytest tests/serving/test_serve_cli.py -q      # ~1 min on 2 cores (one Ray start-up)
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]
AFM = str(Path(sys.executable).parent / "afm")


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """(models:/ URI, env for `afm serve`): a tiny policy registered in a temporary MLflow store."""
    from afm import tracking
    from models.tiny import TinyModelConfig, create_default_policy

    home = tmp_path_factory.mktemp("afm-home")
    texts = ["<think>Add.</think><code>print(2+3)</code><answer>5</answer>", "What is 2 plus 3? It is 5."] * 20
    cfg = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
    policy = create_default_policy(home / "tiny", texts, cfg, vocab_size=400)
    # A short temp dir: Ray puts its session sockets under the temp dir, and a Unix socket path is <108 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="afmt", dir="/tmp"))
    env = {**os.environ, "AFM_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
           "TMPDIR": str(tmp), "RAY_TMPDIR": "/tmp"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AFM_HOME", env["AFM_HOME"])
        mp.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
        version = tracking.register_model(policy, "afm-cli-test", tags={"stage": "sft"})
    yield f"models:/afm-cli-test/{version}", env
    subprocess.run(["rm", "-rf", str(tmp)], check=False)


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_port_in_use_is_exit_1(registered):
    model, env = registered
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run([AFM, "serve", model, "--port", str(port)], env=env, capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr
    assert "Started a local Ray instance" not in done.stderr + done.stdout  # refused before Ray starts
    assert time.monotonic() - started < 60


def test_search_tools_without_a_corpus_is_exit_1(registered):
    model, env = registered
    done = subprocess.run([AFM, "serve", model, "--port", str(free_port()), "--tools", "web_search,code"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "none is recorded with the model: pass --corpus" in done.stderr
    assert "Traceback" not in done.stderr and not list(Path(env["TMPDIR"]).glob("afm-serve-*"))


def test_serve_stream_then_sigterm_frees_the_port(registered):
    from openai import OpenAI

    model, env = registered
    port = free_port()
    proc = subprocess.Popen([AFM, "serve", model, "--port", str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:  # ends at EOF if the server dies before it is up
            lines.append(line)
            if line.startswith("serving "):
                break
        assert f"at http://127.0.0.1:{port}/v1" in lines[-1], "".join(lines)[-3000:]
        assert "/v1/agent tools: code, default" in lines[-1]  # an SFT model: no toolbox recorded
        # The version's one copy is on this machine (MLflow's local artifact store): served in place, no copy.
        assert not list(Path(env["TMPDIR"]).glob("afm-serve-*"))
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        chunks = list(client.chat.completions.create(model="afm", messages=[{"role": "user", "content": "2+3?"}],
                                                     max_tokens=6, temperature=0, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    assert f"stopped; port {port} is free" in out
    assert port_free(port)
    assert not list(Path(env["TMPDIR"]).glob("afm-serve-*"))
