"""Model lineage from the MLflow registry: RL model version -> SFT model version -> base model, with the run
and the dataset (sha256) behind each step.

The trainers record lineage as MODEL-VERSION TAGS when they register a model (`tracking.register_model(...,
tags=lineage_tags(...))`):
  afm.stage           "sft" | "rl" (what produced this version)
  afm.run_id          MLflow run id of the training run that produced it
  afm.parent_model    the checkpoint training started from: `models:/<name>/<version>` when it is registered
                      (RL starts from the SFT version), otherwise its path / hub id (SFT starts from the base)
  afm.parent_run_id   run id that produced the parent ("" for an unregistered base)
  afm.dataset_uri     artifact-store URI of the training data (CoA trajectories for SFT, RL queries for RL)
  afm.dataset_sha256  the dataset manifest digest (`storage` manifest "digest")
`lineage` walks `afm.parent_model` through registered versions until it reaches an unregistered base.

Usage:
    chain = lineage("models:/afm-tiny@champion")  # newest first: rl version, sft version, base
    print(format_lineage(chain))
"""
from __future__ import annotations

import re

import mlflow
from mlflow.tracking import MlflowClient

from afm import tracking

TAG_STAGE = "afm.stage"
TAG_RUN_ID = "afm.run_id"
TAG_PARENT_MODEL = "afm.parent_model"
TAG_PARENT_RUN_ID = "afm.parent_run_id"
TAG_DATASET_URI = "afm.dataset_uri"
TAG_DATASET_SHA256 = "afm.dataset_sha256"

_ALIAS_SHORTHAND_RE = re.compile(r"^[\w.-]+@[\w.-]+$")
_MODEL_URI_RE = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")


class LineageError(ValueError):
    """A model URI that is not a registry URI, or a lineage chain that loops."""


def lineage_tags(stage: str, run_id: str, parent_model: str, parent_run_id: str, dataset_uri: str,
                 dataset_sha256: str) -> dict[str, str]:
    """The model-version tags a trainer sets when it registers a model (see the module docstring)."""
    return {TAG_STAGE: stage, TAG_RUN_ID: run_id, TAG_PARENT_MODEL: parent_model, TAG_PARENT_RUN_ID: parent_run_id,
            TAG_DATASET_URI: dataset_uri, TAG_DATASET_SHA256: dataset_sha256}


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """`models:/name@alias` -> (name, alias, None); `models:/name/3` -> (name, None, "3")."""
    match = _MODEL_URI_RE.match(uri)
    if not match:
        raise LineageError(f"{uri!r} is not a registry model URI; expected models:/<name>@<alias> or "
                           "models:/<name>/<version>")
    return match["name"], match["alias"], match["version"]


def normalize_model_uri(uri: str) -> str:
    """The registry shorthand `name@alias` -> `models:/name@alias`; anything else unchanged."""
    return f"models:/{uri}" if _ALIAS_SHORTHAND_RE.match(uri) else uri


def is_registry_uri(uri: str) -> bool:
    return bool(_MODEL_URI_RE.match(uri))


def resolve_registry_version(uri: str) -> tuple[str, str]:
    """(name, version) of a registry URI; an alias is resolved to the version it points at now."""
    name, alias, version = parse_model_uri(uri)
    if alias is not None:
        tracking.configure_tracking()
        version = str(MlflowClient().get_model_version_by_alias(name, alias).version)
    return name, str(version)


def model_run_id(uri: str) -> str:
    """The run that produced a registered model (`afm.parent_run_id` of a model trained from it); "" for a
    path, a store URI or a hub id."""
    uri = normalize_model_uri(uri)
    if not is_registry_uri(uri):
        return ""
    name, version = resolve_registry_version(uri)
    tracking.configure_tracking()
    return MlflowClient().get_model_version(name, version).run_id or ""


def _run_summary(client: MlflowClient, run_id: str) -> dict:
    """Name, experiment and logged dataset inputs of a run ({} fields when the run is gone)."""
    if not run_id:
        return {}
    try:
        run = client.get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return {"run_missing": True}
    datasets = [{"name": d.dataset.name, "digest": d.dataset.digest, "source": d.dataset.source}
                for d in (run.inputs.dataset_inputs if run.inputs else [])]
    return {"run_name": run.info.run_name, "experiment_id": run.info.experiment_id, "run_datasets": datasets}


def lineage(model_uri: str) -> list[dict]:
    """The chain from `model_uri` back to its base model, newest first. Each registered step is
    {"kind": "model_version", "model", "name", "version", "aliases", "stage", "run_id", "run_name",
    "parent_model", "parent_run_id", "dataset_uri", "dataset_sha256", "run_datasets"}; the chain ends with
    {"kind": "base", "model": <path or hub id>} when the first training step started from an unregistered model."""
    tracking.configure_tracking()
    client = MlflowClient()
    name, version = resolve_registry_version(normalize_model_uri(model_uri))
    chain: list[dict] = []
    seen: set[tuple[str, str]] = set()
    while True:
        if (name, version) in seen:
            raise LineageError(f"lineage of {model_uri!r} loops at models:/{name}/{version}")
        seen.add((name, version))
        mv = client.get_model_version(name, version)
        tags = mv.tags or {}
        run_id = tags.get(TAG_RUN_ID) or mv.run_id or ""
        step = {
            "kind": "model_version", "model": f"models:/{name}/{version}", "name": name, "version": version,
            "aliases": sorted(mv.aliases or []), "stage": tags.get(TAG_STAGE, ""), "run_id": run_id,
            "parent_model": tags.get(TAG_PARENT_MODEL, ""), "parent_run_id": tags.get(TAG_PARENT_RUN_ID, ""),
            "dataset_uri": tags.get(TAG_DATASET_URI, ""), "dataset_sha256": tags.get(TAG_DATASET_SHA256, ""),
        }
        step.update(_run_summary(client, run_id))
        chain.append(step)
        parent = step["parent_model"]
        if not parent:
            return chain
        if not is_registry_uri(parent):
            chain.append({"kind": "base", "model": parent})
            return chain
        name, version = resolve_registry_version(parent)


def format_lineage(chain: list[dict]) -> str:
    """Human-readable lineage, one step per line, for `afm lineage MODEL`."""
    lines = []
    for depth, step in enumerate(chain):
        indent = "  " * depth + ("<- " if depth else "")
        if step["kind"] == "base":
            lines.append(f"{indent}base model {step['model']}")
            continue
        aliases = f" @{',@'.join(step['aliases'])}" if step["aliases"] else ""
        stage = step["stage"] or "unknown stage"
        run = step["run_id"] or "no run"
        if step.get("run_name"):
            run += f" ({step['run_name']})"
        data = step["dataset_sha256"][:12] or "no dataset recorded"
        if step["dataset_uri"]:
            data += f" {step['dataset_uri']}"
        lines.append(f"{indent}{step['model']}{aliases} [{stage}] run {run}; data {data}")
    return "\n".join(lines)
