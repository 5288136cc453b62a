"""Experiment tracking and the model registry on MLflow, one code path for a laptop and a shared server.

Usage:
    from afm import tracking
    with tracking.start_run("sft", "sft-tiny-seed0", params=cfg.model_dump()) as run:
        tracking.log_metrics({"loss": 1.2}, step=10)
        tracking.log_dataset(manifest, name="coa-v1", context="training")
    version = tracking.register_model(Path("out/policy"), "afm-tiny", tags={"stage": "sft"})
    tracking.set_alias("afm-tiny", "candidate", version)
    local_dir = tracking.resolve_model_uri("models:/afm-tiny@candidate", Path("/tmp/policy"))

    with tracking.parent_run("pipeline", "pipeline", params={...}) as parent_id:        # a pipeline's run
        with tracking.stage_scope(parent_id, datasets=[...], model_store=store, model_artifact="stages/sft-k"):
            train_sft(cfg)   # its run is nested under parent_id; its policy is stored once, as stages/sft-k

Models are stored once (#21): `register_model` creates an MLflow 3 logged model linked to the run (the runs
table's Models column) and a registry version. Inside a `stage_scope` with a model store the files go to the
stage's artifact in the store (s3:// or local) and MLflow keeps only metadata (an external logged model whose
version's source is that artifact); otherwise the files are the logged model's artifacts in MLflow.
`resolve_model_uri("models:/...")` follows the version to wherever its files are.

Where runs go: `MLFLOW_TRACKING_URI` when set (e.g. the `afm stack up` server, which proxies artifacts to S3);
otherwise a local SQLite store `<AFM_HOME>/mlflow.db` with artifacts in `<AFM_HOME>/mlartifacts`
(`AFM_HOME` defaults to `./.afm`). The first use of a fresh SQLite store runs MLflow's migrations (~2 s).

Tools: when the run that registers a model was started with a `toolbox` section in its params (RL does), the
toolbox config is recorded inside the registered model as `afm_tools/toolbox.json`, with the search corpus it
pointed at as `afm_tools/corpus.jsonl`: `afm serve` gives /v1/agent the tools and corpus the
model was trained with (serving/service.py), wherever the run's temporary corpus file has gone since.

Secrets: params and tags whose KEY names a secret (api_key, token, secret, password, ...) or whose VALUE
looks like one (known key formats, credentials in a URL, or the value of any secret-named environment
variable) are logged as "<redacted>". This does NOT cover secrets in metrics, artifacts, figures or table
rows the caller logs, nor secrets in formats it does not recognise: keep secrets out of configs.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import mlflow
from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric, Param
from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.data.meta_dataset import MetaDataset
from mlflow.exceptions import MlflowException
from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS, MLFLOW_PARENT_RUN_ID
from mlflow.utils.validation import MAX_DATASET_DIGEST_SIZE, MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH

from afm.paths import afm_home
from afm.storage import ArtifactStore, LocalStore, directory_files, local_path

REDACTED = "<redacted>"
# Matched on whole name parts ("llm.api_key", "HF_TOKEN") so "max_tokens" or "tokenizer" are not secrets.
SECRET_KEY_PATTERN = re.compile(
    r"(^|[._-])(api[_-]?key|apikey|token|secret|passw(or)?d|credentials?|private[_-]?key|access[_-]?key"
    r"|authorization)($|[._-])",
    re.IGNORECASE,
)
SECRET_VALUE_PATTERNS = [
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),  # OpenAI-style API keys
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS access key ids
    re.compile(r"\b(ghp|gho|ghs|github_pat)_[A-Za-z0-9_]{20,}"),  # GitHub tokens
    re.compile(r"\bhf_[A-Za-z0-9]{30,}"),  # Hugging Face tokens
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),  # Slack tokens
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"://[^/\s:@]+:[^/\s@]+@"),  # user:password@host in a URL
]
# Environment values shorter than this are too likely to occur by chance in ordinary params.
_MIN_ENV_SECRET_LENGTH = 8
REGISTRY_EXPERIMENT = "model-registry"
# Experiments are tagged for MLflow's model-training view (without it the UI opens in GenAI mode).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# Logged-model type of every policy this platform registers (a plain HF directory, not an MLflow flavor).
MODEL_TYPE = "hf-causal-lm"
# Tags of a logged model / model version: where its files are, and the pipeline run it was trained in.
TAG_STORAGE_URI = "afm.storage_uri"
TAG_STAGE = "afm.stage"  # on runs: the stage that opened it ("pipeline" on a pipeline's parent run)
TAG_PIPELINE_RUN_ID = "afm.pipeline_run_id"
# Inside a registered model's directory: the tool environment it was trained with (see the module docstring).
TOOLS_DIR = "afm_tools"
# Raw params of the runs this process started, by run id: MLflow keeps params only as flattened, truncated
# strings, and register_model needs the run's toolbox config as it was.
_RUN_PARAMS: dict[str, dict[str, Any]] = {}


def configure_tracking() -> str:
    """Point MLflow (tracking and registry) at `MLFLOW_TRACKING_URI` or the local SQLite store; return the URI."""
    server_uri = os.environ.get("MLFLOW_TRACKING_URI")
    if server_uri:
        mlflow.set_tracking_uri(server_uri)
        mlflow.set_registry_uri(server_uri)
        return server_uri
    home = afm_home()
    uri = f"sqlite:///{home / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    # mlflow.set_tracking_uri also exports MLFLOW_TRACKING_URI, which would pin this store for the rest of the
    # process (a later AFM_HOME would be ignored). Undo that; export the absolute AFM_HOME instead so child
    # processes (Ray workers, Prefect subprocesses) with another cwd still find the same store.
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ["AFM_HOME"] = str(home)
    return uri


def _use_experiment(experiment: str) -> None:
    """Select (creating if needed) `experiment`, tagged for MLflow's model-training view; locally its artifacts
    go under <AFM_HOME>/mlartifacts."""
    client = MlflowClient()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        # A server decides artifact locations itself (--artifacts-destination); a database store would default
        # to ./mlruns in whatever the cwd is, so it gets <AFM_HOME>/mlartifacts instead.
        is_server = mlflow.get_tracking_uri().startswith(("http://", "https://"))
        location = None if is_server else (afm_home() / "mlartifacts" / experiment).as_uri()
        client.create_experiment(experiment, artifact_location=location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    elif found.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:  # made before the tag existed (or by hand)
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    mlflow.set_experiment(experiment)


def flatten_params(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"model": {"hidden": 64}} -> {"model.hidden": 64}; lists stay one value."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_params(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def _secret_env_values() -> list[str]:
    # Names first, then .get(): MLflow's telemetry thread sets and unsets _MLFLOW_TELEMETRY_SESSION_ID meanwhile,
    # and iterating os.environ.items() raised KeyError for it (a pipeline run failed at its first logged param).
    values = (os.environ.get(name) for name in list(os.environ) if SECRET_KEY_PATTERN.search(name))
    return [value for value in values if value is not None and len(value) >= _MIN_ENV_SECRET_LENGTH]


def looks_like_secret(key: str, value: Any) -> bool:
    """True when the key names a secret or the value matches a known secret format or a secret env value."""
    text = str(value)
    if SECRET_KEY_PATTERN.search(key):
        return True
    if any(pattern.search(text) for pattern in SECRET_VALUE_PATTERNS):
        return True
    return any(secret in text for secret in _secret_env_values())


def sanitize_params(params: dict[str, Any]) -> dict[str, str]:
    """Flatten, redact secrets, and fit keys/values into MLflow's length limits (long values are truncated)."""
    clean = {}
    for key, value in flatten_params(params).items():
        text = REDACTED if looks_like_secret(key, value) else str(value)
        clean[key[:MAX_ENTITY_KEY_LENGTH]] = text[:MAX_PARAM_VAL_LENGTH]
    return clean


