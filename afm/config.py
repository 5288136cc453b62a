"""Typed configs: one pydantic model per component, loaded from YAML recipes in `configs/` with CLI overrides.

Usage:
    cfg = load_config(SFTConfig, "configs/sft.yaml", overrides=["lr=3e-4", "model.hidden_size=128"])

A bad file or field raises `ConfigError` whose message names the file and the field, e.g.
`configs/sft.yaml: field 'lr': Input should be a valid number`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

T = TypeVar("T", bound=BaseModel)


class ConfigError(ValueError):
    """A config file or override that does not validate; the message names file and field."""


class Config(BaseModel):
    """Base for every component config: unknown fields are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override '{dotted}': '{key}' is not a section")
    node[keys[-1]] = value


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """`["a.b=3", "name=x"]` -> nested dict; values parsed as YAML scalars (3 -> int, true -> bool)."""
    data: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}': expected key=value")
        key, raw = item.split("=", 1)
        _set_dotted(data, key.strip(), yaml.safe_load(raw) if raw != "" else "")
    return data


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of fields, got {type(data).__name__}")
    return data


def validate_config(cls: type[T], data: dict[str, Any], source: str) -> T:
    """Validate `data` as `cls`; errors name `source` (a file, 'overrides' or 'flow parameters') and the field."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "<root>"
            lines.append(f"{source}: field '{field}': {err['msg']}")
        raise ConfigError("\n".join(lines)) from None


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
    other_sections: tuple[str, ...] = (),
) -> T:
    """Read YAML `path` (optional), apply `key=value` overrides, validate as `cls`.

    Top-level keys named in `other_sections` that `cls` has no field for are dropped from the file: a stage
    command (`afm distill`) then reads its own sections from a whole-pipeline recipe. Any other unknown key is
    still an error.
    """
    data = read_yaml(path) if path else {}
    data = {k: v for k, v in data.items() if k in cls.model_fields or k not in other_sections}
    if overrides:
        data = _merge(data, parse_overrides(overrides))
    source = str(path) if path else "overrides"
    if path and overrides:
        source = f"{path} (+ overrides)"
    return validate_config(cls, data, source)
