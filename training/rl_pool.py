"""The rollout side of distributed RL on Ray: a pool of rollout actors (engine replicas) and a pool of tool actors.

    pool = RolloutPool(PoolConfig(rollout_workers=2, tool_actors=1), policy_dir, toolbox_cfg)
    seconds = pool.sync(full_state_dict)                  # after every learner update: every replica gets it
    pool.switch_policy(other_dir)                         # evaluation: the next model, same architecture
    episodes = pool.rollout(problems, indices, rollout_cfg, seed)
    pool.checksums()                                      # weights_checksum of every replica
    pool.shutdown()

- Rollout actors (`RolloutWorker`): each loads the policy and runs `run_rollouts` with its own engine (HF on
  CPU or GPU, vLLM on GPU). A step's problems are cut into one contiguous unit per actor; every episode's
  sampling depends only on (seed, its problem's global index, its sample index, turn), so the episodes do not
  depend on how many actors there are or which one ran a unit (up to float effects of batch shape).
- Tool actors (`ToolWorker`, CPU, `num_cpus=0`: they wait on sandboxes and sockets): every tool call of every
  rollout actor goes to one of them, so sandboxes and crawls run on CPU nodes, not next to the GPUs. Each is
  a threaded actor (`max_concurrency`), its calls running concurrently like the in-process tool pool did.
- Weight sync: the learner's gathered weights are put in the Ray object store once (`ray.put`) and every actor
  loads them from there (zero-copy reads on the same node). A version number travels with every rollout call:
  an actor that Ray restarted after a crash comes back with the start policy and version 0, refuses the work
  (`StaleWeights`), is re-synced and gets the unit again.
- Model switch (evaluation runs several models): `switch_policy` has every actor read another checkpoint's
  weights from its directory into the engine it already has, instead of a new pool per model (a rollout
  actor's start, a new process importing torch and loading the policy, was ~6-8 s of every model's
  evaluation on 2 cores). Only for the same architecture and tokenizer (`same_architecture`).
- Faults: a unit whose actor died (`RayActorError`) or was stale is resubmitted (same seed, same episodes) up to
  `max_unit_attempts` times; results are keyed by unit, so every episode appears exactly once.

What this does NOT do: NCCL/IPC weight transfer into remote vLLM engines (vLLM's weight-transfer API needs the
learner and the engines in one NCCL group; here weights go through the object store: on one 8-GPU node that is
a host round trip of the bf16 weights per step, measured as `sync_s`).
"""
from __future__ import annotations

import itertools
import json
import os
import threading
import time
from pathlib import Path
from typing import Literal, Mapping, Sequence

import ray
import torch
from pydantic import Field
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from afm.config import Config
from agents.tools.base import ToolResult
from agents.tools.toolbox import ToolboxConfig, build_toolbox
from models.policy import load_policy
from problems.records import Problem
from training.rl_learner import weights_checksum
from training.rl_rollout import Episode, RolloutConfig, run_rollouts


class PoolConfig(Config):
    """Where rollouts and tools run."""

    rollout_workers: int = Field(1, ge=1, description="Rollout actors, each one engine replica (one GPU each with use_gpu).")
    tool_actors: int = Field(1, ge=1, description="CPU actors that run the tool calls of all rollout actors.")
    tool_concurrency: int = Field(8, ge=1, description="Tool calls one tool actor runs at once (threads).")
    engine: Literal["hf", "vllm"] = Field("hf", description="Rollout engine: transformers (CPU or GPU), or vLLM (GPU).")
    use_gpu: bool = Field(False, description="Give every rollout actor a GPU (or gpus_per_worker of one).")
    gpus_per_worker: float = Field(1.0, gt=0.0, le=1.0, description="GPU share of a rollout actor with use_gpu: 1, or "
                                                                    "e.g. 0.5 to colocate it with a learner on one GPU.")
    sleep_between_steps: bool = Field(False, description="vLLM: the engine sleeps (frees its GPU memory) from the end "
                                                         "of its rollouts until the next weight sync, so a colocated "
                                                         "learner can use it for the update.")
    threads_per_worker: int = Field(0, ge=0, description="torch threads of a CPU rollout actor (0 = this node's "
                                                         "CPUs / rollout_workers).")
    max_unit_attempts: int = Field(3, ge=1, description="Tries per unit of work before the step fails (a dead "
                                                        "actor's unit goes to its restarted self).")
    max_model_len: int = Field(4096, ge=64, description="vLLM context length (prompt + response).")
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0, description="vLLM's share of its GPU.")


class StaleWeights(RuntimeError):
    """A rollout actor was asked for work with weights it does not hold (it was restarted)."""


