"""The pipeline flow end to end on the smallest recipe: every stage runs for real; after an injected failure
in the middle stage (SFT) a re-run resumes: completed stages come from their manifests and are not redone."""
from __future__ import annotations

import pytest

import tasks.distill
import tasks.train

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class InjectedFailure(RuntimeError):
    pass


def test_pipeline_resumes_after_failure_in_middle_stage(prefect_server, afm_home, smoke_config, monkeypatch):
    from flows.pipeline import pipeline_flow

    real_train_sft = tasks.train.train_sft
    calls = {"distill": 0}
    real_distill = tasks.distill.distill_dataset

    def counting_distill(cfg, out_dir):
        calls["distill"] += 1
        return real_distill(cfg, out_dir)

    def failing_sft(cfg):
        raise InjectedFailure("SFT worker died")

    monkeypatch.setattr(tasks.distill, "distill_dataset", counting_distill)
    monkeypatch.setattr(tasks.train, "train_sft", failing_sft)
    with pytest.raises(InjectedFailure):
        pipeline_flow(smoke_config)
    assert calls["distill"] == 1
    store = afm_home / "artifacts" / "stages"
    assert not [d for d in store.iterdir() if d.name.startswith("sft-")], "a failed stage must leave no artifact"

    monkeypatch.setattr(tasks.train, "train_sft", real_train_sft)
    summary = pipeline_flow(smoke_config)
    assert calls["distill"] == 1, "the completed distill stage was redone"
    assert summary["stages"] == {"distill": "cached", "sft": "ran", "rl": "ran", "eval": "ran"}
    assert summary["registered"]["sft"] == "models:/afm-sft/1"
    assert summary["promotion"]["alias"] == "champion"
    for stage in ("distill", "policy", "sft", "rl", "eval"):
        done = [d for d in store.iterdir() if d.name.startswith(f"{stage}-")]
        assert len(done) == 1 and (done[0] / "manifest.json").is_file(), stage

    again = pipeline_flow(smoke_config)
    assert set(again["stages"].values()) == {"cached"}
