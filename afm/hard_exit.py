"""End a process that has used Ray (or other native runtimes) without running the interpreter's native teardown.

    from afm.hard_exit import exit_after_python_cleanup
    exit_after_python_cleanup(status)   # atexit handlers run, streams flushed, then os._exit(status)

Why: `ray.shutdown()` does not join Ray's C++ threads. Measured with ray 2.60 in this project's test process:
after the last `ray.shutdown()`, 9 native threads are still running at interpreter exit (`gcs_client_io_s`,
`worker.io`, gRPC's `event_engine` x3, `grpc_global_tim` x2, `timer_manager`, `resolver-execut`,
`default-executo`); a bare `ray.init(); ray.shutdown()` leaves 8 of them. Interpreter finalization then frees
Python objects and runs C++ static destructors (Ray's and gRPC's globals) while those threads may still use
them: the known crash class of Ray issues #31145 and #37596, and the suspected cause of the SIGSEGV an outside
review saw once after a passing suite (docs/reliability.md says what was and was not reproduced). Ray's own
worker processes end with os._exit for the same reason.

What runs before the exit: every Python `atexit` handler (Ray's own shutdown hook, Prefect's, pytest's temp-dir
lock removal, logging's flush), then stdout/stderr are flushed. What is skipped: module teardown, garbage
collection of what is left, and C/C++ static destructors. It does NOT cover a crash inside an atexit handler
itself, nor threads that still hold unflushed data in their own buffers (none of ours do: files are written
with explicit close/rename).
"""
from __future__ import annotations

import atexit
import os
import sys


def exit_after_python_cleanup(status: int) -> None:
    """Run the atexit handlers, flush the standard streams, and leave with `status` via os._exit."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can be written anyway
            pass
    os._exit(status)
