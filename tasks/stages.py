"""Stage bookkeeping shared by the Prefect tasks: cache keys, completed-stage lookup, transient-error retries.

A stage's output is an artifact in the store whose manifest is written last. Its name carries a key hashed
from the stage's config and the manifests of its inputs, so a re-run with the same inputs finds the manifest
and skips the work (a crash costs at most the stage in progress), and any change of config or input data
makes a new key. The key also covers the code that produces the stage: a content hash of the .py files of
the stage's package, of every first-party package it imports (transitively) and of the platform core `afm/`,
so after an upgrade the stages whose code changed run again instead of silently reusing old outputs. Any edit
counts, comments included (a hash cannot tell a refactor from a fix). The task wrappers in tasks/ are not
hashed: they only move files between the store and the stage.

Usage (inside a task):
    key = stage_key("sft", cfg, inputs={"dataset": dataset_sha})
    done = completed_stage(store, "sft", key)     # manifest dict, or None
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re
import socket
from pathlib import Path
from typing import Any, Callable

import botocore.exceptions
from pydantic import BaseModel

from afm.paths import afm_home
from afm.storage import directory_files, open_store  # noqa: F401 (directory_files: for the tasks)

# Errors worth a retry: the network or a server hiccuped. Anything else (bad config, a bug) fails at once.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    socket.timeout,
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.ReadTimeoutError,
)


def retry_on_transient(task, task_run, state) -> bool:  # noqa: ARG001 (Prefect's retry_condition_fn signature)
    """Prefect `retry_condition_fn`: retry only when the task failed with one of TRANSIENT_ERRORS."""
    try:
        state.result()
    except TRANSIENT_ERRORS:
        return True
    except BaseException:  # noqa: BLE001 - any other failure is final
        return False
    return False


# Where the first-party packages live (the repo root, or site-packages for an installed copy).
SOURCE_ROOT = Path(__file__).resolve().parents[1]
# The package each stage runs; the packages it imports are found by reading its source (code_packages).
STAGE_PACKAGES: dict[str, str] = {
    "distill": "distill", "policy": "models", "pretrain": "training", "sft": "training", "rl": "training",
    "eval": "evaluation", "autocoa-data": "distill", "autocoa-probes": "evaluation",
}
CORE_PACKAGE = "afm"
DISTRIBUTION = "afm-platform"
_IMPORT_RE = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", re.MULTILINE)


def _distribution_packages() -> list[str]:
    """The platform's own top-level packages (not tests/, not bench/): installed in site-packages, the
    directory next to them holds every other library too."""
    try:
        return (importlib.metadata.distribution(DISTRIBUTION).read_text("top_level.txt") or "").split()
    except importlib.metadata.PackageNotFoundError:  # a bare checkout on sys.path: its package directories
        return [p.name for p in SOURCE_ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"]


def _package_files(root: Path, package: str) -> list[Path]:
    return sorted(p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts)


@functools.lru_cache(maxsize=None)
def code_packages(stage: str, root: Path = SOURCE_ROOT) -> tuple[str, ...]:
    """The first-party packages whose code a stage runs: its package, every first-party package that one
    imports (transitively), and `afm`. An unknown stage gets every package (over-invalidating is safe)."""
    first_party = {name for name in _distribution_packages() if (root / name / "__init__.py").is_file()}
    start = STAGE_PACKAGES.get(stage)
    todo = [start] if start in first_party else sorted(first_party)
    seen = {CORE_PACKAGE} & first_party
    while todo:
        package = todo.pop()
        if package in seen:
            continue
        seen.add(package)
        for path in _package_files(root, package):
            todo += [name for name in _IMPORT_RE.findall(path.read_text()) if name in first_party]
    return tuple(sorted(seen))


@functools.lru_cache(maxsize=None)
def code_digest(packages: tuple[str, ...], root: Path = SOURCE_ROOT) -> str:
    """sha256 over the relative path and content of every .py file of `packages`; once per process (cached):
    the code a process runs does not change under it."""
    digest = hashlib.sha256()
    for package in packages:
        for path in _package_files(root, package):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def stage_key(stage: str, config: BaseModel, inputs: dict[str, Any] | None = None) -> str:
    """16 hex chars of sha256 over the stage name, its config, its inputs' identities (shas, URIs) and the
    digest of the code that runs it."""
    payload = json.dumps(
        {"stage": stage, "config": config.model_dump(mode="json"), "inputs": inputs or {},
         "code": code_digest(code_packages(stage, SOURCE_ROOT), SOURCE_ROOT)},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def stage_artifact(stage: str, key: str) -> str:
    return f"stages/{stage}-{key}"


def completed_stage(store, stage: str, key: str) -> dict | None:
    """The manifest of a completed run of this stage with this key, or None."""
    return store.read_manifest(stage_artifact(stage, key))


def default_store_uri() -> str:
    """The artifact store: `AFM_STORE_URI` (e.g. s3://afm/artifacts on the local stack) or <AFM_HOME>/artifacts."""
    return os.environ.get("AFM_STORE_URI") or str(afm_home() / "artifacts")


def run_stage(
    stage: str, key: str, store_uri: str, produce: Callable[[Path], tuple[dict, dict]], kind: str,
    upload: bool = True,
) -> dict:
    """Run `produce(work_dir) -> (files, extra)` unless this stage+key already has a manifest in the store;
    upload the files (manifest last) and return the manifest with `cached` telling which happened.
    upload=False: `produce` has stored its files under `stage_artifact(stage, key)` itself (a model registered
    from that one copy, afm.tracking.stage_scope) and returns their manifest entries instead of paths."""
    store = open_store(store_uri or default_store_uri())
    done = completed_stage(store, stage, key)
    if done is not None:
        return {**done, "cached": True}
    work_dir = afm_home() / "work" / f"{stage}-{key}"
    work_dir.mkdir(parents=True, exist_ok=True)
    files, extra = produce(work_dir)
    name = stage_artifact(stage, key)
    if upload:
        manifest = store.write_artifact(name, files, kind=kind, extra=extra)
    else:
        manifest = store.write_manifest(name, files, kind=kind, extra=extra)
    return {**manifest, "cached": False}
