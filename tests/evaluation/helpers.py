"""Builders for evaluation tests: EvalRecords with just the fields a test cares about."""
from __future__ import annotations

from evaluation.metrics import failure_category
from evaluation.records import EvalRecord


def make_record(model: str, pid: str, correct: bool, sample: int = 0, prediction: str = "x", tokens: int = 0,
                tool_calls: int = 0, status: str = "answered", problem_set: str = "multihop") -> EvalRecord:
    return EvalRecord(
        model=model, problem_set=problem_set, problem_id=pid, question=f"q {pid}", golden=["x"],
        prediction=prediction, judge={"correct": correct, "rationale": ""}, em=float(correct), f1=float(correct),
        steps=1, tokens=tokens, tool_calls=tool_calls, status=status, failure=failure_category(status, correct),
        sample=sample,
    )
