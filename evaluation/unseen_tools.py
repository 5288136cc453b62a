"""Generalization to a tool the model never saw in training: a `calculator`, described only in the prompt.

How the unseen tool is invoked (and why): the CoA tag set (`models.format.TAGS`) is fixed and a trained
model's tokenizer has one token per known tag, so a brand-new tag would be text the model has never produced
and the rollout's stop list would not recognize. The paper's zero-shot claim is about a tool's *interface*
being new, so we keep the transport the model knows, `<code>`, and make the new tool a Python function that
exists ONLY in this evaluation: every code run gets `CALCULATOR_PRELUDE` prepended, which defines
`calculator(expression: str) -> str` (arithmetic over numbers, + - * / // % **, parentheses, and
abs/round/min/max/pow/sqrt). The system prompt describes it (`CALCULATOR_DESCRIPTION`). A model uses the tool
when it writes e.g. <code>```python\nprint(calculator("3 * (4 + 5)"))\n```</code>.

Reported per model (on the configured problem sets, n samples each):
  * first_try_format_ok: share of episodes whose FIRST tool call is a `<code>` block that parses, calls
    `calculator(...)` and runs without error — the "used the new tool correctly on the first attempt" rate;
  * calculator_use_rate: share of episodes that call `calculator` at all;
  * accuracy (same grading as the main evaluation).
Line numbers in tracebacks shift by the prelude's length; the prelude itself prints nothing.
The calculator evaluates an AST of literals and whitelisted operators/functions only; it is NOT a security
boundary (the sandbox around every code run is).

Usage:
    rows = evaluate_unseen_tool(cfg)     # cfg: evaluation.runner.EvalConfig (teacher and gate are ignored)
"""
from __future__ import annotations

import ast
import json
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

from afm import tracking
from agents.tools.base import ToolResult
from agents.tools.code import extract_python_block
from agents.tools.sandbox import SandboxLimits
from agents.tools.toolbox import ToolBox, build_toolbox
from evaluation.grading import episode_to_record
from evaluation.metrics import accuracy, mean
from evaluation.records import write_records
from evaluation.runner import (
    EvalConfig, build_judge, load_problem_set, metric_name, rollout_config, write_text_atomic,
)
from models.engines.hf import HFEngine
from models.policy import load_policy
from training.rl_rollout import Episode, run_rollouts

CALCULATOR_NAME = "calculator"

CALCULATOR_PRELUDE = '''\
import ast as _ast, math as _math, operator as _op
_CALC_BIN = {_ast.Add: _op.add, _ast.Sub: _op.sub, _ast.Mult: _op.mul, _ast.Div: _op.truediv,
             _ast.FloorDiv: _op.floordiv, _ast.Mod: _op.mod, _ast.Pow: pow}
_CALC_FUN = {"abs": abs, "round": round, "min": min, "max": max, "pow": pow, "sqrt": _math.sqrt}
def _calc_eval(node):
    if isinstance(node, _ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, _ast.BinOp) and type(node.op) in _CALC_BIN:
        return _CALC_BIN[type(node.op)](_calc_eval(node.left), _calc_eval(node.right))
    if isinstance(node, _ast.UnaryOp) and isinstance(node.op, (_ast.USub, _ast.UAdd)):
        value = _calc_eval(node.operand)
        return -value if isinstance(node.op, _ast.USub) else value
    if (isinstance(node, _ast.Call) and isinstance(node.func, _ast.Name) and node.func.id in _CALC_FUN
            and not node.keywords):
        return _CALC_FUN[node.func.id](*[_calc_eval(arg) for arg in node.args])
    raise ValueError("calculator: only numbers, + - * / // % **, parentheses and abs/round/min/max/pow/sqrt")
def calculator(expression):
    """Evaluate an arithmetic expression given as a string; returns the result as a string."""
    return str(_calc_eval(_ast.parse(str(expression), mode="eval").body))
'''

CALCULATOR_DESCRIPTION = (
    "calculator: a Python function available inside every <code> block. calculator(expression: str) -> str "
    "evaluates arithmetic (numbers, + - * / // % **, parentheses, abs, round, min, max, pow, sqrt) and returns "
    'the result as a string. Use it like <code>```python\\nprint(calculator("3 * (4 + 5)"))\\n```</code>.'
)


def unseen_tool_system_prompt(system_prompt: str | None) -> str:
    """The training system prompt (if any) plus the calculator's description."""
    intro = "You also have a new tool:\n- " + CALCULATOR_DESCRIPTION
    return f"{system_prompt}\n\n{intro}" if system_prompt else intro


