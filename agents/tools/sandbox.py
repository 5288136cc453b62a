"""Run untrusted Python in a separate, locked-down process.

    result = run_python("print(1 + 1)", SandboxLimits(timeout_s=5))
    result.status  # "ok" | "error" | "timeout" | "memory" | "killed" | "sandbox_error"
    result.peak_memory_bytes, result.cgroup  # tree peak and "v1"; None when no cgroup could be made

What it does (with bubblewrap, the default when `bwrap` is on PATH; we run it as root, no user namespace):
- new pid/net/ipc/uts/cgroup namespaces: no network (only the namespace's own loopback), abstract Unix sockets
  live in the net namespace so none of the host's is reachable, the program sees only its own processes, and the
  whole namespace dies with its pid 1 and with our process.
- a MINIMAL root: an empty tmpfs holding only read-only binds of /usr/bin, /usr/lib, /usr/lib64 (+ the /bin,
  /lib, /lib64 links), /etc/ld.so.cache and the Python prefixes (the venv, the base interpreter). No host /,
  no project checkout, no /root or $HOME beyond the interpreter's own directory, no /run, /var, /sys, /home,
  no other /etc file: a host file or socket outside those binds does not exist inside. The checkout is not
  bound, so project code cannot be imported. The venv's editable-install .pth files (`__editable__*.pth`, whose
  finder points at that checkout) are covered by /dev/null, which reads as permission denied on the nodev bind,
  so `site` skips them: a speed measure, not a barrier (their finder's imports were ~20 ms of the interpreter's
  ~28-ms start).
  Binds are nosuid,nodev (bwrap's default), so setuid binaries in /usr/bin do not raise privileges.
- /tmp is a fresh tmpfs of `tmpfs_mb`, holding the working directory /tmp/work (the same path on every run, so
  tracebacks are reproducible); the script is copied into it from a memfd (`bwrap --file`), nothing is written on
  the host disk. /dev/shm is a private tmpfs of `shm_mb` (mode 1777, so multiprocessing works); /proc and /dev
  are fresh (/dev: null, zero, full, random, urandom, tty, pts).
- inside, `setpriv` drops to uid/gid 65534 with no groups, no capabilities and no_new_privs; a seccomp filter
  (x86_64) refuses creating or joining namespaces (no user namespace, hence no capabilities anywhere), the
  keyrings, bpf, perf_event_open and userfaultfd.
- one cgroup per run in each of the cgroup v1 memory and pids hierarchies, nested under our own groups (so our
  own limits still apply), joined by the first process of the command line (a one-line `sh` that moves itself in
  and then execs the rest), so every process of the tree is inside before the program starts:
  memory.limit_in_bytes (+ memsw: no swap) = memory_mb for the WHOLE tree, tmpfs and /dev/shm pages included;
  pids.max = max_processes for the whole tree (threads count; the two bwrap processes too). An OOM kill in the
  group gives status "memory" (unless the program still exits 0, e.g. after a killed child); the group's peak
  (memory.max_usage_in_bytes) comes back as `peak_memory_bytes`. After the run (and on timeout) every pid of the
  group is SIGKILLed and the groups are removed. cgroup v2 is not used: a v2 group can hand controllers to child
  groups only while it holds no process, and ours holds us; a pure v2 host takes the no-cgroup path below.
- rlimits (set by `prlimit`, inherited by everything below it): RLIMIT_AS = memory_mb per process (kept as a
  belt: a single runaway process gets a clean MemoryError instead of an OOM kill, as before), RLIMIT_CPU = cpu_s
  per process, RLIMIT_FSIZE = file_size_mb, core dumps off; RLIMIT_NPROC = max_processes only when there is no
  pids cgroup (it counts per uid, system-wide, so concurrent sandboxes would share it).
- environment is replaced by a minimal one (PATH, HOME=workdir, LANG): no AWS_* / API keys reach the program;
  Python runs with -I (no PYTHON* env, no user site, script dir not on sys.path).
- a wall clock timeout SIGKILLs the process group and every pid of the cgroup; stdout/stderr are read
  continuously and only the head and the tail (max_output_chars per stream) are kept. The exit is awaited on a
  pidfd, so a run returns when its process ends (Popen.wait with a timeout polls with sleeps of up to 50 ms).

Without a writable cgroup v1 (`result.cgroup is None`; not root, pure v2, use_cgroup=False): memory is limited PER
PROCESS only (RLIMIT_AS; N processes may hold N x memory_mb), processes by RLIMIT_NPROC per uid (shared by
concurrent sandboxes), no peak figure, and a SIGKILL we did not send is reported as "memory" (the kernel OOM killer
being its usual sender).

Fallback when bwrap is missing (or use_bwrap=False): `unshare --net --pid --fork --kill-child --mount-proc` +
setpriv + the same rlimits and cgroup: no network (abstract Unix sockets included), own pid namespace,
unprivileged uid. It needs root. It LACKS the minimal root and the seccomp filter: the program can read whatever
uid 65534 can read on the host (including world-readable project files and other checkouts), connect to host
Unix socket files whose permissions allow it, write world-writable host places such as /tmp and /dev/shm, create
user namespaces, and its working directory is a host temp dir (disk use bounded per file only). An interpreter
under a directory uid 65534 cannot enter (e.g. pyenv under /root, mode 0700) cannot be executed there.

What it does NOT cover (bwrap mode): kernel exploits through the syscalls left open; side channels; CPU: RLIMIT_CPU
is per process, so a tree of N processes may use up to N x cpu_s, bounded by the wall timeout x cores (no cgroup
CPU quota: it would slow legitimate parallel programs); reading what the binds expose (system libraries and
binaries, the interpreter, every package in the venv); /proc/self/mountinfo names the bound host paths, among them
the venv's path (for a venv inside the checkout that names the checkout directory, though none of its other files
is mounted); /proc shows host-wide figures (meminfo, cpuinfo, uptime, load); a venv or prefix that CONTAINS the
checkout would expose it; file COUNT in the tmpfs (bounded only through the memory cgroup, which inode memory is
charged to); no seccomp filter on other architectures than x86_64; leftover (empty) afm-sandbox-* cgroups if our
own process is SIGKILLed mid-run.
"""
from __future__ import annotations