class ToolWorker:
    """One toolbox (build_toolbox) behind a Ray actor; `call` is ToolBox.call."""

    def __init__(self, toolbox_cfg: ToolboxConfig):
        self.toolbox = build_toolbox(toolbox_cfg)

    def call(self, tag: str, argument: str) -> ToolResult:
        return self.toolbox.call(tag, argument)

    def pid(self) -> int:
        return os.getpid()


class ToolPoolCaller:
    """A `ToolCaller` for rollouts that sends each call to the next tool actor (round robin)."""

    def __init__(self, actors: Sequence):
        self.actors = list(actors)
        self._next = itertools.cycle(range(len(self.actors)))
        self._lock = threading.Lock()

    def call(self, tag: str, argument: str) -> ToolResult:
        with self._lock:
            actor = self.actors[next(self._next)]
        return ray.get(actor.call.remote(tag, argument))


class RolloutWorker:
    """One engine replica: loads the policy, takes weights, runs rollouts on its share of a step's problems."""

    def __init__(self, policy_dir: str, cfg: PoolConfig, tool_actors: Sequence):
        if not cfg.use_gpu:
            torch.set_num_threads(cfg.threads_per_worker or max(1, (os.cpu_count() or 1) // cfg.rollout_workers))
        self.version = 0
        self.toolbox = ToolPoolCaller(tool_actors)
        model, self.tokenizer = load_policy(policy_dir, device="cuda" if cfg.use_gpu else "cpu")
        if cfg.engine == "hf":
            from models.engines.hf import HFEngine

            self.model = model.eval()
            self.engine = HFEngine(self.model, self.tokenizer)
        else:
            from models.engines.vllm_engine import VLLMEngine  # GPU machines only

            self.model = None
            del model
            self.engine = VLLMEngine(policy_dir, max_model_len=cfg.max_model_len,
                                     gpu_memory_utilization=cfg.gpu_memory_utilization,
                                     enable_sleep_mode=cfg.sleep_between_steps)
        self.sleeps = cfg.sleep_between_steps and cfg.engine == "vllm"

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Take the learner's weights (`checksum` verifies them on demand: hashing every sync would cost ~10 s
        per step for a 7B model)."""
        self.engine.update_weights(state_dict)  # a sleeping vLLM engine wakes its weights first
        if self.sleeps:
            self.engine.wake_up()  # the rest (KV cache) back for the next rollouts
        self.version = version

    def load_policy_weights(self, policy_dir: str, version: int) -> None:
        """Take the weights of the checkpoint in `policy_dir` (same architecture: `same_architecture`)."""
        model, _ = load_policy(policy_dir)
        self.load_weights(model.state_dict(), version)

    def checksum(self) -> str:
        """weights_checksum of the weights the engine generates with (HF engines; vLLM's live in its workers)."""
        if self.model is None:
            raise NotImplementedError("vLLM keeps its weights in its own workers; check them on the learner side")
        return weights_checksum(self.model.state_dict())

    def rollout(self, version: int, problems: list[Problem], indices: list[int], rollout_cfg: RolloutConfig,
                seed: int) -> list[Episode]:
        if version != self.version:
            raise StaleWeights(f"actor holds weights v{self.version}, the step needs v{version}")
        return run_rollouts(self.engine, self.tokenizer, self.toolbox, problems, rollout_cfg, seed=seed,
                            prompt_indices=indices)

    def sleep(self) -> None:
        """Free the engine's GPU memory until the next `load_weights` (level 1: weights offloaded to host, so a
        step that ends without an update can wake them unchanged)."""
        if self.sleeps:
            self.engine.sleep(level=1)

    def pid(self) -> int:
        return os.getpid()


# Fields a save records about how the files were loaded or written, not about the model or the tokenizer.
_BOOKKEEPING = {"_name_or_path", "name_or_path", "transformers_version", "is_local", "local_files_only"}


def same_architecture(a: str | Path, b: str | Path) -> bool:
    """Whether the checkpoints in directories `a` and `b` differ only in their weights: the same model config and
    the same tokenizer (its files, JSON compared without bookkeeping fields), so one engine serves both."""
    def files(d: Path) -> dict:
        found = {}
        for p in sorted(d.glob("*")):
            if p.name == "config.json" or p.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab",
                                                              "merges", "added_tokens")):
                found[p.name] = p.read_bytes()
                if p.suffix == ".json":
                    found[p.name] = {k: v for k, v in json.loads(found[p.name]).items() if k not in _BOOKKEEPING}
        return found
    return files(Path(a)) == files(Path(b))


