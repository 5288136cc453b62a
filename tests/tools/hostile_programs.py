"""Hostile programs for the code sandbox, each with what "contained" means for it.

Used by test_sandbox_hostile.py (one test per program) and runnable on its own to print the figures that
docs/reliability.md quotes:

    .venv/bin/python -m tests.tools.hostile_programs

Every program runs with the canary AFM_CANARY_SECRET set in the PARENT environment; the canary must never appear
in any output. A loopback listener on the host records connections; none may arrive. Processes carry a unique
token in their command line so leftovers can be found after the run.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from agents.tools.sandbox import PROJECT_ROOT, SandboxLimits, SandboxResult, run_python

CANARY = "AFM_CANARY_SECRET"
CANARY_VALUE = "canary-" + uuid.uuid4().hex
BASE_LIMITS = dict(timeout_s=2.0, cpu_s=5, memory_mb=256, max_output_chars=4000, max_processes=32)


class LoopbackListener:
    """TCP and UDP listeners on the host's 127.0.0.1 (same port) that count connections and datagrams."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.udp.settimeout(0.1)
        self.connections = 0
        self.stopped = False
        self.threads = [threading.Thread(target=self._accept, daemon=True),
                        threading.Thread(target=self._receive, daemon=True)]
        for thread in self.threads:
            thread.start()

    def _accept(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
                self.connections += 1
                conn.close()
            except OSError:
                continue

    def _receive(self):
        while not self.stopped:
            try:
                self.udp.recv(64)
                self.connections += 1
            except OSError:
                continue

    def close(self):
        self.stopped = True
        for thread in self.threads:
            thread.join()
        self.sock.close()
        self.udp.close()


@dataclass
class Context:
    port: int
    token: str
    listener: LoopbackListener


@dataclass
class Hostile:
    name: str
    code: str  # formatted with {port} and {token}
    check: Callable[[SandboxResult, Context], None]  # raises AssertionError when not contained
    limits: dict = field(default_factory=dict)
    slow: bool = False


def out(result: SandboxResult) -> str:
    return result.stdout + result.stderr


def expect_stdout(*needles: str) -> Callable[[SandboxResult, Context], None]:
    def check(result, ctx):
        for needle in needles:
            assert needle in result.stdout, f"expected {needle!r} in stdout, got {out(result)[-500:]!r}"
    return check


def expect_status(status: str, needle: str | None = None) -> Callable[[SandboxResult, Context], None]:
    def check(result, ctx):
        assert result.status == status, f"status {result.status} ({out(result)[-300:]!r}), expected {status}"
        if needle:
            assert needle in out(result), f"expected {needle!r} in output"
    return check


def no_connection(result, ctx):
    assert ctx.listener.connections == 0, "a connection reached the host loopback listener"
    assert "CONNECTED" not in result.stdout, result.stdout


def try_all(*attempts: str, setup: str = "") -> str:
    """Program text that runs `setup`, then each attempt, printing DENIED/ALLOWED per attempt."""
    lines = [setup] if setup else []
    for i, attempt in enumerate(attempts):
        lines += ["try:", f"    {attempt}", f"    print('ALLOWED {i}')",
                  "except Exception as e:", f"    print('DENIED {i}', type(e).__name__)"]
    return "\n".join(lines)


def all_denied(count: int) -> Callable[[SandboxResult, Context], None]:
    def check(result, ctx):
        for i in range(count):
            assert f"DENIED {i} " in result.stdout, f"attempt {i} not denied: {out(result)[-600:]!r}"
    return check


def kill_latency_ok(result, ctx):
    assert result.status == "timeout" and result.killed_by == "wall_timeout"
    assert result.duration_s - BASE_LIMITS["timeout_s"] < 0.5, f"killed {result.duration_s:.2f} s after start"


def forks_bounded(result, ctx):
    forks = int(result.stdout.split("forks")[1].split()[0])
    assert forks < BASE_LIMITS["max_processes"], f"{forks} forks succeeded with a limit of {BASE_LIMITS['max_processes']}"


def huge_output_bounded(result, ctx):
    assert result.status == "ok"
    kept = len(result.stdout.encode())
    assert kept < BASE_LIMITS["max_output_chars"] + 100 and "bytes truncated" in result.stdout
    assert result.stdout.startswith("HEAD") and result.stdout.rstrip().endswith("TAIL")


def escape_files_absent(result, ctx):
    assert not Path(f"/tmp/escape-{ctx.token}").exists(), "a /tmp write reached the host /tmp"
    assert "wrote-tmp" in result.stdout  # the private /tmp itself is writable


def generic_only(result, ctx):
    """Containment is what run_hostile checks for every program: no canary, no leftovers, no connection."""


def threads_bounded(result, ctx):
    threads = int(result.stdout.split("threads")[1].split()[0])
    assert threads < BASE_LIMITS["max_processes"], f"{threads} threads started with a limit of {BASE_LIMITS['max_processes']}"


def huge_stderr_bounded(result, ctx):
    assert result.status == "ok" and len(result.stderr) < BASE_LIMITS["max_output_chars"] + 100


def file_size_refused(result, ctx):
    # RLIMIT_FSIZE: Python ignores SIGXFSZ, so the write fails with EFBIG and the program exits 1
    assert result.status in ("error", "killed") and ("File too large" in result.stderr or result.killed_by == "SIGXFSZ")


def parent_not_killed(result, ctx):
    # as root the parent (bwrap, pid 1 of the namespace) is root-owned: EPERM; otherwise pid 1 ignores SIGKILL
    assert "PermissionError" in result.stderr or "survived" in result.stdout, out(result)[-300:]


def env_clean(result, ctx):
    assert "AWS" not in result.stdout and "HOME=/tmp/work" in result.stdout, result.stdout[:500]


def subprocess_unprivileged(result, ctx):
    expected_uid = 65534 if os.geteuid() == 0 else os.geteuid()  # root callers are dropped to nobody
    assert f"uid={expected_uid}" in result.stdout, result.stdout


PROGRAMS: list[Hostile] = [
    Hostile("read /etc/shadow", try_all("open('/etc/shadow').read()"), all_denied(1)),
    Hostile("write system files", try_all("open('/etc/passwd', 'a').write('x')", "open('/usr/evil', 'w')",
                                          "open('/evil', 'w')", "os.remove('/etc/hostname')",
                                          "open(sys.prefix + '/evil.py', 'w')", setup="import os, sys"),
            all_denied(5)),
    Hostile("read project files", try_all(f"open({str(PROJECT_ROOT / 'pyproject.toml')!r}).read()",
                                          f"os.listdir({str(PROJECT_ROOT / 'agents')!r})", setup="import os"),
            all_denied(2)),
    Hostile("read /root and ~/.aws", try_all("open('/root/.bashrc').read()", "open('/root/.aws/credentials').read()",
                                             "open('/root/.gitconfig').read()"), all_denied(3)),
    Hostile("list /root", "import os; print(sorted(os.listdir('/root')))",
            expect_stdout("['.pyenv']") if Path(sys.base_prefix).is_relative_to("/root") else expect_stdout("[]")),
    Hostile("import project code", try_all("import agents.tools.sandbox"), all_denied(1)),
    Hostile("read env secrets", "import os\nfor k, v in sorted(os.environ.items()): print(f'{k}={v}')", env_clean),
    Hostile("scan /proc environ", "import os\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n"
                                  "        try: print(open(f'/proc/{p}/environ', 'rb').read())\n"
                                  "        except Exception as e: print(p, type(e).__name__)",
            generic_only),
    Hostile("write outside workdir", "open('/tmp/escape-{token}', 'w').write('x'); print('wrote-tmp')",
            escape_files_absent),
    Hostile("write in workdir", "open('ok.txt', 'w').write('fine'); print(open('ok.txt').read())", expect_stdout("fine")),
    Hostile("tcp to host loopback", try_all("import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1); print('CONNECTED')"),
            all_denied(1)),
    Hostile("tcp to external", try_all("import socket; socket.create_connection(('8.8.8.8', 53), timeout=1)",
                                       "import socket; socket.create_connection(('1.1.1.1', 443), timeout=1)"),
            all_denied(2)),
    Hostile("dns lookup", try_all("import socket; socket.getaddrinfo('example.com', 80)"), all_denied(1)),
    # bwrap brings up a loopback of the sandbox's own: the send succeeds there, and nothing reaches the host
    Hostile("udp to loopback", "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                               "for _ in range(5): s.sendto(b'x', ('127.0.0.1', {port}))", no_connection),
    Hostile("fork until refused", "import os, time\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0:\n"
                                  "            time.sleep(3); os._exit(0)\n        n += 1\nexcept OSError: pass\nprint('forks', n)",
            forks_bounded),
    Hostile("classic fork bomb", "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",
            expect_status("timeout"), slow=True),
    Hostile("thread bomb", "import threading, time\nn = 0\ntry:\n    while n < 1000:\n"
                           "        threading.Thread(target=time.sleep, args=(3,), daemon=True).start(); n += 1\n"
                           "except RuntimeError: pass\nprint('threads', n)",
            threads_bounded),
    Hostile("memory bomb (list growth)", "x = []\nwhile True: x.append(bytearray(10_000_000))",
            expect_status("memory", "MemoryError"), limits=dict(timeout_s=10.0)),
    Hostile("memory bomb (numpy)", "import numpy as np\na = np.ones(10**9)", expect_status("memory"),
            limits=dict(timeout_s=10.0)),
    Hostile("cpu spin (wall limit)", "while True: pass", kill_latency_ok),
    Hostile("cpu spin (cpu limit)", "while True: pass", expect_status("timeout"),
            limits=dict(timeout_s=5.0, cpu_s=1)),
    Hostile("huge stdout", "import sys\nsys.stdout.write('HEAD' + 'x' * 50_000_000 + 'TAIL')", huge_output_bounded,
            limits=dict(timeout_s=10.0)),
    Hostile("huge stderr", "import sys\nfor _ in range(2000): sys.stderr.write('e' * 10000)",
            huge_stderr_bounded),
    Hostile("sleep forever", "import time\ntime.sleep(10**6)", expect_status("timeout")),
    Hostile("ignore SIGTERM and sleep", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(10**6)",
            expect_status("timeout")),
    Hostile("kill the parent", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('survived')",
            parent_not_killed),
    Hostile("kill every process", "import os, signal\nos.kill(-1, signal.SIGKILL)", generic_only),
    Hostile("ctypes setuid(0) and mount", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                                          "print('setuid', libc.syscall(105, 0))\n"
                                          "print('mount', libc.mount(b'none', b'/mnt', b'tmpfs', 0, None))\n"
                                          "print('uid', libc.getuid())",
            expect_stdout("setuid -1", "mount -1", "uid 65534") if os.geteuid() == 0 else expect_stdout("setuid -1")),
    Hostile("ptrace / read pid 1 memory", try_all("open('/proc/1/mem', 'rb').read(1)"), all_denied(1)),
    Hostile("subprocess spawn", "import subprocess\nprint(subprocess.run(['id'], capture_output=True, text=True).stdout)",
            subprocess_unprivileged),
    Hostile("daemon escapes the group", "import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n"
                                        "    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', '{token}'])\n"
                                        "print('parent done')", expect_stdout("parent done")),
    Hostile("file size bomb", "f = open('big.bin', 'wb')\nwhile True: f.write(b'0' * 1_000_000)",
            file_size_refused),
    Hostile("fill /tmp tmpfs", try_all("[open(f'/tmp/fill{i}', 'wb').write(b'0' * 10_000_000) for i in range(20)]"),
            all_denied(1)),
]


def leftover_processes(token: str) -> list[int]:
    """Host pids whose command line carries `token` (a sandboxed process that outlived its run)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def run_hostile(program: Hostile) -> tuple[SandboxResult, Context]:
    """Run one program with the canary set and a loopback listener up; check it. Raises AssertionError."""
    listener = LoopbackListener()
    ctx = Context(port=listener.port, token="tok" + uuid.uuid4().hex, listener=listener)
    os.environ[CANARY] = CANARY_VALUE
    try:
        limits = SandboxLimits(**{**BASE_LIMITS, **program.limits})
        result = run_python(program.code.replace("{port}", str(ctx.port)).replace("{token}", ctx.token), limits)
        time.sleep(0.15)  # give the listeners a moment to count anything that did arrive
        assert CANARY_VALUE not in out(result), "the canary secret leaked into the output"
        assert result.status != "sandbox_error", result.stderr
        assert not leftover_processes(ctx.token), "a sandboxed process outlived the run"
        program.check(result, ctx)
        no_connection(result, ctx)
        return result, ctx
    finally:
        os.environ.pop(CANARY, None)
        listener.close()


def main() -> None:
    figures: dict[str, object] = {}
    contained = 0
    for program in PROGRAMS:
        try:
            result, _ = run_hostile(program)
            contained += 1
            verdict = "contained"
        except AssertionError as exc:
            result, verdict = None, f"NOT CONTAINED: {exc}"
        print(f"{program.name:32s} {verdict}" + (f"  status={result.status} {result.duration_s:.2f}s" if result else ""))
        if result and program.name == "cpu spin (wall limit)":
            figures["kill_latency_s"] = round(result.duration_s - BASE_LIMITS["timeout_s"], 3)
        if result and program.name == "huge stdout":
            figures["huge_stdout_bytes_written"] = 50_000_008
            figures["huge_stdout_bytes_kept"] = len(result.stdout.encode())
        if result and program.name == "fork until refused":
            figures["forks_succeeded"] = int(result.stdout.split("forks")[1].split()[0])
            figures["max_processes"] = BASE_LIMITS["max_processes"]
        if result and program.name == "memory bomb (list growth)":
            figures["memory_bomb"] = f"{result.status} after {result.duration_s:.2f}s (limit {BASE_LIMITS['memory_mb']} MiB)"
    figures["contained"] = f"{contained}/{len(PROGRAMS)}"
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