import functools
import os
import platform
import select
import shutil
import signal
import site
import subprocess
import struct
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from afm.config import Config

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SANDBOX_UID = 65534  # "nobody": owns nothing on the host
MIB = 1024 * 1024


class SandboxLimits(Config):
    """Limits for one sandboxed run."""

    timeout_s: float = Field(30.0, gt=0,
                             description="Wall clock limit; the whole tree is SIGKILLed after it (AFM: 30 s)")
    cpu_s: int = Field(30, description="RLIMIT_CPU seconds per process (SIGXCPU when exceeded)")
    memory_mb: int = Field(1024, description="Memory of the whole process tree (cgroup) and RLIMIT_AS per process")
    max_output_chars: int = Field(8000, description="Bytes of stdout and of stderr kept each (head + tail)")
    max_processes: int = Field(64, description="Processes + threads of the whole tree (cgroup pids.max; without a "
                                               "cgroup: RLIMIT_NPROC of the sandbox uid)")
    file_size_mb: int = Field(16, description="RLIMIT_FSIZE in MiB: largest file the program may write")
    tmpfs_mb: int = Field(64, description="Size of the tmpfs holding /tmp and the working dir /tmp/work (bwrap)")
    shm_mb: int = Field(16, description="Size of the private /dev/shm tmpfs (bwrap)")
    use_bwrap: bool = Field(True, description="Use bubblewrap when present; False forces the unshare fallback")
    use_cgroup: bool = Field(True, description="Cap memory and pids of the tree with a cgroup when one is writable")


@dataclass
class SandboxResult:
    status: str  # ok | error | timeout | memory | killed | sandbox_error
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    killed_by: str | None  # "wall_timeout", or a signal name such as "SIGXCPU" / "SIGKILL"
    peak_memory_bytes: int | None = None  # peak of the whole tree (cgroup); None without a cgroup
    cgroup: str | None = None  # "v1" when memory and pids were capped for the whole tree; None: rlimits only


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


