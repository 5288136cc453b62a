"""The `code` tool: extract the ```python block from a <code> argument, run it in the sandbox, render AFM statuses.

    tool = CodeTool(SandboxLimits(timeout_s=30), max_output_chars=1500)
    tool.run("```python\nprint(2**10)\n```").text  # "[RESULT:SUCCESS]\n1024\n"
"""
from __future__ import annotations

import re

from agents.tools.base import ToolResult, truncate_middle
from agents.tools.sandbox import SandboxLimits, SandboxResult, run_python

_FENCE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)

CODE_DESCRIPTION = (
    "code: run Python 3. Write exactly one fenced block inside the tag: <code>```python\\n...\\n```</code>. "
    "Print what you need to see; stdout and stderr come back in the observation (long output is cut in the middle). "
    "No network, no files outside the working directory, {timeout:g} s and {memory} MiB limits."
)


def extract_python_block(argument: str) -> str | None:
    """The first ```python (or ```py) fenced block's body, or None when there is none."""
    match = _FENCE.search(argument)
    return match.group(1) if match else None


def render_observation(result: SandboxResult, limits: SandboxLimits, max_output_chars: int) -> str:
    """AFM-style status line, then stdout and stderr (each cut in the middle to fit)."""
    if result.status == "ok":
        head = "[RESULT:SUCCESS]"
    elif result.status == "timeout":
        why = "CPU time limit" if result.killed_by == "SIGXCPU" else f"{limits.timeout_s:g} s wall clock limit"
        head = f"[TIMEOUT] Code was killed after exceeding the {why}"
    elif result.status == "memory":
        head = f"[MEMORY] Code exceeded the {limits.memory_mb} MiB memory limit"
    elif result.status == "killed":
        head = f"[FAILED] Code was killed by {result.killed_by}"
    elif result.status == "sandbox_error":
        head = "[FAILED] The sandbox could not start the code"
    else:
        head = f"[FAILED] Code exited with status {result.exit_code}"
    parts = [head]
    budget = max_output_chars // 2 if result.stderr.strip() and result.stdout.strip() else max_output_chars
    if result.stdout.strip():
        parts.append(truncate_middle(result.stdout.rstrip("\n"), budget))
    if result.stderr.strip():
        parts.append("stderr:\n" + truncate_middle(result.stderr.rstrip("\n"), budget))
    return "\n".join(parts) + "\n"


class CodeTool:
    name = "code"

    def __init__(self, limits: SandboxLimits, max_output_chars: int = 1500):
        self.limits = limits
        self.max_output_chars = max_output_chars
        self.description = CODE_DESCRIPTION.format(timeout=limits.timeout_s, memory=limits.memory_mb)

    def run(self, argument: str) -> ToolResult:
        code = extract_python_block(argument)
        if code is None:
            return ToolResult("[FAILED] No ```python fenced block found inside <code>; write "
                              "<code>```python\\n...\\n```</code>.", "error")
        result = run_python(code, self.limits)
        return ToolResult(render_observation(result, self.limits, self.max_output_chars), result.status)
