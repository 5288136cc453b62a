"""CodeTool: fenced-block extraction and AFM status lines over the real sandbox."""
from __future__ import annotations

from agents.tools.code import CodeTool, extract_python_block
from agents.tools.sandbox import SandboxLimits

LIMITS = SandboxLimits(timeout_s=3, cpu_s=3, memory_mb=512)


def fenced(code: str) -> str:
    return f"Let me compute.\n```python\n{code}\n```\n"


def test_extracts_first_python_block():
    assert extract_python_block("```py\nx = 1\n```") == "x = 1\n"
    assert extract_python_block(fenced("print(1)") + "```python\nprint(2)\n```") == "print(1)\n"
    assert extract_python_block("print(1)") is None


def test_success_failure_and_missing_block():
    tool = CodeTool(LIMITS, max_output_chars=300)
    ok = tool.run(fenced("print(sum(range(10)))"))
    assert ok.status == "ok" and ok.text == "[RESULT:SUCCESS]\n45\n"
    failed = tool.run(fenced("raise ValueError('bad input')"))
    assert failed.status == "error"
    assert failed.text.startswith("[FAILED] Code exited with status 1") and "ValueError: bad input" in failed.text
    missing = tool.run("print(1)")
    assert missing.status == "error" and "```python" in missing.text


def test_timeout_memory_and_long_output_lines():
    tool = CodeTool(SandboxLimits(timeout_s=1, cpu_s=5, memory_mb=256), max_output_chars=300)
    timeout = tool.run(fenced("import time\ntime.sleep(30)"))
    assert timeout.status == "timeout" and timeout.text.startswith("[TIMEOUT]")
    memory = tool.run(fenced("x = bytearray(1024 * 1024 * 1024)"))
    assert memory.status == "memory" and memory.text.startswith("[MEMORY]")
    long = tool.run(fenced("print('A' * 50 + 'x' * 100000 + 'Z' * 50)"))
    assert long.status == "ok" and len(long.text) < 400
    assert "AAAA" in long.text and "ZZZZ" in long.text and "truncated" in long.text


def test_concurrent_runs_from_threads_are_independent():
    from concurrent.futures import ThreadPoolExecutor

    tool = CodeTool(LIMITS)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(tool.run, [fenced(f"print({i} * 11)") for i in range(4)]))
    assert [r.text for r in results] == [f"[RESULT:SUCCESS]\n{i * 11}\n" for i in range(4)]