# ---------------------------------------------------------------------------------------------------- cgroups

@functools.lru_cache(maxsize=1)
def _cgroup_parents() -> tuple[Path, Path] | None:
    """Our own cgroup v1 memory and pids directories (children made there nest under whatever limits we run
    with); None when either hierarchy is not mounted (e.g. a pure cgroup v2 host)."""
    try:
        own = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
        mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return None
    found = []
    for controller in ("memory", "pids"):
        path = next((p for _, ctrls, p in own if controller in ctrls.split(",")), None)
        mount = next((m[1] for m in mounts if m[2] == "cgroup" and controller in m[3].split(",")), None)
        if path is None or mount is None:
            return None
        found.append(Path(mount + path.rstrip("/")))
    return found[0], found[1]


class _Cgroup:
    """One run's cgroups (v1): a memory group and a pids group, removed by remove()."""

    version = "v1"

    def __init__(self, dirs: list[Path]):
        self.dirs = dirs  # [memory dir, pids dir] once created

    @classmethod
    def create(cls, limits: SandboxLimits) -> _Cgroup | None:
        """A fresh group with the limits written, or None when none can be made here (not root, read-only)."""
        parents = _cgroup_parents()
        if parents is None:
            return None
        group, name = cls([]), f"afm-sandbox-{uuid.uuid4().hex}"
        try:
            for parent in parents:
                (parent / name).mkdir()
                group.dirs.append(parent / name)
            memory, pids = group.dirs
            (memory / "memory.limit_in_bytes").write_text(str(limits.memory_mb * MIB))
            if (memory / "memory.memsw.limit_in_bytes").exists():  # memory + swap: no swapping past the cap
                (memory / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_mb * MIB))
            (pids / "pids.max").write_text(str(limits.max_processes))
        except OSError:
            group.remove()
            return None
        return group

    def pids(self) -> set[int]:
        found: set[int] = set()
        for group_dir in self.dirs:
            try:
                found.update(int(pid) for pid in (group_dir / "cgroup.procs").read_text().split())
            except OSError:
                continue
        return found

    def kill_all(self, wait_s: float = 2.0) -> None:
        """SIGKILL every process of the group until it is empty (forks racing the kill are bounded by pids.max)."""
        deadline = time.monotonic() + wait_s
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.002)

    def peak_bytes(self) -> int | None:
        try:
            return int((self.dirs[0] / "memory.max_usage_in_bytes").read_text())
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int:
        try:
            lines = (self.dirs[0] / "memory.oom_control").read_text().splitlines()
        except OSError:
            return 0
        return sum(int(line.split()[1]) for line in lines if line.startswith("oom_kill "))

    def remove(self) -> None:
        # exiting tasks stay listed for a moment after the namespace dies: rmdir is EBUSY until they are gone
        for path in self.dirs:
            deadline = time.monotonic() + 2.0
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.002)


def _join_cgroup(group: _Cgroup | None) -> list[str]:
    """Command prefix: a shell that moves itself into the run's cgroups, then execs the rest, so everything
    below it (prlimit, bwrap, the program) starts inside; no preexec_fn, which is unsafe with threads.
    "0" written to `tasks` moves the writing thread (sh has one) without the hierarchy-wide lock that a write to
    cgroup.procs takes (an RCU grace period: ~10 ms per hierarchy here, a third of a trivial run)."""
    if group is None:
        return []
    script = ('for f do [ "$f" = -- ] && break; echo 0 > "$f/tasks" || '
              '{ echo "cgroup: cannot join $f" >&2; exit 125; }; shift; done; shift; exec "$@"')
    return ["/bin/sh", "-c", script, "sh", *map(str, group.dirs), "--"]


# ---------------------------------------------------------------------------------------- command lines