@contextmanager
def start_run(
    experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, Any] | None = None
) -> Iterator[mlflow.ActiveRun]:
    """Start an MLflow run in `experiment` with sanitized `params` and `tags`; nested inside an active run.
    Inside a `stage_scope` with a parent run, the outermost run goes to the parent's experiment as its
    nested child (MLflow's UI nests runs of one experiment only) and logs the scope's datasets as inputs."""
    configure_tracking()
    scope = _SCOPE.get()
    nested = mlflow.active_run() is not None
    tags = dict(tags or {})
    if scope is not None and scope.stage and not nested:
        tags.setdefault(TAG_STAGE, scope.stage)
    if scope is not None and scope.parent_run_id and not nested:
        mlflow.set_experiment(experiment_id=MlflowClient().get_run(scope.parent_run_id).info.experiment_id)
        tags[MLFLOW_PARENT_RUN_ID] = scope.parent_run_id
    else:
        _use_experiment(experiment)
    with mlflow.start_run(run_name=run_name, tags=sanitize_params(tags), nested=nested) as run:
        mlflow.log_params(sanitize_params(params))
        if scope is not None and not nested:
            for dataset in scope.datasets:
                log_dataset(dataset, name=dataset["name"], context=dataset["context"])
        _RUN_PARAMS[run.info.run_id] = params
        try:
            yield run
        finally:
            _RUN_PARAMS.pop(run.info.run_id, None)