class CalculatorToolBox:
    """A ToolBox whose `code` runs see `calculator` defined (the prelude is prepended inside the fenced block);
    every other tag goes to the wrapped toolbox unchanged."""

    def __init__(self, toolbox: ToolBox):
        self.toolbox = toolbox

    def call(self, tag: str, argument: str) -> ToolResult:
        code = extract_python_block(argument) if tag == "code" else None
        if code is None:  # other tools, or a malformed block the code tool reports itself
            return self.toolbox.call(tag, argument)
        return self.toolbox.call(tag, f"```python\n{CALCULATOR_PRELUDE}\n{code}```")


def calls_calculator(code: str) -> bool:
    """Does `code` parse and contain a call `calculator(...)`?"""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == CALCULATOR_NAME
               for node in ast.walk(tree))


def first_call_format_ok(ep: Episode) -> bool:
    """The episode's first tool call is a `<code>` that parses, calls the calculator and runs successfully."""
    if not ep.tool_calls:
        return False
    first = ep.tool_calls[0]
    code = extract_python_block(first.argument) if first.tag == "code" else None
    return code is not None and calls_calculator(code) and first.status == "ok"


def used_calculator(ep: Episode) -> bool:
    return any(call.tag == "code" and calls_calculator(extract_python_block(call.argument) or "")
               for call in ep.tool_calls)


def unseen_tool_row(model: str, problem_set: str, episodes: list[Episode], records) -> dict:
    return {
        "model": model, "set": problem_set, "episodes": len(episodes),
        "first_try_format_ok": round(mean([float(first_call_format_ok(ep)) for ep in episodes]), 4),
        "calculator_use_rate": round(mean([float(used_calculator(ep)) for ep in episodes]), 4),
        "accuracy": round(accuracy(records), 4),
    }


def evaluate_unseen_tool(cfg: EvalConfig) -> list[dict]:
    """Every model of `cfg` on every problem set with the calculator described and available; returns one row
    per (model, set), writes `unseen_tool.jsonl` + `unseen_tool.json` under `cfg.output_dir`, logs to MLflow."""
    if "code" not in cfg.toolbox.tools:
        raise ValueError("EvalConfig: the unseen-tool evaluation needs 'code' in toolbox.tools (the calculator "
                         "is called from code)")
    out_dir = Path(cfg.output_dir)
    problem_sets = {label: load_problem_set(ps) for label, ps in cfg.problem_sets.items()}
    toolbox = CalculatorToolBox(build_toolbox(cfg.toolbox))
    judge = build_judge(cfg)
    limits = SandboxLimits(timeout_s=cfg.test_timeout_s, cpu_s=int(cfg.test_timeout_s) + 1)
    rollout = rollout_config(cfg).model_copy(update={"system_prompt": unseen_tool_system_prompt(cfg.system_prompt)})
    rows, all_records = [], []
    with tracking.start_run(cfg.mlflow_experiment, f"{cfg.run_name}-unseen-tool",
                            params={"tool": CALCULATOR_NAME, **cfg.model_dump(mode="json")}), \
            tempfile.TemporaryDirectory(prefix="afm-unseen-") as tmp:
        for label, uri in cfg.models.items():
            # In process (not on the rollout pool): the calculator lives in this toolbox wrapper, not in a tool
            # actor's; this evaluation is a few hundred episodes.
            device = "cuda" if cfg.pool.use_gpu else "cpu"
            model, tokenizer = load_policy(tracking.resolve_model_uri(uri, Path(tmp) / label), device=device)
            model.eval()
            engine = HFEngine(model, tokenizer)
            for set_label, problems in problem_sets.items():
                episodes = []
                for start in tqdm(range(0, len(problems), cfg.problems_per_batch), desc=f"unseen-tool {label}"):
                    with torch.no_grad():
                        episodes += run_rollouts(engine, tokenizer, toolbox,
                                                 problems[start:start + cfg.problems_per_batch], rollout,
                                                 seed=cfg.seed * 7919 + start)
                records = [episode_to_record(ep, label, set_label, judge, limits) for ep in episodes]
                all_records += records
                row = unseen_tool_row(label, set_label, episodes, records)
                rows.append(row)
                tracking.log_metrics({metric_name(label, set_label, "unseen_tool", key): value
                                      for key, value in row.items() if key not in ("model", "set")}, step=0)
        write_records(out_dir / "unseen_tool.jsonl", all_records)
        write_text_atomic(out_dir / "unseen_tool.json", json.dumps(rows, indent=2))
        tracking.log_table_rows(rows, "unseen_tool.json")
    return rows