# Where the program's working directory appears inside bwrap (on the sandbox's private /tmp tmpfs).
INNER_WORKDIR = "/tmp/work"
# System directories the interpreter, numpy's bundled libraries, setpriv and /bin/sh need; bound read-only
# (or re-created as the same symlink where the host has merged /usr).
_SYSTEM_PATHS = ("/usr/bin", "/usr/lib", "/usr/lib64", "/bin", "/lib", "/lib64", "/etc/ld.so.cache")


def _python_prefixes() -> list[str]:
    """Directories the interpreter needs: the venv and the base install (sys.prefix & co. and the real binary's)."""
    prefixes = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
                str(Path(sys.executable).resolve().parents[1])}
    covered = ("/usr/bin", "/usr/lib", "/usr/lib64")  # a system Python's prefix is /usr: already bound
    return sorted(p for p in prefixes if p not in ("/", "/usr") and not p.startswith(covered))


@functools.lru_cache(maxsize=1)
def _root_binds() -> tuple[str, ...]:
    """bwrap arguments that build the minimal root: parent directories (0755), system paths, Python prefixes."""
    binds: list[tuple[str, str]] = []
    for path in _SYSTEM_PATHS:
        if os.path.islink(path):
            binds.append(("--symlink", path))
        elif os.path.exists(path):
            binds.append(("--ro-bind", path))
    prefixes = _python_prefixes()
    # a prefix inside another one is visible through the outer bind already
    binds += [("--ro-bind", p) for p in prefixes if not any(p != q and Path(p).is_relative_to(q) for q in prefixes)]
    bound = [path for _, path in binds]
    parents = sorted({str(parent) for path in bound for parent in Path(path).parents if str(parent) != "/"},
                     key=lambda p: p.count("/"))
    args: list[str] = []
    for parent in parents:  # bwrap would make missing parents 0700, unreadable for uid 65534
        args += ["--perms", "0755", "--dir", parent]
    for kind, path in binds:
        args += ["--symlink", os.readlink(path), path] if kind == "--symlink" else ["--ro-bind", path, path]
    return tuple(args)


def _editable_pth_covers() -> list[str]:
    """bwrap arguments covering the editable install's .pth files in the interpreter's site-packages
    (`pip install -e .` writes `__editable__.<project>.pth`) with /dev/null: inside, they would import a finder
    for a checkout that is not there. Globbed at every run, not cached with the root: a reinstall under another
    version renames the file, and a bind onto a missing file fails the run."""
    files = sorted(str(p) for d in site.getsitepackages() for p in Path(d).glob("__editable__*.pth"))
    return [arg for pth in files for arg in ("--ro-bind", "/dev/null", pth)]


# seccomp deny-list (x86_64): creating namespaces (an unprivileged user namespace would hand the program
# capabilities over new mount/net namespaces: kernel attack surface), joining them, the keyrings (the per-uid
# keyring of 65534 is shared by every sandbox), bpf, perf_event_open, userfaultfd. clone3 gets ENOSYS (its flags
# live in memory a filter cannot read), so libc falls back to clone, whose flags are checked.
_SYSCALLS_X86_64 = {"clone": 56, "unshare": 272, "setns": 308, "clone3": 435, "keyctl": 250, "add_key": 248,
                    "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323}
# NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (NEWTIME's bit is clone's exit-signal byte)
_CLONE_NAMESPACE_FLAGS = 0x7E020000


@functools.lru_cache(maxsize=1)
def _seccomp_filter() -> bytes | None:
    """A classic-BPF seccomp program for `bwrap --seccomp FD`; None on other architectures (no filter there)."""
    if platform.machine() != "x86_64":
        return None
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    nr = _SYSCALLS_X86_64
    denied = [nr[name] for name in ("unshare", "setns", "keyctl", "add_key", "request_key", "bpf",
                                    "perf_event_open", "userfaultfd")]
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, 0xC000003E), (ret, 0, 0, eperm),  # not x86_64 (i386 / int 0x80): refuse
            (ld, 0, 0, 0), (jge, 0, 1, 0x40000000), (ret, 0, 0, eperm),  # x32 ABI: refuse
            (jeq, 0, 1, nr["clone3"]), (ret, 0, 0, enosys)]
    for number in denied:
        prog += [(jeq, 0, 1, number), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 3, nr["clone"]), (ld, 0, 0, 16),  # clone's flags: low 32 bits of args[0]
             (jset, 0, 1, _CLONE_NAMESPACE_FLAGS), (ret, 0, 0, eperm), (ret, 0, 0, allow)]
    return b"".join(struct.pack("=HBBI", *insn) for insn in prog)