def _units(count: int, parts: int) -> list[range]:
    """`count` items cut into at most `parts` contiguous, near-equal ranges."""
    parts = min(parts, count) or 1
    size, extra = divmod(count, parts)
    bounds = [0]
    for k in range(parts):
        bounds.append(bounds[-1] + size + (k < extra))
    return [range(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


class RolloutPool:
    """Rollout and tool actors of one RL job (see the module doc). Created on the driver, so the actors outlive
    a learner worker that dies and is restarted; handed to the learner's rank 0 by pickling (actor handles)."""

    def __init__(self, cfg: PoolConfig, policy_dir: str | Path, toolbox_cfg: ToolboxConfig):
        self.cfg = cfg
        tool_actor = ray.remote(ToolWorker).options(num_cpus=0, max_concurrency=cfg.tool_concurrency,
                                                    max_restarts=-1, max_task_retries=-1)
        self.tool_actors = [tool_actor.remote(toolbox_cfg) for _ in range(cfg.tool_actors)]
        resources = {"num_gpus": cfg.gpus_per_worker} if cfg.use_gpu else {"num_cpus": 0}
        # max_restarts: Ray brings a dead actor back (start policy, version 0); the pool re-syncs it.
        # max_task_retries=0: a call that dies with its actor fails here, and the pool decides what to rerun.
        rollout_actor = ray.remote(RolloutWorker).options(max_restarts=-1, max_task_retries=0, **resources)
        self.actors = [rollout_actor.remote(str(policy_dir), cfg, self.tool_actors) for _ in range(cfg.rollout_workers)]
        self.version = 0
        self.policy_dir = str(policy_dir)
        self.weights_ref = None  # the last sync's weights, or None: the actors hold policy_dir's
        self.resubmitted = 0  # units run again after an actor died or was stale (for logs and tests)

    def sync(self, state_dict: Mapping[str, torch.Tensor]) -> float:
        """Every actor loads `state_dict` (one object-store copy); returns the seconds it took."""
        started = time.perf_counter()
        self.version += 1
        self.weights_ref = ray.put(dict(state_dict))
        ray.get([actor.load_weights.remote(self.weights_ref, self.version) for actor in self.actors])
        return time.perf_counter() - started

    def switch_policy(self, policy_dir: str | Path) -> None:
        """Every actor takes the weights of another checkpoint of the same architecture (`same_architecture`),
        read from `policy_dir` by the actor itself (no copy through the driver)."""
        self.version += 1
        self.policy_dir, self.weights_ref = str(policy_dir), None
        ray.get([actor.load_policy_weights.remote(self.policy_dir, self.version) for actor in self.actors])

    def sleep(self) -> None:
        """Colocated vLLM engines free their GPU memory for the update (no-op unless `sleep_between_steps`)."""
        if self.cfg.sleep_between_steps:
            ray.get([actor.sleep.remote() for actor in self.actors])

    def checksums(self) -> list[str]:
        return ray.get([actor.checksum.remote() for actor in self.actors])

    def rollout(self, problems: Sequence[Problem], indices: Sequence[int], rollout_cfg: RolloutConfig,
                seed: int) -> list[Episode]:
        """Episodes of `problems` (global indices `indices`), grouped in problem order; each exactly once."""
        units = _units(len(problems), len(self.actors))
        done: dict[int, list[Episode]] = {}
        attempts = {u: 0 for u in range(len(units))}
        pending = {}  # ObjectRef -> (unit, actor index)

        def submit(unit: int, actor_index: int) -> None:
            attempts[unit] += 1
            span = units[unit]
            ref = self.actors[actor_index].rollout.remote(
                self.version, list(problems[span.start:span.stop]), list(indices[span.start:span.stop]),
                rollout_cfg, seed)
            pending[ref] = (unit, actor_index)

        for unit in range(len(units)):
            submit(unit, unit % len(self.actors))
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            unit, actor_index = pending.pop(ready[0])
            try:
                done[unit] = ray.get(ready[0])
            except (RayActorError, RayTaskError) as exc:
                if isinstance(exc, RayTaskError) and not isinstance(exc.cause, StaleWeights):
                    raise  # a bug in the rollout code, not a lost actor: retrying would hide it
                if attempts[unit] >= self.cfg.max_unit_attempts:
                    raise RuntimeError(f"rollout unit {unit} failed {attempts[unit]} times; last error: {exc}") from exc
                self._resync(actor_index)
                self.resubmitted += 1
                submit(unit, actor_index)
        return [ep for unit in range(len(units)) for ep in done[unit]]

    def _resync(self, actor_index: int, wait_s: float = 300.0) -> None:
        """Give a restarted actor the current weights, waiting up to `wait_s` for Ray to bring it back."""
        if self.version == 0:
            return  # it restarts with the start policy
        actor = self.actors[actor_index]
        deadline = time.monotonic() + wait_s
        while True:
            try:
                ray.get(actor.load_weights.remote(self.weights_ref, self.version) if self.weights_ref is not None
                        else actor.load_policy_weights.remote(self.policy_dir, self.version))
                return
            except ActorUnavailableError:  # still restarting (loading the policy)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def shutdown(self) -> None:
        for actor in self.actors + self.tool_actors:
            ray.kill(actor, no_restart=True)
