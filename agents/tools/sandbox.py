"""Run untrusted Python in a separate, locked-down process.

    result = run_python("print(1 + 1)", SandboxLimits(timeout_s=5))
    result.status  # "ok" | "error" | "timeout" | "memory" | "killed" | "sandbox_error"

What it does (with bubblewrap, the default when `bwrap` is on PATH):
- bwrap, started as root, makes new pid/net/ipc/uts namespaces: no network (only the namespace's own loopback,
  which reaches nothing on the host),
  the program sees only its own processes; the whole namespace dies with its pid 1 and with our process.
- the root file system is bind-mounted READ-ONLY, /tmp is a fresh small tmpfs, /proc and /dev are fresh;
  `hidden_paths` (the project directory, /root, $HOME) are covered with empty tmpfs, so ~/.aws, project files
  and secrets there are unreadable; only the Python prefixes (venv, base interpreter) are bound back, read-only.
- inside, `setpriv` drops to an unprivileged uid/gid (65534) with no groups, no capabilities and no_new_privs;
  that matters because we run as root and RLIMIT_NPROC does not bind root.
- rlimits (set by `prlimit`, inherited by everything below it): address space (memory_mb), CPU seconds, processes (max_processes; counted per uid, system-wide),
  file size (file_size_mb), core dumps off.
- environment is replaced by a minimal one (PATH, HOME=workdir, LANG): no AWS_* / API keys reach the program.
- a wall clock timeout SIGKILLs the whole process group; stdout/stderr are read continuously and only the head and
  the tail (max_output_chars per stream) are kept, so a program printing forever costs memory O(limit).
- the working directory is a fresh temp dir, deleted afterwards; Python runs with -I (isolated: no PYTHON* env,
  no user site, script dir not on sys.path).

Fallback when bwrap is missing (or use_bwrap=False): `unshare --net --pid --fork --kill-child --mount-proc` +
setpriv + the same rlimits: no network, own pid namespace, unprivileged uid. It needs root (unshare of net/pid
namespaces). It does NOT hide any file: the program can read whatever uid 65534 can read (including the project
directory if it is world-readable) and write world-writable places such as the host /tmp.

What it does NOT cover in either mode: kernel exploits; CPU time stolen from co-tenants within the limits;
/tmp tmpfs and workdir disk use beyond file_size_mb per file (file COUNT is not limited); side channels; reading
world-readable host files outside hidden_paths (e.g. /etc/passwd is readable — it holds no secrets; /etc/shadow
is not); concurrent sandboxes share the uid, so they share the max_processes budget.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from afm.config import Config

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SANDBOX_UID = 65534  # "nobody": owns nothing on the host


class SandboxLimits(Config):
    """Limits for one sandboxed run."""

    timeout_s: float = Field(30.0, description="Wall clock limit; the process group is SIGKILLed after it (AFM: 30 s)")
    cpu_s: int = Field(30, description="RLIMIT_CPU seconds (SIGXCPU when exceeded)")
    memory_mb: int = Field(1024, description="RLIMIT_AS in MiB (virtual address space of each process)")
    max_output_chars: int = Field(8000, description="Bytes of stdout and of stderr kept each (head + tail)")
    max_processes: int = Field(64, description="RLIMIT_NPROC for the sandbox uid (forks beyond it fail)")
    file_size_mb: int = Field(16, description="RLIMIT_FSIZE in MiB: largest file the program may write")
    tmpfs_mb: int = Field(64, description="Size of the fresh /tmp inside the sandbox (bwrap only)")
    hidden_paths: list[str] = Field(
        default_factory=lambda: [str(PROJECT_ROOT), "/root", str(Path.home())],
        description="Directories covered with an empty tmpfs inside the sandbox (bwrap only)",
    )
    use_bwrap: bool = Field(True, description="Use bubblewrap when present; False forces the unshare fallback")


@dataclass
class SandboxResult:
    status: str  # ok | error | timeout | memory | killed | sandbox_error
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    killed_by: str | None  # "wall_timeout", or a signal name such as "SIGXCPU" / "SIGKILL"


class _HeadTailBuffer:
    """Keeps the first and last `limit // 2` bytes of a stream plus the count of bytes dropped in between."""

    def __init__(self, limit: int):
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            del self.tail[: max(len(self.tail) - self.half, 0)]

    def text(self) -> str:
        dropped = self.total - len(self.head) - len(self.tail)
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if dropped > 0:
            return f"{head}\n... [{dropped} bytes truncated] ...\n{tail}"
        return head + tail


def _drain(stream, buffer: _HeadTailBuffer) -> None:
    while chunk := stream.read(65536):
        buffer.feed(chunk)


def _python_prefixes() -> list[str]:
    """Directories the interpreter needs (venv + base install), bound back read-only over hidden paths."""
    prefixes = {sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parents[1])}
    return sorted(p for p in prefixes if p not in ("/", "/usr"))


# Where the program's fresh workdir appears inside bwrap (on the sandbox's private /tmp tmpfs).
INNER_WORKDIR = "/tmp/work"


def _drop_privileges() -> list[str]:
    # Only root can (and needs to) switch uid; a non-root caller is already bound by RLIMIT_NPROC.
    if os.geteuid() != 0:
        return []
    return ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", "--no-new-privs"]


def _bwrap_command(workdir: Path, limits: SandboxLimits) -> list[str]:
    cmd = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", "--new-session", "--ro-bind", "/", "/",
           "--size", str(limits.tmpfs_mb * 1024 * 1024), "--perms", "1777", "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
    for hidden in limits.hidden_paths:
        if Path(hidden).is_dir():
            cmd += ["--tmpfs", hidden]
    for prefix in _python_prefixes():
        if any(Path(prefix).is_relative_to(h) for h in limits.hidden_paths):
            cmd += ["--ro-bind", prefix, prefix]
    cmd += ["--bind", str(workdir), INNER_WORKDIR, "--chdir", INNER_WORKDIR]
    return cmd + _drop_privileges()


def _fallback_command() -> list[str]:
    return ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"] + _drop_privileges()


def _rlimit_command(limits: SandboxLimits) -> list[str]:
    """prlimit sets the limits on itself and execs the rest; bwrap, setpriv and the program inherit them.
    (A preexec_fn would do the same but is unsafe when the caller has threads, e.g. a Ray actor.)"""
    mb = 1024 * 1024
    return ["prlimit", f"--as={limits.memory_mb * mb}", f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",
            f"--nproc={limits.max_processes}", f"--fsize={limits.file_size_mb * mb}", "--core=0", "--"]


def _classify(returncode: int, stderr: str, timed_out: bool) -> tuple[str, str | None]:
    if timed_out:
        return "timeout", "wall_timeout"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:  # real-time signals have no name
            name = f"signal {-returncode}"
        if name == "SIGXCPU":
            return "timeout", name
        # SIGKILL that we did not send: the kernel OOM killer is the usual sender
        return ("memory" if name == "SIGKILL" else "killed"), name
    if returncode == 0:
        return "ok", None
    if "MemoryError" in stderr[-2000:]:
        return "memory", None
    return "error", None


def _signal_from_exit(returncode: int) -> int:
    # unshare/bwrap report a child killed by signal N as exit status 128 + N. A program that itself exits with
    # 129..192 is therefore reported as killed by that signal; rare enough to accept.
    if 128 < returncode < 128 + 65:
        return -(returncode - 128)
    return returncode


def run_python(code: str, limits: SandboxLimits) -> SandboxResult:
    """Run `code` as a script in a fresh sandbox; never raises for anything the program does."""
    workdir = Path(tempfile.mkdtemp(prefix="afm-sandbox-"))
    try:
        script = workdir / "main.py"
        script.write_text(code, encoding="utf-8")
        if os.geteuid() == 0:
            os.chown(workdir, SANDBOX_UID, SANDBOX_UID)
            os.chown(script, SANDBOX_UID, SANDBOX_UID)
        use_bwrap = limits.use_bwrap and shutil.which("bwrap")
        wrapper = _bwrap_command(workdir, limits) if use_bwrap else _fallback_command()
        # Inside bwrap the workdir always has the same path, so the same program gives the same output
        # (tracebacks name the script's path): rollouts and the tool cache stay reproducible.
        inner = Path(INNER_WORKDIR) if use_bwrap else workdir
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(inner), "LANG": "C.UTF-8",
               "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "TMPDIR": "/tmp",
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        command = _rlimit_command(limits) + wrapper + [sys.executable, "-I", str(inner / "main.py")]
        return _execute(command, workdir, env, limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _execute(cmd: list[str], workdir: Path, env: dict, limits: SandboxLimits) -> SandboxResult:
    start = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        return SandboxResult("sandbox_error", None, "", f"could not start the sandbox: {exc}", 0.0, None)
    out, err = _HeadTailBuffer(limits.max_output_chars), _HeadTailBuffer(limits.max_output_chars)
    readers = [threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True)]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        proc.wait(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    duration = time.monotonic() - start
    for reader in readers:
        # a grandchild that escaped the group could hold the pipe open; the pid namespace dies with bwrap,
        # so this join only waits for buffered bytes
        reader.join(timeout=2.0)
    stdout, stderr = out.text(), err.text()
    returncode = _signal_from_exit(proc.returncode) if not timed_out else proc.returncode
    status, killed_by = _classify(returncode, stderr, timed_out)
    exit_code = returncode if returncode >= 0 and not timed_out else None
    if stderr.startswith(("bwrap:", "setpriv:", "prlimit:", "unshare:")) and not stdout:
        status = "sandbox_error"  # the wrapper itself failed (a mount, a uid switch): the program never ran
    return SandboxResult(status, exit_code, stdout, stderr, duration, killed_by)
