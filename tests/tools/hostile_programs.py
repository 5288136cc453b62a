"""Hostile programs for the code sandbox, each with what "contained" means for it.

Used by test_sandbox_hostile.py (one test per program) and runnable on its own to print the figures that
docs/reliability.md quotes:

    .venv/bin/python -m tests.tools.hostile_programs

Every program runs with the canary AFM_CANARY_SECRET set in the PARENT environment and written into host bait
(a file in the host /tmp, a file in a sibling "checkout" under the checkout's parent, a key in root's user
keyring); the canary must never appear in any output. A loopback listener (TCP + UDP) and Unix-socket listeners
(a socket file in the host /tmp, one in /run, an abstract one) record connections; none may arrive. Processes
carry a unique token in their command line so leftovers can be found after the run.
Placeholders in a program's text: {port} {token} {hostpid} {canary_tmp} {canary_checkout} {sock_tmp} {sock_run}
{abstract}.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from agents.tools.sandbox import PROJECT_ROOT, SandboxLimits, SandboxResult, _python_prefixes, run_python

CANARY = "AFM_CANARY_SECRET"
CANARY_VALUE = "canary-" + uuid.uuid4().hex
BASE_LIMITS = dict(timeout_s=2.0, cpu_s=5, memory_mb=256, max_output_chars=4000, max_processes=32, tmpfs_mb=64,
                   shm_mb=16)
MIB = 1024 * 1024


class _CountingListener:
    """A listening stream socket whose accept loop (a daemon thread) counts and closes every connection."""

    def __init__(self, sock: socket.socket, backlog: int):
        self.sock = sock
        self.sock.listen(backlog)
        self.sock.settimeout(0.1)
        self.connections = 0
        self.stopped = False
        self.threads = [threading.Thread(target=self._accept, daemon=True)]

    def _accept(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
                self.connections += 1
                conn.close()
            except OSError:
                continue

    def close(self):
        self.stopped = True
        for thread in self.threads:
            thread.join()
        self.sock.close()


class LoopbackListener(_CountingListener):
    """TCP and UDP listeners on the host's 127.0.0.1 (same port) that count connections and datagrams."""

    def __init__(self):
        tcp = socket.socket()
        tcp.bind(("127.0.0.1", 0))
        super().__init__(tcp, backlog=16)
        self.port = self.sock.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.udp.settimeout(0.1)
        self.threads.append(threading.Thread(target=self._receive, daemon=True))
        for thread in self.threads:
            thread.start()

    def _receive(self):
        while not self.stopped:
            try:
                self.udp.recv(64)
                self.connections += 1
            except OSError:
                continue

    def close(self):
        super().close()
        self.udp.close()


class UnixListener(_CountingListener):
    """A listening AF_UNIX socket (a path, or an abstract name starting with NUL) that counts connections."""

    def __init__(self, address: str):
        self.address = address
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(address)
        if not address.startswith("\0"):
            os.chmod(address, 0o777)  # connectable by anyone who can see it: the path must be what stops it
        super().__init__(sock, backlog=4)
        self.threads[0].start()

    def close(self):
        super().close()
        if not self.address.startswith("\0"):
            Path(self.address).unlink(missing_ok=True)


class KeyringBait:
    """A "user" key holding the canary in root's user keyring (add_key(2)); unlinked on close. No-op where the
    kernel has no keyrings."""

    def __init__(self, description: str):
        self.libc = ctypes.CDLL(None, use_errno=True)
        value = CANARY_VALUE.encode()
        self.key = self.libc.syscall(248, b"user", description.encode(), value, len(value), -4)  # KEY_SPEC_USER

    def close(self):
        if self.key > 0:
            self.libc.syscall(250, 3, self.key)  # KEYCTL_REVOKE


