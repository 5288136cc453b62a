"""Typed configs: YAML + dotted overrides; errors name the file and the field."""
from __future__ import annotations

import pytest
from pydantic import Field

from afm.config import Config, ConfigError, load_config, parse_overrides


class Inner(Config):
    lr: float = Field(1e-3, description="learning rate")


class Outer(Config):
    name: str = Field("x", description="run name")
    inner: Inner = Field(default_factory=Inner, description="nested")
    tags: list[str] = Field(default_factory=list, description="tags")


def test_yaml_and_overrides_merge(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: base\ninner:\n  lr: 0.5\n")
    cfg = load_config(Outer, path, ["inner.lr=2e-4", "tags=[a, b]"])
    assert cfg.name == "base" and cfg.inner.lr == 2e-4 and cfg.tags == ["a", "b"]


def test_override_values_are_yaml_scalars():
    assert parse_overrides(["a.b=3", "c=true", "d=text", "e="]) == {"a": {"b": 3}, "c": True, "d": "text", "e": ""}


def test_bad_type_names_file_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("inner:\n  lr: fast\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: field 'inner\.lr'"):
        load_config(Outer, path)


def test_unknown_field_is_an_error(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("inner:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"typo\.yaml: field 'inner\.learning_rate': Extra inputs"):
        load_config(Outer, path)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(Outer, tmp_path / "nope.yaml")
    path = tmp_path / "broken.yaml"
    path.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(Outer, path)
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(Outer, None, ["novalue"])


def test_shipped_recipes_validate():
    from flows.pipeline import PipelineConfig

    for recipe in ("configs/default.yaml", "configs/quality.yaml", "configs/qwen7b-cluster.yaml"):
        cfg = load_config(PipelineConfig, recipe)
        assert cfg.eval.problem_sets, recipe


def test_stage_command_reads_its_section_of_a_pipeline_recipe(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text("inner:\n  lr: 0.5\nsft:\n  lr: 1.0\nnmae: typo\n")
    with pytest.raises(ConfigError, match=r"field 'nmae': Extra inputs"):   # unknown keys still fail
        load_config(Outer, path, other_sections=("sft",))
    path.write_text("inner:\n  lr: 0.5\nsft:\n  lr: 1.0\n")
    assert load_config(Outer, path, other_sections=("sft",)).inner.lr == 0.5


def test_every_stage_command_accepts_the_shipped_pipeline_recipes():
    from cli.app import PIPELINE_SECTIONS
    from flows.distill import DistillFlowConfig
    from flows.evaluate import EvalFlowConfig
    from flows.rl import RLFlowConfig
    from flows.sft import SFTFlowConfig

    for recipe in ("configs/default.yaml", "configs/quality.yaml"):
        assert load_config(DistillFlowConfig, recipe, other_sections=PIPELINE_SECTIONS).distill.n_worlds > 0
        for cls in (SFTFlowConfig, RLFlowConfig, EvalFlowConfig):
            load_config(cls, recipe, other_sections=PIPELINE_SECTIONS)
