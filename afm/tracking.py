"""Experiment tracking and the model registry on MLflow, one code path for a laptop and a shared server.

Usage:
    from afm import tracking
    with tracking.start_run("sft", "sft-tiny-seed0", params=cfg.model_dump()) as run:
        tracking.log_metrics({"loss": 1.2}, step=10)
        tracking.log_dataset(manifest, name="coa-v1", context="training")
    version = tracking.register_model(Path("out/policy"), "afm-tiny", tags={"stage": "sft"})
    tracking.set_alias("afm-tiny", "candidate", version)
    local_dir = tracking.resolve_model_uri("models:/afm-tiny@candidate", Path("/tmp/policy"))

Where runs go: `MLFLOW_TRACKING_URI` when set (e.g. the `afm stack up` server, which proxies artifacts to S3);
otherwise a local SQLite store `<AFM_HOME>/mlflow.db` with artifacts in `<AFM_HOME>/mlartifacts`
(`AFM_HOME` defaults to `./.afm`). The first use of a fresh SQLite store runs MLflow's migrations (~2 s).

Tools: when the run that registers a model was started with a `toolbox` section in its params (RL does), the
toolbox config is recorded inside the registered artifact as `model/afm_tools/toolbox.json`, with the search
corpus it pointed at as `model/afm_tools/corpus.jsonl`: `afm serve` gives /v1/agent the tools and corpus the
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
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.data.meta_dataset import MetaDataset
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_DATASET_DIGEST_SIZE, MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH

from afm.paths import afm_home
from afm.storage import local_path

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
    """Select (creating if needed) `experiment`; locally its artifacts go under <AFM_HOME>/mlartifacts."""
    client = MlflowClient()
    if client.get_experiment_by_name(experiment) is None:
        # A server decides artifact locations itself (--artifacts-destination); a database store would default
        # to ./mlruns in whatever the cwd is, so it gets <AFM_HOME>/mlartifacts instead.
        is_server = mlflow.get_tracking_uri().startswith(("http://", "https://"))
        location = None if is_server else (afm_home() / "mlartifacts" / experiment).as_uri()
        client.create_experiment(experiment, artifact_location=location)
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
    return [
        value
        for name, value in os.environ.items()
        if SECRET_KEY_PATTERN.search(name) and len(value) >= _MIN_ENV_SECRET_LENGTH
    ]


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
    """Start an MLflow run in `experiment` with sanitized `params` and `tags`; nested inside an active run."""
    configure_tracking()
    _use_experiment(experiment)
    nested = mlflow.active_run() is not None
    with mlflow.start_run(run_name=run_name, tags=sanitize_params(tags or {}), nested=nested) as run:
        mlflow.log_params(sanitize_params(params))
        _RUN_PARAMS[run.info.run_id] = params
        try:
            yield run
        finally:
            _RUN_PARAMS.pop(run.info.run_id, None)


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


def register_model(model_dir: Path, name: str, tags: dict[str, Any]) -> str:
    """Log an HF model directory as the run artifact `model` and register it as a new version of `name`.

    Uses the active run when there is one, else a run in the `model-registry` experiment. The directory is
    logged as plain files (not an MLflow flavor) so any checkpoint dir, tiny or real, round-trips unchanged.
    Register at most one model per run: a second call in the same run would overwrite the `model` artifact.
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"register_model: {model_dir} has no config.json; pass a saved HF model directory")
    configure_tracking()
    if mlflow.active_run() is None:
        with start_run(REGISTRY_EXPERIMENT, f"register-{name}", params={"model_dir": str(model_dir)}):
            return register_model(model_dir, name, tags)
    mlflow.log_artifacts(str(model_dir), artifact_path="model")
    run = mlflow.active_run()
    _log_tools(_RUN_PARAMS.get(run.info.run_id, {}).get("toolbox"))
    client = MlflowClient()
    # mlflow.register_model("runs:/...") in MLflow 3 wants an MLmodel file or a LoggedModel; a plain HF
    # directory is registered by pointing a model version straight at the run's artifact location.
    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        client.create_registered_model(name)
    version = client.create_model_version(
        name, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id, tags=sanitize_params(tags)
    )
    return str(version.version)


def _log_tools(toolbox: Any) -> None:
    """Record a run's toolbox config (and the corpus file it names) next to the model it registers."""
    if not isinstance(toolbox, dict):
        return
    record = {**toolbox, "cache_dir": None}  # a cache directory is a path on the training machine
    corpus = Path(toolbox["corpus_path"]) if toolbox.get("corpus_path") else None
    if corpus is not None and corpus.is_file():
        mlflow.log_artifact(str(corpus), artifact_path=f"model/{TOOLS_DIR}")
        record["corpus_path"] = corpus.name
    else:
        record["corpus_path"] = None
    # By value only: a toolbox names its keys by environment variable (web_search_api_key_env="SERPER_API_KEY"),
    # and redacting that name would break the record; a key pasted into any field is still caught.
    record = {key: REDACTED if looks_like_secret("", value) else value for key, value in record.items()}
    mlflow.log_dict(record, f"model/{TOOLS_DIR}/toolbox.json")


def set_alias(name: str, alias: str, version: str | int) -> None:
    """Point `models:/<name>@<alias>` at `version` (e.g. alias "production" after the promotion gate)."""
    configure_tracking()
    MlflowClient().set_registered_model_alias(name, alias, str(version))


def resolve_model_uri(uri: str | Path, dst: Path) -> Path:
    """A local model directory for `models:/name@alias`, `models:/name/3`, `runs:/...`, `s3://...` or a path.

    A local path is returned as is (no copy); everything else is downloaded under `dst`.
    """
    text = str(uri)
    dst = Path(dst)
    if text.startswith(("models:/", "runs:/")):
        configure_tracking()
        dst.mkdir(parents=True, exist_ok=True)
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=text, dst_path=str(dst)))
    if text.startswith("s3://"):
        return _download_s3_model(text, dst)
    path = local_path(text)
    if not path.is_dir():
        raise FileNotFoundError(f"model URI {text!r}: not a directory and not a models:/, runs:/ or s3:// URI")
    return path


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
