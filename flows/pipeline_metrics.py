"""Headline metrics of a pipeline run, under names that stay the same from run to run, so that MLflow compares
two pipeline runs (tonight's retrain against last night's) on their parent runs alone.

    clock = StageClock(); ...; clock.lap("sft")          # seconds per stage, in the order they ran
    metrics = headline_metrics(sft, rl, report, clock.seconds)

Names (eval labels and set labels come from the recipe: `eval.models`, `eval.problem_sets`):
    eval.<model>.<set>.accuracy, eval.<model>.<set>.pass_at_<k>   e.g. eval.rl.heldout.accuracy
    eval.<model>.tokens_per_solved       tokens per problem solved, on problems the teacher solved too
    sft.final_loss, rl.reward_first, rl.reward_last
    seconds.<stage>, seconds.total       wall time of each stage in this run (a cached stage takes ~0 s)
A value a stage did not produce (no teacher in the evaluation, a report from before the field existed) is left
out rather than logged as NaN.
"""
from __future__ import annotations

import time

# Summary-row columns that become headline metrics, besides pass@k.
_EVAL_COLUMNS = ("accuracy",)


class StageClock:
    """Wall seconds per stage: `lap(name)` closes the stage that ran since the previous lap."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self.last, 1)
        self.last = now

    def total(self) -> float:
        return round(time.perf_counter() - self.start, 1)


def headline_metrics(sft: dict, rl: dict, report: dict, seconds: dict[str, float],
                     pretrain: dict | None = None) -> dict[str, float]:
    """The parent run's metrics from the stage outputs (manifests of pretraining when it ran, SFT and RL, the
    evaluate flow's result)."""
    metrics: dict[str, float | None] = {"sft.final_loss": sft["extra"].get("final_loss")}
    if pretrain is not None:
        metrics["pretrain.final_loss"] = pretrain["extra"].get("final_loss")
    history = rl["extra"].get("history") or [{}]
    metrics["rl.reward_first"] = rl["extra"].get("reward_first")
    metrics["rl.reward_last"] = rl["extra"].get("reward_last", history[-1].get("reward_mean"))
    for row in report["summary"]:
        prefix = f"eval.{row['model']}.{row['set']}"
        for column, value in row.items():
            if column in _EVAL_COLUMNS or column.startswith("pass@"):
                metrics[f"{prefix}.{column.replace('@', '_at_')}"] = value
    for row in report["efficiency"]:
        metrics[f"eval.{row['model']}.tokens_per_solved"] = row.get("tokens_per_solved")
    metrics.update({f"seconds.{stage}": value for stage, value in seconds.items()})
    return {name: float(value) for name, value in metrics.items() if value is not None}