class HostBait:
    """Canary files and sockets on host paths for one run; everything is removed on close."""

    def __init__(self, token: str):
        self.dirs = [Path(f"/tmp/afm-canary-{token}"), PROJECT_ROOT.parent / f"afm-canary-{token}"]
        for directory in self.dirs:
            directory.mkdir()
            (directory / "secret.txt").write_text(CANARY_VALUE)
            os.chmod(directory, 0o755)
            os.chmod(directory / "secret.txt", 0o644)  # world-readable: only invisibility protects it
        self.canary_tmp, self.canary_checkout = (str(d / "secret.txt") for d in self.dirs)
        self.unix = [UnixListener(f"/tmp/afm-{token}.sock"), UnixListener(f"\0afm-{token}")]
        if os.access("/run", os.W_OK):
            self.unix.append(UnixListener(f"/run/afm-{token}.sock"))
        self.sock_tmp, self.abstract = self.unix[0].address, f"afm-{token}"
        self.sock_run = f"/run/afm-{token}.sock"
        self.keyring = KeyringBait(f"afm-{token}")

    def unix_connections(self) -> int:
        return sum(listener.connections for listener in self.unix)

    def close(self):
        for listener in self.unix:
            listener.close()
        self.keyring.close()
        for directory in self.dirs:
            shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Context:
    port: int
    token: str
    listener: LoopbackListener
    bait: HostBait


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


def fill_program(directory: str) -> str:
    """Writes 4 MiB files of 1 MiB writes into `directory` until a write fails; prints the bytes written. (Files
    stay under RLIMIT_FSIZE, so the file system's size is what stops it.)"""
    return ("written = 0\ntry:\n    for i in range(1000):\n"
            f"        with open(f'{directory}/fill{{i}}', 'wb') as f:\n"
            "            for _ in range(4): f.write(b'0' * (1 << 20)); f.flush(); written += 1 << 20\n"
            "except OSError as e: print(e)\nprint('written', written)")


def printed(result: SandboxResult, key: str):
    """The Python literal the program printed on its line `key <literal>`."""
    import ast
    line = next(line for line in result.stdout.splitlines() if line.startswith(key + " "))
    return ast.literal_eval(line[len(key) + 1:])


# what the minimal root may show: the bound system paths, the Python prefixes and the parents of both
ALLOWED_ROOT = {"bin", "dev", "etc", "lib", "lib64", "proc", "tmp", "usr"} | {
    Path(p).parts[1] for p in _python_prefixes()}


def root_is_minimal(result, ctx):
    listing = set(printed(result, "root"))
    assert listing <= ALLOWED_ROOT, f"unexpected top-level entries {sorted(listing - ALLOWED_ROOT)}"
    assert not listing & {"home", "run", "var", "sys", "opt", "mnt", "srv", "boot"}


def checkout_is_empty(result, ctx):
    # the checkout directory exists only where the venv inside it is bound: nothing else of it may show
    prefixes = {Path(p).relative_to(PROJECT_ROOT).parts[0] for p in _python_prefixes()
                if Path(p).is_relative_to(PROJECT_ROOT)}
    listing = printed(result, "checkout")
    assert listing is None or set(listing) <= prefixes, f"checkout files visible: {listing}"
    assert printed(result, "sibling") is None, "the sibling checkout is visible"


def mountinfo_names_only_binds(result, ctx):
    allowed = {"/usr/bin", "/usr/lib", "/usr/lib64", "/etc/ld.so.cache", *_python_prefixes()}
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) < 10 or fields[fields.index("-") + 1] in ("tmpfs", "proc", "devtmpfs", "devpts", "mqueue"):
            continue  # fresh file systems: their roots are not host paths
        root, mount_point = fields[3], fields[4]
        assert root in allowed and mount_point == root, f"host path {root} mounted at {mount_point}"
    assert str(PROJECT_ROOT / "agents") not in result.stdout and ctx.token not in result.stdout


def no_unix_connection(result, ctx):
    assert ctx.bait.unix_connections() == 0, "a connection reached a host Unix socket"


def fill_bounded(cap_mb: int) -> Callable[[SandboxResult, Context], None]:
    def check(result, ctx):
        written = printed(result, "written")
        assert written <= cap_mb * MIB, f"{written} bytes written into a {cap_mb} MiB tmpfs"
        assert "No space left" in result.stdout, result.stdout[-300:]
    return check


