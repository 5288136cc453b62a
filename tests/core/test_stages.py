"""Stage bookkeeping: keys follow config, inputs and the stage's code; a stage with a manifest is skipped; a
failed stage leaves no manifest; only named transient errors are retried."""
from __future__ import annotations

import pytest
from pydantic import Field

from afm.config import Config
from tasks import stages
from tasks.stages import TRANSIENT_ERRORS, completed_stage, retry_on_transient, run_stage, stage_key


class StageCfg(Config):
    n: int = Field(1, description="a knob")


def test_stage_key_changes_with_config_and_inputs():
    base = stage_key("sft", StageCfg())
    assert base == stage_key("sft", StageCfg())
    assert base != stage_key("sft", StageCfg(n=2))
    assert base != stage_key("sft", StageCfg(), {"dataset": "abc"})
    assert base != stage_key("rl", StageCfg())


def test_stage_key_follows_the_code_the_stage_runs(tmp_path, monkeypatch):
    """A source tree of its own: sft runs `training`, which imports `models`; `distill` is unrelated."""
    for package, body in {"afm": "", "training": "from models import net\n", "models": "", "distill": "",
                          "tests": ""}.items():
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(body)
    (tmp_path / "models" / "net.py").write_text("LAYERS = 2\n")
    monkeypatch.setattr(stages, "SOURCE_ROOT", tmp_path)

    def keys() -> dict[str, str]:
        stages.code_packages.cache_clear()
        stages.code_digest.cache_clear()
        return {stage: stage_key(stage, StageCfg()) for stage in ("sft", "distill")}

    assert stages.code_packages("sft", tmp_path) == ("afm", "models", "training")
    before = keys()
    assert keys() == before  # unchanged code, same keys
    (tmp_path / "models" / "net.py").write_text("LAYERS = 3\n")  # code sft imports
    after_models = keys()
    assert after_models["sft"] != before["sft"]
    assert after_models["distill"] == before["distill"]
    (tmp_path / "afm" / "__init__.py").write_text("# core\n")  # the platform core: every stage
    after_core = keys()
    assert after_core["sft"] != after_models["sft"] and after_core["distill"] != after_models["distill"]
    (tmp_path / "tests" / "__init__.py").write_text("# tests are not stage code\n")
    assert keys() == after_core


def test_run_stage_skips_completed_and_keeps_failures_invisible(tmp_path, monkeypatch):
    monkeypatch.setenv("AFM_HOME", str(tmp_path / "home"))
    store = str(tmp_path / "store")
    calls = []

    def produce(work_dir):
        calls.append(work_dir)
        out = work_dir / "data.jsonl"
        out.write_text('{"a": 1}\n')
        return {"data.jsonl": out}, {"rows": 1}

    def crash(work_dir):
        (work_dir / "half.jsonl").write_text("partial")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        run_stage("toy", "k1", store, crash, kind="dataset")
    from afm.storage import open_store

    assert completed_stage(open_store(store), "toy", "k1") is None
    first = run_stage("toy", "k1", store, produce, kind="dataset")
    second = run_stage("toy", "k1", store, produce, kind="dataset")
    assert (first["cached"], second["cached"]) == (False, True)
    assert len(calls) == 1
    assert second["files"]["data.jsonl"]["lines"] == 1 and second["extra"] == {"rows": 1}


class _State:
    def __init__(self, exc):
        self.exc = exc

    def result(self):
        raise self.exc


def test_retry_only_on_transient_errors():
    assert ConnectionError in TRANSIENT_ERRORS
    assert retry_on_transient(None, None, _State(ConnectionError("reset"))) is True
    assert retry_on_transient(None, None, _State(TimeoutError())) is True
    assert retry_on_transient(None, None, _State(ValueError("bad config"))) is False
