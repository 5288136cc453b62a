"""Efficiency of a trained model against the teacher MAS: tokens and tool calls per SOLVED problem, and the
reduction in percent (the paper reports -84.6% tokens for AFM against multi-agent / TIR baselines).

What is counted (the same rule for both sides: every token a model had to read or write):
  * teacher MAS: for every LLM call of every agent, its prompt tokens + completion tokens (each agent re-reads
    its own prompt, so the sum is what the system really processed; `teacher_episode_cost` reads MASLog events);
  * trained model: the tokens of its one episode sequence, prompt + generated + observation tokens (one pass
    with a KV cache processes each once).
Tool calls are the calls actually made to tools.

Comparison set: only problems BOTH sides solved (an unsolved problem has no cost "per solved problem", and
comparing on different problems would reward a model for solving only easy ones). On each solved problem
the cost is the mean over that side's correct samples.

Usage:
    cmp = compare_efficiency(model_records, teacher_records)
    cmp.token_reduction_pct       # e.g. -84.6 means the model spends 84.6% fewer tokens
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from evaluation.metrics import group_by_problem, mean
from evaluation.records import EvalRecord


@dataclass
class SolvedCost:
    """Mean cost of the correct samples of one problem."""

    tokens: float
    tool_calls: float


def solved_costs(records: Sequence[EvalRecord]) -> dict[tuple[str, str], SolvedCost]:
    """{(problem set, problem id): cost} over problems with at least one correct sample (records of ONE model)."""
    out: dict[tuple[str, str], SolvedCost] = {}
    for outcome in group_by_problem(records):
        correct = [r for r in outcome.records if r.correct]
        if correct:
            out[(outcome.problem_set, outcome.problem_id)] = SolvedCost(
                tokens=mean([r.tokens for r in correct]), tool_calls=mean([r.tool_calls for r in correct]))
    return out


def reduction_pct(model_value: float, teacher_value: float) -> float | None:
    """(model - teacher) / teacher in percent; negative = the model spends less. None when the teacher spent
    nothing (no commonly solved problem, or a teacher without tool calls): there is nothing to reduce."""
    return 100.0 * (model_value - teacher_value) / teacher_value if teacher_value else None


@dataclass
class EfficiencyComparison:
    model: str
    common_solved: int               # problems both the model and the teacher solved
    model_tokens_per_solved: float
    teacher_tokens_per_solved: float
    model_tool_calls_per_solved: float
    teacher_tool_calls_per_solved: float

    @property
    def token_reduction_pct(self) -> float | None:
        return reduction_pct(self.model_tokens_per_solved, self.teacher_tokens_per_solved)

    @property
    def tool_call_reduction_pct(self) -> float | None:
        return reduction_pct(self.model_tool_calls_per_solved, self.teacher_tool_calls_per_solved)

    def to_row(self) -> dict:
        """Rounded values for tables; cost and reduction fields are None without a commonly solved problem."""
        if not self.common_solved:
            return {"model": self.model, "common_solved": 0, **{key: None for key in (
                "tokens_per_solved", "teacher_tokens_per_solved", "token_reduction_pct", "tool_calls_per_solved",
                "teacher_tool_calls_per_solved", "tool_call_reduction_pct")}}
        rounded = lambda value, digits: None if value is None else round(value, digits)  # noqa: E731
        return {
            "model": self.model, "common_solved": self.common_solved,
            "tokens_per_solved": round(self.model_tokens_per_solved, 1),
            "teacher_tokens_per_solved": round(self.teacher_tokens_per_solved, 1),
            "token_reduction_pct": rounded(self.token_reduction_pct, 1),
            "tool_calls_per_solved": round(self.model_tool_calls_per_solved, 2),
            "teacher_tool_calls_per_solved": round(self.teacher_tool_calls_per_solved, 2),
            "tool_call_reduction_pct": rounded(self.tool_call_reduction_pct, 1),
        }


def compare_efficiency(model_records: Sequence[EvalRecord], teacher_records: Sequence[EvalRecord]
                       ) -> EfficiencyComparison:
    """Tokens and tool calls per problem solved by both, model vs teacher (records of one model each)."""
    models = {r.model for r in model_records}
    if len(models) != 1:
        raise ValueError(f"compare_efficiency: model_records must hold one model, got {sorted(models)}")
    model_costs, teacher_costs = solved_costs(model_records), solved_costs(teacher_records)
    common = sorted(model_costs.keys() & teacher_costs.keys())
    return EfficiencyComparison(
        model=models.pop(), common_solved=len(common),
        model_tokens_per_solved=mean([model_costs[p].tokens for p in common]),
        teacher_tokens_per_solved=mean([teacher_costs[p].tokens for p in common]),
        model_tool_calls_per_solved=mean([model_costs[p].tool_calls for p in common]),
        teacher_tool_calls_per_solved=mean([teacher_costs[p].tool_calls for p in common]),
    )