def tree_memory_capped(result, ctx):
    cap = BASE_LIMITS["memory_mb"] * MIB
    statuses = printed(result, "children")
    assert result.cgroup is not None, "no cgroup here: memory is capped per process only"
    assert result.peak_memory_bytes <= cap, f"tree peak {result.peak_memory_bytes} over the cap {cap}"
    assert any(status != 0 for status in statuses), f"all 4 x 100 MiB children survived a 256 MiB cap: {statuses}"


def nested_forks_bounded(result, ctx):
    forks = printed(result, "forks")
    assert forks < BASE_LIMITS["max_processes"], f"{forks} processes created with a limit of {BASE_LIMITS['max_processes']}"


def few_pids_visible(result, ctx):
    pids = printed(result, "pids")
    assert len(pids) <= 4 and os.getpid() not in pids, pids


def only_std_fds(result, ctx):
    fds = printed(result, "fds")
    assert set(fds) <= {"0", "1", "2"}, f"inherited descriptors: {fds}"


def setuid_without_effect(result, ctx):
    assert printed(result, "euid") == (65534 if os.geteuid() == 0 else os.geteuid())
    assert printed(result, "mount_rc") != 0 and printed(result, "su_rc") != 0
    assert printed(result, "usr_bin_nosuid") is True


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
    # --- the minimal root: host files, other checkouts, sockets and mounts are not there
    Hostile("read a canary file in host /tmp", try_all("open('{canary_tmp}').read()", "os.listdir('/tmp/afm-canary-{token}')",
                                                       "os.stat('{canary_tmp}')", setup="import os"), all_denied(3)),
    Hostile("read a sibling checkout", try_all("open('{canary_checkout}').read()", "os.stat('{canary_checkout}')"),
            all_denied(2)),
    Hostile("list the root", "import os; print('root', sorted(os.listdir('/')))", root_is_minimal),
    Hostile("list the checkout", "import os\n"
                                 f"def ls(p):\n    try: return sorted(os.listdir(p))\n    except OSError: return None\n"
                                 f"print('checkout', ls({str(PROJECT_ROOT)!r}))\n"
                                 "print('sibling', ls('{canary_checkout}'.rsplit('/', 1)[0]))", checkout_is_empty),
    Hostile("read host /etc files", try_all(*[f"open({p!r}).read()" for p in
                                              ("/etc/passwd", "/etc/hostname", "/etc/hosts", "/etc/resolv.conf",
                                               "/etc/ssh/ssh_host_rsa_key", "/etc/environment")]), all_denied(6)),
    Hostile("mountinfo names no host path beyond the binds", "print(open('/proc/self/mountinfo').read())",
            mountinfo_names_only_binds),
    Hostile("escape via /proc/1/root and /proc/1/cwd", try_all("os.listdir('/proc/1/root')", "os.readlink('/proc/1/cwd')",
                                                               "open('/proc/1/root/etc/hostname').read()",
                                                               "os.readlink('/proc/1/exe')", setup="import os"),
            all_denied(4)),
    Hostile("host pids are invisible", try_all("open('/proc/{hostpid}/environ').read()", "os.kill({hostpid}, 0)",
                                               "os.readlink('/proc/{hostpid}/cwd')", setup="import os")
            + "\nprint('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
            lambda result, ctx: (all_denied(3)(result, ctx), few_pids_visible(result, ctx))),
    Hostile("symlinks out of the workdir", try_all("os.symlink('{canary_tmp}', 'a'); open('a').read()",
                                                   f"os.symlink({str(PROJECT_ROOT / 'pyproject.toml')!r}, 'b'); open('b').read()",
                                                   "os.symlink('/proc/1/root/etc/hostname', 'c'); open('c').read()",
                                                   setup="import os"), all_denied(3)),
    Hostile("unix socket file in host /tmp", try_all("s = socket.socket(socket.AF_UNIX); s.connect('{sock_tmp}'); print('CONNECTED')",
                                                     setup="import socket"), lambda r, c: (all_denied(1)(r, c), no_unix_connection(r, c))),
    Hostile("unix socket file in /run", try_all("s = socket.socket(socket.AF_UNIX); s.connect('{sock_run}'); print('CONNECTED')",
                                                "os.listdir('/run')", setup="import os, socket"),
            lambda r, c: (all_denied(2)(r, c), no_unix_connection(r, c))),
    Hostile("abstract unix socket", try_all("s = socket.socket(socket.AF_UNIX); s.connect('\\0{abstract}'); print('CONNECTED')",
                                            setup="import socket"), lambda r, c: (all_denied(1)(r, c), no_unix_connection(r, c))),
    Hostile("docker / containerd / dbus sockets", try_all(*[f"socket.socket(socket.AF_UNIX).connect({p!r})" for p in
                                                            ("/var/run/docker.sock", "/run/docker.sock",
                                                             "/run/containerd/containerd.sock",
                                                             "/run/dbus/system_bus_socket")], setup="import socket"),
            all_denied(4)),
    Hostile("inherited file descriptors", "import os; print('fds', sorted(os.listdir('/proc/self/fd'))[:-1])",
            only_std_fds),  # the last entry is listdir's own descriptor
    # --- privilege and kernel surfaces
    Hostile("unshare a user namespace", try_all("assert libc.unshare(0x10000000) == 0, 'refused'",
                                                "assert libc.unshare(0x00020000) == 0, 'refused'",
                                                "assert libc.syscall(56, 0x10000011, 0, 0, 0, 0) >= 0, 'refused'",
                                                "assert subprocess.run(['unshare', '-Ur', 'id']).returncode == 0, 'refused'",
                                                setup="import ctypes, subprocess\nlibc = ctypes.CDLL(None, use_errno=True)"),
            all_denied(4)),
    Hostile("keyrings", try_all("assert libc.syscall(249, b'user', b'afm-{token}', None, 0) >= 0, 'no key'",
                                "assert libc.syscall(248, b'user', b'x', b'y', 1, -4) >= 0, 'refused'",
                                "assert libc.syscall(250, 0, -4, 0) >= 0, 'refused'",
                                setup="import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)"), all_denied(3)),
    Hostile("ptrace pid 1", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                            "print('ptrace', libc.ptrace(16, 1, 0, 0))", expect_stdout("ptrace -1")),
    Hostile("setuid binaries", "import os, subprocess\nprint('euid', os.geteuid())\n"
                               "print('mount_rc', subprocess.run(['mount', '-t', 'tmpfs', 'none', '/tmp/work'], capture_output=True).returncode)\n"
                               "print('su_rc', subprocess.run(['su', '-c', 'id'], capture_output=True, stdin=subprocess.DEVNULL).returncode)\n"
                               "print('usr_bin_nosuid', any(' /usr/bin /usr/bin ' in l and 'nosuid' in l for l in open('/proc/self/mountinfo')))",
            setuid_without_effect),
    Hostile("/sys and /proc/sys writes", try_all("open('/sys/fs/cgroup/memory/memory.limit_in_bytes', 'w').write('1')",
                                                 "open('/proc/sys/kernel/hostname', 'w').write('x')",
                                                 "open('/proc/sys/vm/drop_caches', 'w').write('3')",
                                                 "open('/proc/sysrq-trigger', 'w').write('b')",
                                                 "os.listdir('/sys')", setup="import os"), all_denied(5)),
    Hostile("mount and remount (ctypes)", try_all("assert libc.mount(b'/', b'/tmp/work', None, 0x5000, None) == 0, 'refused'",
                                                  "assert libc.mount(None, b'/usr/bin', None, 0x1020, None) == 0, 'refused'",
                                                  "assert libc.umount2(b'/usr/bin', 2) == 0, 'refused'",
                                                  "assert libc.mount(b'proc', b'/tmp/work', b'proc', 0, None) == 0, 'refused'",
                                                  setup="import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)"),
            all_denied(4)),
    # --- resources of the whole tree
    Hostile("fill /dev/shm", fill_program("/dev/shm"), fill_bounded(BASE_LIMITS["shm_mb"])),
    Hostile("fill the tmpfs workdir", fill_program("."), fill_bounded(BASE_LIMITS["tmpfs_mb"])),
    Hostile("many files in the workdir", "import os, time\nn, end = 0, time.monotonic() + 1.0\ntry:\n"
                                         "    while time.monotonic() < end:\n        open(f'f{n}', 'w').close(); n += 1\n"
                                         "except OSError as e: print(e)\nprint('files', n)", expect_stdout("files ")),
    Hostile("children share the memory cap", "import os, time\npids = []\nfor _ in range(4):\n    pid = os.fork()\n"
                                             "    if pid == 0:\n        x = bytearray(b'1') * (100 << 20); time.sleep(1.0); os._exit(0)\n"
                                             "    pids.append(pid)\nprint('children', [os.waitpid(p, 0)[1] for p in pids])",
            tree_memory_capped, limits=dict(timeout_s=5.0)),
    Hostile("nested fork bomb", "import os, time\ntop = os.getpid()\nr, w = os.pipe()\nfor _ in range(6):\n"
                                "    try:\n        if os.fork() == 0: os.write(w, b'x')\n    except OSError: pass\n"
                                "if os.getpid() != top: time.sleep(1.0); os._exit(0)\ntime.sleep(0.5)\n"
                                "os.set_blocking(r, False)\nn = 0\ntry:\n    while True: n += len(os.read(r, 4096))\n"
                                "except BlockingIOError: pass\nprint('forks', n)", nested_forks_bounded),
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


