"""Prefect tasks for the model stages: base policy, pretraining, SFT, RL. Each caches by artifact manifest: the key hashes
the stage config and the digests of its inputs, so a re-run with the same inputs skips the stage.

Used by flows/pretrain.py, flows/sft.py, flows/rl.py and flows/pipeline.py; the training logic lives in `training/`.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal

from pydantic import Field
from prefect import task

from afm import tracking
from afm.config import Config
from afm.storage import directory_files, open_store
from models.format import read_jsonl, render_segments
from models.tiny import TinyModelConfig, create_default_policy
from models.tokenizer import NAME_PIECES_REGEX
from agents.tools.search import read_corpus
from problems.miniweb import serve_corpus
from problems.pretrain_pages import pretraining_documents, write_text_jsonl
from problems.world import WorldConfig
from tasks.stages import default_store_uri, retry_on_transient, run_stage, stage_artifact, stage_key
from training.rl_trainer import RLConfig, train_rl
from training.sft_ray import discard_run_state, train_sft
from training.sft_rows import prepare_rows
from training.sft_trainer import SFTConfig


class BasePolicyConfig(Config):
    """The policy SFT starts from."""

    base_model: str = Field("", description="A real checkpoint (save_pretrained dir or s3:// URI, e.g. a Qwen "
                                            "directory); '' builds the tiny default from `tiny`.")
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Tiny Qwen2 built from config.")
    vocab_size: int = Field(2048, ge=300, description="BPE vocabulary of the locally trained tokenizer.")


class PretrainRecipe(SFTConfig):
    """The SFT trainer's config with the pretraining stage's defaults (a YAML `pretrain.train` section that sets
    a few fields keeps these for the rest)."""

    data_format: Literal["trajectories", "text"] = Field("text", description="Documents, every token a target.")
    mlflow_experiment: str = Field("pretrain", description="MLflow experiment of the run.")
    run_name: str = Field("pretrain", description="MLflow run name (and Ray Train run name).")
    registered_model_name: str = Field("afm-base", description="The pretrained base is registered as a new "
                                                               "version of this model.")
    checkpoint_every: int = Field(200, ge=1, description="Save a checkpoint every N optimizer steps (and at the end).")


class PretrainConfig(Config):
    """Causal LM on the training worlds' pages before SFT (problems/pretrain_pages.py): the tiny default's
    stand-in for a pretrained base model. A real checkpoint (policy.base_model) has had its pretraining."""

    enabled: bool = Field(False, description="Run the pretraining stage between the base policy and SFT.")
    extra_worlds: int = Field(0, ge=0, description="Fresh training worlds (train-split names only) whose pages are "
                                                   "added to the dataset corpus's non-held-out pages.")
    world: WorldConfig = Field(default_factory=WorldConfig, description="Generator settings of the extra worlds.")
    train: PretrainRecipe = Field(default_factory=PretrainRecipe, description="The trainer recipe (the SFT "
                                  "trainer on text; model_path and dataset are set by the stage).")


def fetch(uri: str, local_dir: Path) -> Path:
    """Local copy of the artifact at `uri` (`<store>/<name>`), sha256-verified."""
    root, _, name = uri.rstrip("/").rpartition("/")
    return open_store(root).fetch_artifact(name, local_dir)


def tokenizer_texts(dataset_dir: Path):
    """What the tiny tokenizer is trained on: the training trajectories (questions + rendered segments) only.
    Not the corpus: it holds the held-out pages, and merges learned from held-out names would give them tokens
    no training target ever had (measured: 12 of 75 held-out search arguments), which blocks copying."""
    for traj in read_jsonl(dataset_dir / "train.jsonl"):
        yield traj.question
        yield render_segments(traj.segments)


@task(name="base-policy", retries=2, retry_delay_seconds=10, retry_condition_fn=retry_on_transient)
def base_policy_task(cfg: BasePolicyConfig, dataset: dict, store_uri: str = "") -> str:
    """URI of the starting policy: the given checkpoint, or the tiny default built (tokenizer trained on the
    dataset) and stored as an artifact."""
    if cfg.base_model:
        return cfg.base_model
    # The pre-tokenizer is part of the key: a policy built with another one must not be reused from the cache.
    key = stage_key("policy", cfg, {"dataset": dataset["digest"], "pretokenizer": NAME_PIECES_REGEX})

    def produce(work_dir: Path):
        data = fetch(dataset["uri"], work_dir / "dataset")
        policy = create_default_policy(work_dir / "policy", tokenizer_texts(data), cfg.tiny, cfg.vocab_size)
        return directory_files(policy), {"stage_key": key, "tiny": cfg.tiny.model_dump()}

    return run_stage("policy", key, store_uri, produce, kind="model")["uri"]


def store_dataset(dataset: dict, file: str, context: str) -> dict:
    """A file of a stored dataset artifact as a run input: its store URI and sha256 (stage_scope datasets)."""
    return {"uri": f"{dataset['uri']}/{file}", "digest": dataset["files"][file]["sha256"],
            "name": f"{dataset['name'].rpartition('/')[2]}/{file}", "context": context}


def _model_artifact(stage: str, key: str, store_uri: str, train, parent_run_id: str = "",
                    datasets: list[dict] | None = None) -> dict:
    """Run `train(work_dir) -> result` as a stage whose output is the policy the job registers: the model is
    stored once, as this stage's artifact, and the registered version points at it (tracking.stage_scope)."""
    store = open_store(store_uri)

    def produce(work_dir: Path):
        with tracking.stage_scope(parent_run_id, datasets, model_store=store,
                                  model_artifact=stage_artifact(stage, key), stage=stage) as scope:
            result = train(work_dir)
        policy_dir = Path(result.pop("policy_dir"))
        entries = scope.stored or store.upload_files(stage_artifact(stage, key), directory_files(policy_dir))
        # The stored artifact is now the policy's one copy: the trainer's export in the work dir goes.
        shutil.rmtree(policy_dir)
        return entries, {"stage_key": key, **result}

    return run_stage(stage, key, store_uri, produce, kind="model", upload=False)


