"""Run vLLM's OpenAI server (`vllm.entrypoints.openai.api_server`) in this process, and kill it with everything
it spawned as soon as the process that started it is gone.

serving/vllm_server.py starts it with the interpreter that has vLLM, which may be another venv (so: stdlib only,
no project imports), as the leader of a new session, with stdin a pipe whose write end it keeps and never writes:

    <python with vllm> serving/vllm_child.py --model DIR --served-model-name afm --host 127.0.0.1 --port N ...

Why: a Ray replica can die without running any cleanup (SIGKILL by Ray, the OOM killer), and a vLLM server left
behind would hold the GPU that the restarted replica needs. However the parent ends, its end of the pipe closes,
the read below returns, and the whole process group (the API server, its engine core and workers) is killed.
A parent that stops the server on purpose signals the group itself (VLLMServer.stop).
"""
import os
import runpy
import signal
import sys
import threading


def _die_with_parent() -> None:
    # os.read, not sys.stdin: a daemon thread blocked inside the buffered reader's lock aborts the interpreter
    # at exit ("could not acquire lock ... at interpreter shutdown") when vLLM exits first.
    while os.read(0, 4096):  # b"" only at EOF: the parent closed the pipe or exited
        pass
    os.killpg(0, signal.SIGKILL)  # the parent is gone: nobody waits for a graceful shutdown


if __name__ == "__main__":
    threading.Thread(target=_die_with_parent, daemon=True).start()
    sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