@contextmanager
def parent_run(experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, Any] | None = None
               ) -> Iterator[str]:
    """A parent run (e.g. one per pipeline) that stays RUNNING while the block runs and is not the active run:
    its stages open their own runs as its children through `stage_scope(parent_run_id=...)`, on any thread.
    Yields the run id; the run ends FINISHED, or FAILED when the block raises."""
    configure_tracking()
    _use_experiment(experiment)
    client = MlflowClient()
    run = client.create_run(mlflow.get_experiment_by_name(experiment).experiment_id, run_name=run_name,
                            tags=sanitize_params(tags or {}))
    run_id = run.info.run_id
    status = "FAILED"
    try:  # the params too: a run whose logging raised stayed RUNNING forever
        client.log_batch(run_id, params=[Param(k, v) for k, v in sanitize_params(params).items()])
        yield run_id
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status)


def log_run_metrics(run_id: str, metrics: dict[str, Any], step: int = 0) -> None:
    """Log numeric metrics to a run by id (not the active run); None values are skipped."""
    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, step) for k, v in flatten_params(metrics).items() if v is not None]
    MlflowClient().log_batch(run_id, metrics=batch)


def log_metrics(metrics: dict[str, Any], step: int) -> None:
    """Log numeric metrics (nested dicts flattened to dotted names) at `step`."""
    mlflow.log_metrics({key: float(value) for key, value in flatten_params(metrics).items()}, step=step)


def log_dataset(manifest: dict, name: str, context: str) -> None:
    """Record an artifact-store dataset as a run input: source = its store URI, digest = its manifest digest."""
    with warnings.catch_warnings():
        # MLflow registers LocalArtifactDatasetSource twice and warns that file URIs are ambiguous; harmless.
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(manifest["uri"])
    # MLflow caps digests at 36 characters; a 36-hex-digit sha256 prefix still identifies the content.
    dataset = MetaDataset(source=source, name=name, digest=manifest["digest"][:MAX_DATASET_DIGEST_SIZE])
    mlflow.log_input(dataset, context=context)


def log_figure(fig: Any, artifact_file: str) -> None:
    """Log a matplotlib figure as an image artifact of the active run."""
    mlflow.log_figure(fig, artifact_file)


def log_table_rows(rows: list[dict[str, Any]], artifact_file: str) -> None:
    """Log rows (e.g. per-problem eval results) as one JSON artifact of the active run."""
    mlflow.log_text(json.dumps(rows, indent=2, default=str), artifact_file)


@dataclass(frozen=True)
class StageScope:
    """What the stage task around a training job tells the runs and models that job creates (see stage_scope)."""

    parent_run_id: str = ""  # the pipeline run: runs started in scope become its nested children
    stage: str = ""  # tagged `afm.stage` on the runs started in scope (a stage's run names its stage)
    datasets: tuple[dict, ...] = ()  # store manifests {"uri", "digest", "name", "context"} logged as run inputs
    model_store: ArtifactStore | None = None  # where register_model stores the model: the stage's own artifact
    model_artifact: str = ""
    stored: dict = field(default_factory=dict)  # filled by register_model: the manifest entries it uploaded


