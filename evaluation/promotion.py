"""Promotion gate: a candidate model version becomes `champion` only if it beats the current champion on the
gate problem set by a margin; otherwise it becomes `challenger`.

Rules (`decide_promotion`, pure):
  * no champion yet                               -> champion
  * candidate - champion >= margin AND candidate > champion -> champion (a tie never promotes, even at margin 0)
  * anything else (worse, tie, better by less than the margin) -> challenger
Both scores must come from the SAME evaluation (same gate problems, samples and judge): the runner evaluates
the current champion next to the candidate rather than trusting a score recorded months ago.

`apply_promotion` writes the decision to the MLflow registry: it sets the alias, and records decision, both
scores, margin and gate set as tags of the candidate version (`afm.promotion.*`) and, when a run is active, as
run params/metrics. It does not demote anything else: the previous champion simply loses the alias.

Usage:
    decision = decide_promotion(candidate_score=0.62, champion_score=0.55, margin=0.02)
    apply_promotion("afm-tiny", "7", decision, gate_set="multihop", champion_version="5")
"""
from __future__ import annotations

from dataclasses import dataclass

import mlflow
from mlflow.tracking import MlflowClient

from afm import tracking

CHAMPION = "champion"
CHALLENGER = "challenger"
# Scores are accuracies (ratios of counts); this absorbs float error in `candidate - champion >= margin`
# (0.3 - 0.1 = 0.19999999999999998) without letting a real shortfall through.
_SCORE_EPS = 1e-9


@dataclass(frozen=True)
class PromotionDecision:
    alias: str                      # CHAMPION or CHALLENGER
    reason: str
    candidate_score: float
    champion_score: float | None    # None: there was no champion
    margin: float


def decide_promotion(candidate_score: float, champion_score: float | None, margin: float) -> PromotionDecision:
    """Pure gate decision; see the module docstring for the rules."""
    if margin < 0:
        raise ValueError(f"promotion margin must be >= 0, got {margin}")
    if champion_score is None:
        return PromotionDecision(CHAMPION, "no champion yet", candidate_score, None, margin)
    gain = candidate_score - champion_score
    if gain > _SCORE_EPS and gain + _SCORE_EPS >= margin:
        reason = f"beats champion by {gain:+.4f} (margin {margin})"
        return PromotionDecision(CHAMPION, reason, candidate_score, champion_score, margin)
    if abs(gain) <= _SCORE_EPS:
        reason = "ties the champion"
    elif gain < 0:
        reason = f"worse than champion by {gain:+.4f}"
    else:
        reason = f"better by {gain:+.4f}, less than the margin {margin}"
    return PromotionDecision(CHALLENGER, reason, candidate_score, champion_score, margin)


def current_champion_version(model_name: str) -> str | None:
    """The version `models:/<name>@champion` points at, or None when the model or the alias does not exist."""
    tracking.configure_tracking()
    client = MlflowClient()
    try:
        return str(client.get_model_version_by_alias(model_name, CHAMPION).version)
    except mlflow.exceptions.MlflowException:
        return None


def apply_promotion(model_name: str, version: str, decision: PromotionDecision, gate_set: str,
                    champion_version: str | None) -> None:
    """Set the decided alias on `model_name` version `version` and record the decision (tags + run data)."""
    tracking.configure_tracking()
    client = MlflowClient()
    tags = {
        "afm.promotion.decision": decision.alias,
        "afm.promotion.reason": decision.reason,
        "afm.promotion.gate_set": gate_set,
        "afm.promotion.candidate_score": f"{decision.candidate_score:.6f}",
        "afm.promotion.champion_score": "" if decision.champion_score is None else f"{decision.champion_score:.6f}",
        "afm.promotion.champion_version": champion_version or "",
        "afm.promotion.margin": str(decision.margin),
    }
    for key, value in tags.items():
        client.set_model_version_tag(model_name, str(version), key, value)
    client.set_registered_model_alias(model_name, decision.alias, str(version))
    if mlflow.active_run() is not None:
        mlflow.log_params({"promotion.model": f"{model_name}/{version}", "promotion.decision": decision.alias,
                           "promotion.gate_set": gate_set, "promotion.margin": decision.margin,
                           "promotion.champion_version": champion_version or "none"})
        metrics = {"promotion.candidate_score": decision.candidate_score}
        if decision.champion_score is not None:
            metrics["promotion.champion_score"] = decision.champion_score
        mlflow.log_metrics(metrics)
