"""Promotion gate: better, worse, tie, no champion (pure) and the alias + records in a real sqlite registry."""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from evaluation.promotion import CHALLENGER, CHAMPION, apply_promotion, current_champion_version, decide_promotion


def test_no_champion_yet_promotes():
    d = decide_promotion(0.1, None, margin=0.05)
    assert d.alias == CHAMPION and d.champion_score is None


def test_better_by_margin_promotes():
    assert decide_promotion(0.60, 0.50, margin=0.05).alias == CHAMPION
    assert decide_promotion(0.3, 0.1, margin=0.2).alias == CHAMPION       # exactly the margin (float error absorbed)


def test_better_by_less_than_margin_is_challenger():
    d = decide_promotion(0.52, 0.50, margin=0.05)
    assert d.alias == CHALLENGER and "less than the margin" in d.reason


def test_worse_is_challenger():
    d = decide_promotion(0.40, 0.50, margin=0.0)
    assert d.alias == CHALLENGER and "worse" in d.reason


def test_tie_is_challenger_even_at_zero_margin():
    d = decide_promotion(0.5, 0.5, margin=0.0)
    assert d.alias == CHALLENGER and d.reason == "ties the champion"


def test_negative_margin_rejected():
    with pytest.raises(ValueError, match="margin"):
        decide_promotion(0.5, 0.4, margin=-0.1)


def test_apply_promotion_in_sqlite_registry(local_registry):
    v1 = local_registry("afm-test", {"afm.stage": "sft"})
    assert current_champion_version("afm-test") is None
    apply_promotion("afm-test", v1, decide_promotion(0.4, None, 0.02), gate_set="multihop", champion_version=None)
    assert current_champion_version("afm-test") == v1

    v2 = local_registry("afm-test", {"afm.stage": "rl"})
    apply_promotion("afm-test", v2, decide_promotion(0.41, 0.4, 0.02), gate_set="multihop", champion_version=v1)
    client = MlflowClient()
    assert current_champion_version("afm-test") == v1
    assert str(client.get_model_version_by_alias("afm-test", CHALLENGER).version) == v2
    tags = client.get_model_version("afm-test", v2).tags
    assert tags["afm.promotion.decision"] == CHALLENGER
    assert float(tags["afm.promotion.candidate_score"]) == pytest.approx(0.41)
    assert float(tags["afm.promotion.champion_score"]) == pytest.approx(0.4)
    assert tags["afm.promotion.champion_version"] == v1 and tags["afm.promotion.gate_set"] == "multihop"

    v3 = local_registry("afm-test", {"afm.stage": "rl"})
    apply_promotion("afm-test", v3, decide_promotion(0.5, 0.4, 0.02), gate_set="multihop", champion_version=v1)
    assert current_champion_version("afm-test") == v3


def test_apply_promotion_logs_run_params_and_metrics(local_registry):
    import mlflow

    from afm import tracking

    v1 = local_registry("afm-run", {})
    with tracking.start_run("eval-test", "gate", params={}) as run:
        apply_promotion("afm-run", v1, decide_promotion(0.3, None, 0.0), gate_set="computation", champion_version=None)
    data = mlflow.get_run(run.info.run_id).data
    assert data.params["promotion.decision"] == CHAMPION
    assert data.params["promotion.champion_version"] == "none"
    assert data.metrics["promotion.candidate_score"] == pytest.approx(0.3)