def program_text(program: Hostile, ctx: Context) -> str:
    values = {"port": ctx.port, "token": ctx.token, "hostpid": os.getpid(), "canary_tmp": ctx.bait.canary_tmp,
              "canary_checkout": ctx.bait.canary_checkout, "sock_tmp": ctx.bait.sock_tmp,
              "sock_run": ctx.bait.sock_run, "abstract": ctx.bait.abstract}
    code = program.code
    for key, value in values.items():
        code = code.replace("{" + key + "}", str(value))
    return code


def run_hostile(program: Hostile) -> tuple[SandboxResult, Context]:
    """Run one program with the canary set, host bait laid out and the listeners up; check it. Raises
    AssertionError."""
    listener = LoopbackListener()
    token = "tok" + uuid.uuid4().hex
    ctx = Context(port=listener.port, token=token, listener=listener, bait=HostBait(token))
    os.environ[CANARY] = CANARY_VALUE
    try:
        limits = SandboxLimits(**{**BASE_LIMITS, **program.limits})
        result = run_python(program_text(program, ctx), limits)
        time.sleep(0.15)  # give the listeners a moment to count anything that did arrive
        assert CANARY_VALUE not in out(result), "the canary secret leaked into the output"
        assert result.status != "sandbox_error", result.stderr
        assert not leftover_processes(ctx.token), "a sandboxed process outlived the run"
        program.check(result, ctx)
        no_connection(result, ctx)
        no_unix_connection(result, ctx)
        return result, ctx
    finally:
        os.environ.pop(CANARY, None)
        listener.close()
        ctx.bait.close()


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
        if result and program.name == "children share the memory cap":
            figures["tree_peak_vs_cap_mib"] = (round(result.peak_memory_bytes / MIB, 1), BASE_LIMITS["memory_mb"])
            figures["children_exit_statuses"] = printed(result, "children")
        if result and program.name == "fill /dev/shm":
            figures["shm_written_vs_cap_mib"] = (round(printed(result, "written") / MIB, 1), BASE_LIMITS["shm_mb"])
        if result and program.name == "fill the tmpfs workdir":
            figures["tmpfs_written_vs_cap_mib"] = (round(printed(result, "written") / MIB, 1), BASE_LIMITS["tmpfs_mb"])
        if result and program.name == "nested fork bomb":
            figures["nested_forks_vs_pids_max"] = (printed(result, "forks"), BASE_LIMITS["max_processes"])
        if result and program.name == "many files in the workdir":
            figures["files_created_in_1s"] = printed(result, "files")
        if result and result.peak_memory_bytes:
            figures["max_tree_peak_mib"] = max(figures.get("max_tree_peak_mib", 0), round(result.peak_memory_bytes / MIB, 1))
    figures["contained"] = f"{contained}/{len(PROGRAMS)}"
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