def run_sft(cfg: SFTConfig) -> dict:
    """The SFT job of a stage (SFT or pretraining) on Ray Train; what the stage records of it. Its checkpoints go
    once the policy is registered: nothing resumes from them, and the stage's artifact is the policy's one copy.
    The tokenize step runs first, here, before any worker starts; its rows stay: the stages pass their store as
    `rows_store`, where they are kept as `rows/<key>` for the next job on the same data and tokenizer
    (training/sft_rows.py)."""
    step_dir = Path(cfg.output_dir) / "tokenize"
    start = tracking.loadable_model_uri(cfg.model_path, step_dir / "start-policy")
    prepare_rows(cfg.model_copy(update={"model_path": start}), step_dir)
    shutil.rmtree(step_dir, ignore_errors=True)
    result = train_sft(cfg)
    discard_run_state(cfg, result.run_id)
    return {"policy_dir": str(result.policy_dir), "run_id": result.run_id, "model_version": result.model_version,
            "final_loss": result.final_loss, "steps": result.steps, "tokens_per_s": result.tokens_per_s}


@task(name="pretrain", retries=1, retry_delay_seconds=10, retry_condition_fn=retry_on_transient)
def pretrain_task(cfg: PretrainConfig, dataset: dict, base_uri: str, store_uri: str = "",
                  parent_run_id: str = "") -> dict:
    """Causal LM of the base policy `base_uri` on the dataset corpus's training pages (+ extra worlds); returns
    the pretrained policy's artifact manifest (registered as the base model, `cfg.train.registered_model_name`)."""
    key = stage_key("pretrain", cfg, {"dataset": dataset["digest"], "base": base_uri})

    def train(work_dir: Path) -> dict:
        data = fetch(dataset["uri"], work_dir / "dataset")
        pages = work_dir / "pages.jsonl"
        n_docs = write_text_jsonl(pages, pretraining_documents(read_corpus(data / "corpus.jsonl"), cfg.world,
                                                               cfg.extra_worlds))
        return {**run_sft(cfg.train.model_copy(update={
            "model_path": base_uri, "dataset": str(pages), "data_format": "text", "output_dir": str(work_dir / "run"),
            "rows_store": cfg.train.rows_store or store})), "documents": n_docs}

    store = store_uri or default_store_uri()
    inputs = [store_dataset(dataset, "corpus.jsonl", "training")]
    return _model_artifact("pretrain", key, store, train, parent_run_id, inputs)


@task(name="sft", retries=1, retry_delay_seconds=10, retry_condition_fn=retry_on_transient)
def sft_task(cfg: SFTConfig, store_uri: str = "", parent_run_id: str = "") -> dict:
    """SFT `cfg.model_path` on `cfg.dataset`; returns the trained policy's artifact manifest. `parent_run_id`:
    the pipeline run the SFT run is nested under."""
    key = stage_key("sft", cfg)
    store = store_uri or default_store_uri()

    def train(work_dir: Path) -> dict:
        return run_sft(cfg.model_copy(update={"output_dir": str(work_dir / "run"),
                                      "rows_store": cfg.rows_store or store}))

    return _model_artifact("sft", key, store, train, parent_run_id)


@task(name="rl", retries=1, retry_delay_seconds=10, retry_condition_fn=retry_on_transient)
def rl_task(cfg: RLConfig, dataset: dict, store_uri: str = "", parent_run_id: str = "") -> dict:
    """RL from `cfg.policy` on the dataset's RL problems with tools over its corpus (mini-web served here)."""
    key = stage_key("rl", cfg, {"dataset": dataset["digest"]})

    def train(work_dir: Path) -> dict:
        data = fetch(dataset["uri"], work_dir / "dataset")
        with serve_corpus(cfg.toolbox, data / "corpus.jsonl", corpus_uri=f"{dataset['uri']}/corpus.jsonl") as toolbox:
            run_cfg = cfg.model_copy(update={"output_dir": str(work_dir / "run"), "toolbox": toolbox,
                                             "problems_path": str(data / "rl_problems.jsonl")})
            result = train_rl(run_cfg)
        shutil.rmtree(data, ignore_errors=True)
        rewards = [h["reward_mean"] for h in result.history]
        return {"policy_dir": str(result.model_dir), "run_id": result.run_id,
                "model_version": result.model_version, "history": result.history[-1:],
                "reward_first": rewards[0] if rewards else None, "reward_last": rewards[-1] if rewards else None,
                "real_tool_calls": result.real_tool_calls, "wall_s": result.wall_s}

    inputs = [store_dataset(dataset, "rl_problems.jsonl", "training"), store_dataset(dataset, "corpus.jsonl", "tools")]
    return _model_artifact("rl", key, store_uri or default_store_uri(), train, parent_run_id, inputs)