def _drop_privileges() -> list[str]:
    # Only root can (and needs to) switch uid; a non-root caller already runs unprivileged.
    if os.geteuid() != 0:
        return []
    return ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", "--no-new-privs"]


def _bwrap_command(script_fd: int, seccomp_fd: int | None, limits: SandboxLimits) -> list[str]:
    seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
    return ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session",
            # /tmp first: a venv under /tmp (a CI clone in /tmp/...) is then bound on top of the fresh tmpfs
            # instead of being covered by it
            "--size", str(limits.tmpfs_mb * MIB), "--perms", "1777", "--tmpfs", "/tmp", *_root_binds(),
            *_editable_pth_covers(),
            "--perms", "0777", "--dir", INNER_WORKDIR,
            "--perms", "0644", "--file", str(script_fd), f"{INNER_WORKDIR}/main.py",
            "--proc", "/proc", "--dev", "/dev",  # /dev before /dev/shm: --dev mounts a fresh /dev over it
            "--size", str(limits.shm_mb * MIB), "--perms", "1777", "--tmpfs", "/dev/shm",
            "--chdir", INNER_WORKDIR, *seccomp, *_drop_privileges()]


def _fallback_command() -> list[str]:
    return ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"] + _drop_privileges()


def _rlimit_command(limits: SandboxLimits, group: _Cgroup | None) -> list[str]:
    """prlimit sets the limits on itself and execs the rest; bwrap, setpriv and the program inherit them.
    (A preexec_fn would do the same but is unsafe when the caller has threads, e.g. a Ray actor.)"""
    nproc = [] if group is not None else [f"--nproc={limits.max_processes}"]
    return ["prlimit", f"--as={limits.memory_mb * MIB}", f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}", *nproc,
            f"--fsize={limits.file_size_mb * MIB}", "--core=0", "--"]


def _env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "TMPDIR": "/tmp",
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def run_python(code: str, limits: SandboxLimits) -> SandboxResult:
    """Run `code` as a script in a fresh sandbox; never raises for anything the program does."""
    group = _Cgroup.create(limits) if limits.use_cgroup else None
    try:
        if limits.use_bwrap and shutil.which("bwrap"):
            return _run_bwrap(code, limits, group)
        return _run_unshare(code, limits, group)
    finally:
        if group is not None:
            group.remove()


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _run_bwrap(code: str, limits: SandboxLimits, group: _Cgroup | None) -> SandboxResult:
    # bwrap copies the script into the sandbox's tmpfs and reads the filter: nothing is written on the host disk
    fds = [_memfd("main.py", code.encode("utf-8"))]
    seccomp = _seccomp_filter()
    if seccomp is not None:
        fds.append(_memfd("seccomp", seccomp))
    try:
        command = (_join_cgroup(group) + _rlimit_command(limits, group)
                   + _bwrap_command(fds[0], fds[1] if seccomp is not None else None, limits)
                   + [sys.executable, "-I", f"{INNER_WORKDIR}/main.py"])
        return _execute(command, "/", _env(INNER_WORKDIR), limits, group, tuple(fds))
    finally:
        for fd in fds:
            os.close(fd)


