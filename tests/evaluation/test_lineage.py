"""Lineage walk RL -> SFT -> base over a real sqlite MLflow registry, and its text form."""
from __future__ import annotations

import pytest

from afm import tracking
from afm.lineage import LineageError, format_lineage, lineage, lineage_tags, normalize_model_uri, parse_model_uri


def test_parse_model_uri():
    assert parse_model_uri("models:/afm@champion") == ("afm", "champion", None)
    assert parse_model_uri("models:/afm/3") == ("afm", None, "3")
    assert normalize_model_uri("afm@champion") == "models:/afm@champion"
    assert normalize_model_uri("/tmp/model") == "/tmp/model"
    with pytest.raises(LineageError, match="not a registry model URI"):
        parse_model_uri("/tmp/model")


def test_lineage_walks_rl_sft_base(local_registry):
    sft = local_registry("afm-lin", lineage_tags("sft", "run-sft", "/models/tiny-base", "",
                                                 "s3://afm/datasets/coa-v1", "a" * 64))
    rl = local_registry("afm-lin", lineage_tags("rl", "run-rl", f"models:/afm-lin/{sft}", "run-sft",
                                                "s3://afm/datasets/rlq-v1", "b" * 64))
    tracking.set_alias("afm-lin", "champion", rl)
    chain = lineage("afm-lin@champion")       # registry shorthand for models:/afm-lin@champion
    assert [s["kind"] for s in chain] == ["model_version", "model_version", "base"]
    assert chain[0]["version"] == rl and chain[0]["stage"] == "rl" and chain[0]["aliases"] == ["champion"]
    assert chain[0]["parent_run_id"] == "run-sft" and chain[0]["dataset_sha256"] == "b" * 64
    assert chain[1]["version"] == sft and chain[1]["dataset_uri"] == "s3://afm/datasets/coa-v1"
    assert chain[2]["model"] == "/models/tiny-base"
    text = format_lineage(chain)
    assert f"models:/afm-lin/{rl} @champion [rl] run run-rl" in text
    assert "<- " in text and "base model /models/tiny-base" in text and "aaaaaaaaaaaa" in text


def test_lineage_detects_loops(local_registry):
    v1 = local_registry("afm-loop", {})
    import mlflow

    mlflow.tracking.MlflowClient().set_model_version_tag("afm-loop", v1, "afm.parent_model", f"models:/afm-loop/{v1}")
    with pytest.raises(LineageError, match="loops"):
        lineage(f"models:/afm-loop/{v1}")
