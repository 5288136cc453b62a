"""The unseen calculator tool: its prelude in the real sandbox, the wrapped toolbox, first-try format checks."""
from __future__ import annotations

from agents.tools.toolbox import ToolboxConfig, build_toolbox
from evaluation.unseen_tools import (
    CalculatorToolBox, calls_calculator, first_call_format_ok, unseen_tool_system_prompt, used_calculator,
)
from problems.records import Problem
from training.rl_rollout import Episode, ToolCall


def code_arg(body: str) -> str:
    return f"```python\n{body}\n```"


def test_calculator_runs_in_sandbox_through_wrapped_code_tool(tmp_path):
    toolbox = CalculatorToolBox(build_toolbox(ToolboxConfig(tools=["code"], code_timeout_s=10)))
    ok = toolbox.call("code", code_arg('print(calculator("3 * (4 + 5) - 2 ** 3"))\nprint(calculator("sqrt(16)"))'))
    assert ok.status == "ok" and "19\n4.0" in ok.text
    refused = toolbox.call("code", code_arg('print(calculator("__import__(\'os\').getcwd()"))'))
    assert refused.status == "error" and "calculator: only numbers" in refused.text
    # Without the wrapper the function does not exist: the tool really is unseen outside this evaluation.
    plain_toolbox = build_toolbox(ToolboxConfig(tools=["code"], code_timeout_s=10))
    plain = plain_toolbox.call("code", code_arg('print(calculator("1"))'))
    assert plain.status == "error" and "NameError" in plain.text


def test_calls_calculator_parses_code():
    assert calls_calculator('x = calculator("1+1")\nprint(x)')
    assert not calls_calculator("print(1 + 1)")
    assert not calls_calculator('print(calculator("1"')   # does not parse


def _episode(calls: list[ToolCall]) -> Episode:
    problem = Problem(id="p", question="q", answers=["2"], family="computation")
    return Episode(problem=problem, prompt_index=0, sample_index=0, prompt_ids=[1], tool_calls=calls)


def test_first_call_format_ok():
    good = ToolCall("code", code_arg('print(calculator("1+1"))'), "ok", 0.1)
    failed = ToolCall("code", code_arg('print(calculator("1+"))'), "error", 0.1)
    plain = ToolCall("code", code_arg("print(1+1)"), "ok", 0.1)
    assert first_call_format_ok(_episode([good]))
    assert not first_call_format_ok(_episode([failed, good]))     # only the FIRST attempt counts
    assert not first_call_format_ok(_episode([plain]))
    assert not first_call_format_ok(_episode([]))
    assert used_calculator(_episode([plain, good])) and not used_calculator(_episode([plain]))


def test_system_prompt_keeps_training_prompt_and_adds_description():
    prompt = unseen_tool_system_prompt("You are AFM.")
    assert prompt.startswith("You are AFM.\n\n") and "calculator(expression: str)" in prompt