def _run_unshare(code: str, limits: SandboxLimits, group: _Cgroup | None) -> SandboxResult:
    workdir = Path(tempfile.mkdtemp(prefix="afm-sandbox-"))
    try:
        script = workdir / "main.py"
        script.write_text(code, encoding="utf-8")
        if os.geteuid() == 0:
            os.chown(workdir, SANDBOX_UID, SANDBOX_UID)
            os.chown(script, SANDBOX_UID, SANDBOX_UID)
        command = (_join_cgroup(group) + _rlimit_command(limits, group) + _fallback_command()
                   + [sys.executable, "-I", str(script)])
        return _execute(command, str(workdir), _env(str(workdir)), limits, group, ())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _classify(returncode: int, stderr: str, timed_out: bool, oom_kills: int | None) -> tuple[str, str | None]:
    """oom_kills: the cgroup's OOM kill count, None without a cgroup."""
    if timed_out:
        return ("memory" if oom_kills else "timeout"), "wall_timeout"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:  # real-time signals have no name
            name = f"signal {-returncode}"
        if name == "SIGXCPU":
            return "timeout", name
        if oom_kills is None:  # no cgroup to ask: a SIGKILL we did not send is usually the OOM killer
            return ("memory" if name == "SIGKILL" else "killed"), name
        return ("memory" if oom_kills else "killed"), name
    if returncode == 0:
        return "ok", None
    if oom_kills or "MemoryError" in stderr[-2000:]:
        return "memory", None
    return "error", None


def _signal_from_exit(returncode: int) -> int:
    # unshare/bwrap report a child killed by signal N as exit status 128 + N. A program that itself exits with
    # 129..192 is therefore reported as killed by that signal; rare enough to accept.
    if 128 < returncode < 128 + 65:
        return -(returncode - 128)
    return returncode


def _exited_within(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for `proc` to exit, at most `timeout_s` (> 0); True if it did. Blocks on a pidfd, which wakes at the
    exit itself: Popen.wait(timeout) polls with sleeps of up to 50 ms, ~25 ms of a ~65-ms trivial run. Where
    pidfd_open fails (kernels before Linux 5.3, a container's seccomp profile refusing it) it polls."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()  # not select.select: a Ray actor's descriptors can be numbered past FD_SETSIZE
        poller.register(pidfd, select.POLLIN)
        exited = bool(poller.poll(min(timeout_s * 1000, 2**31 - 1)))  # poll takes ms up to INT_MAX
    finally:
        os.close(pidfd)
    if exited:
        proc.wait()  # reaps it (returns at once)
    return exited


def _execute(cmd: list[str], cwd: str, env: dict, limits: SandboxLimits, group: _Cgroup | None,
             pass_fds: tuple[int, ...]) -> SandboxResult:
    start = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, pass_fds=pass_fds)
    except OSError as exc:
        return SandboxResult("sandbox_error", None, "", f"could not start the sandbox: {exc}", 0.0, None)
    out, err = _HeadTailBuffer(limits.max_output_chars), _HeadTailBuffer(limits.max_output_chars)
    readers = [threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True)]
    for reader in readers:
        reader.start()
    timed_out = not _exited_within(proc, limits.timeout_s)
    if timed_out:
        os.killpg(proc.pid, signal.SIGKILL)
        if group is not None:
            group.kill_all()
        proc.wait()
    duration = time.monotonic() - start
    if group is not None:
        group.kill_all()  # normally empty already: the pid namespace dies with bwrap
    for reader in readers:
        # a grandchild that escaped the group could hold the pipe open; the pid namespace dies with bwrap,
        # so this join only waits for buffered bytes
        reader.join(timeout=2.0)
    stdout, stderr = out.text(), err.text()
    returncode = _signal_from_exit(proc.returncode) if not timed_out else proc.returncode
    oom_kills = group.oom_kills() if group is not None else None
    status, killed_by = _classify(returncode, stderr, timed_out, oom_kills)
    exit_code = returncode if returncode >= 0 and not timed_out else None
    if stderr.startswith(("bwrap:", "setpriv:", "prlimit:", "unshare:", "cgroup:")) and not stdout:
        status = "sandbox_error"  # the wrapper itself failed (a mount, a uid switch): the program never ran
    return SandboxResult(status, exit_code, stdout, stderr, duration, killed_by,
                         peak_memory_bytes=group.peak_bytes() if group is not None else None,
                         cgroup=group.version if group is not None else None)