_SCOPE: ContextVar[StageScope | None] = ContextVar("afm_stage_scope", default=None)


@contextmanager
def stage_scope(parent_run_id: str = "", datasets: list[dict] | None = None, model_store: ArtifactStore | None = None,
                model_artifact: str = "", stage: str = "") -> Iterator[StageScope]:
    """Within: `start_run` nests runs under `parent_run_id` (in its experiment) and logs `datasets` as their
    inputs, and `register_model` stores the model as `model_artifact` of `model_store` (files only; the caller
    writes the manifest from `scope.stored`) and registers that one copy. The trainers are unchanged: a
    context variable carries this from the task into the job's driver code on the same thread."""
    scope = StageScope(parent_run_id, stage, tuple(datasets or ()), model_store, model_artifact)
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def register_model(model_dir: Path, name: str, tags: dict[str, Any]) -> str:
    """Register an HF model directory as a new version of `name`, as an MLflow logged model of the active run.

    The weights are stored ONCE: inside a `stage_scope` with a model store, in the stage's artifact (s3:// or
    a local store) and the logged model is an external one (MLflow keeps only its metadata) whose version's
    source is that artifact; otherwise as the logged model's own artifacts in MLflow. `resolve_model_uri`
    loads either. Uses the active run when there is one, else a run in the `model-registry` experiment. The
    directory is stored as plain files (not an MLflow flavor) so any checkpoint dir round-trips unchanged.
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"register_model: {model_dir} has no config.json; pass a saved HF model directory")
    configure_tracking()
    if mlflow.active_run() is None:
        with start_run(REGISTRY_EXPERIMENT, f"register-{name}", params={"model_dir": str(model_dir)}):
            return register_model(model_dir, name, tags)
    run = mlflow.active_run()
    client = MlflowClient()
    scope = _SCOPE.get()
    tags = sanitize_params({**tags, **({TAG_PIPELINE_RUN_ID: scope.parent_run_id}
                                       if scope and scope.parent_run_id else {})})
    with tempfile.TemporaryDirectory(prefix="afm-tools-") as extra_dir:
        files = directory_files(model_dir)
        files.update(_write_tools(_RUN_PARAMS.get(run.info.run_id, {}).get("toolbox"), Path(extra_dir)))
        if scope is not None and scope.model_store is not None and _registry_accepts(scope.model_store):
            scope.stored.update(scope.model_store.upload_files(scope.model_artifact, files))
            source = scope.model_store.artifact_uri(scope.model_artifact)
            model = mlflow.create_external_model(name=name, source_run_id=run.info.run_id, model_type=MODEL_TYPE,
                                                 tags={**tags, TAG_STORAGE_URI: source})
        else:
            model = client.create_logged_model(run.info.experiment_id, name=name, source_run_id=run.info.run_id,
                                               tags=tags, model_type=MODEL_TYPE)
            client.log_model_artifacts(model.model_id, str(model_dir))
            if Path(extra_dir, TOOLS_DIR).is_dir():
                client.log_model_artifacts(model.model_id, extra_dir)
            client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
            source = f"models:/{model.model_id}"
    # The run's outputs are what the runs table's Models column shows.
    client.log_outputs(run.info.run_id, [LoggedModelOutput(model.model_id, step=0)])
    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        client.create_registered_model(name)
    version = client.create_model_version(name, source=source, run_id=run.info.run_id, tags=tags,
                                          model_id=model.model_id)
    # The logged model's page lists its registered versions from this tag (mlflow.register_model sets it too).
    client.set_logged_model_tags(model.model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(
        [{"name": name, "version": str(version.version)}])})
    return str(version.version)


def _registry_accepts(store: ArtifactStore) -> bool:
    """A tracking server only accepts a local path as a version source inside its own artifact root, and may
    not see this machine's files anyway: then the model goes to MLflow (a second copy beside the stage's)."""
    return not (isinstance(store, LocalStore) and mlflow.get_registry_uri().startswith(("http://", "https://")))


def _write_tools(toolbox: Any, out: Path) -> dict[str, Path]:
    """A run's toolbox config (and the corpus file it names) written as `afm_tools/...` under `out`, to be
    stored with the model; {} when the run had no toolbox."""
    if not isinstance(toolbox, dict):
        return {}
    (out / TOOLS_DIR).mkdir(parents=True)
    record = {**toolbox, "cache_dir": None}  # a cache directory is a path on the training machine
    corpus = Path(toolbox["corpus_path"]) if toolbox.get("corpus_path") else None
    if corpus is not None and corpus.is_file():
        shutil.copyfile(corpus, out / TOOLS_DIR / corpus.name)
        record["corpus_path"] = corpus.name
    else:
        record["corpus_path"] = None
    # By value only: a toolbox names its keys by environment variable (web_search_api_key_env="SERPER_API_KEY"),
    # and redacting that name would break the record; a key pasted into any field is still caught.
    record = {key: REDACTED if looks_like_secret("", value) else value for key, value in record.items()}
    (out / TOOLS_DIR / "toolbox.json").write_text(json.dumps(record, indent=2))
    return {p.relative_to(out).as_posix(): p for p in sorted(out.rglob("*")) if p.is_file()}


def set_alias(name: str, alias: str, version: str | int) -> None:
    """Point `models:/<name>@<alias>` at `version` (e.g. alias "production" after the promotion gate)."""
    configure_tracking()
    MlflowClient().set_registered_model_alias(name, alias, str(version))


def resolve_model_uri(uri: str | Path, dst: Path) -> Path:
    """A local model directory for `models:/name@alias`, `models:/name/3`, `runs:/...`, `s3://...` or a path.

    A registry URI resolves to where its version's files are (the stage's store artifact, or the logged
    model's MLflow artifacts) and is then treated like that location. A local path or file:// location is
    returned as is (no copy; callers only read it); everything else is downloaded under `dst`.
    """
    text = str(uri)
    dst = Path(dst)
    if text.startswith("models:/"):
        configure_tracking()
        text = ModelsArtifactRepository.get_underlying_uri(text)
    if text.startswith("s3://"):
        return _download_s3_model(text, dst)
    if urlparse(text).scheme not in ("", "file"):  # runs:/, mlflow-artifacts:/ (a server), ...
        configure_tracking()
        dst.mkdir(parents=True, exist_ok=True)
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=text, dst_path=str(dst)))
    path = local_path(text)
    if not path.is_dir():
        raise FileNotFoundError(f"model URI {text!r}: not a directory and not a models:/, runs:/ or s3:// URI")
    return path


def loadable_model_uri(uri: str, dst: Path) -> str:
    """What `models.policy.load_policy` reads on any worker: a registry URI becomes its version's store location
    (an s3:// artifact or a path, read by each worker itself, so workers on other nodes never need the caller's
    disk); s3:// URIs and paths stay as they are. Other schemes (runs:/, a server's mlflow-artifacts:/) are
    downloaded under `dst` first, which only a single node can read."""
    text = str(uri)
    if text.startswith("models:/"):
        configure_tracking()
        text = ModelsArtifactRepository.get_underlying_uri(text)
    if text.startswith("s3://") or urlparse(text).scheme in ("", "file"):
        return text
    return str(resolve_model_uri(text, dst))


def _download_s3_model(uri: str, dst: Path) -> Path:
    """An artifact-store artifact (verified against its manifest) or, without a manifest, every key under it."""
    from afm.storage import open_store

    bucket_and_prefix = uri.removeprefix("s3://").rstrip("/")
    parent, _, name = bucket_and_prefix.rpartition("/")
    if not parent:
        raise ValueError(f"model URI {uri!r}: expected s3://bucket/path/to/model")
    store = open_store(f"s3://{parent}")
    if store.read_manifest(name) is not None:
        return store.fetch_artifact(name, dst)
    keys = store.list(f"{name}/")
    if not keys:
        raise FileNotFoundError(f"model URI {uri!r}: no objects under it")
    for key in keys:
        store.download_file(key, dst / key.removeprefix(f"{name}/"))
    return dst
