"""Training checkpoints: model + optimizer + scheduler + RNG + caller state, atomic, keep last K.

Two layouts, the same directory naming, atomicity and pruning:
- sharded (SFT, any parallelism): `save_sharded_checkpoint` / `load_sharded_checkpoint`. torch.distributed.
  checkpoint (DCP) writes every rank's own shard of model and optimizer (`__<rank>_0.distcp` + `.metadata`);
  rank 0 adds scheduler.pt, rng.pt, trainer_state.json. Loading reshards: a checkpoint written by 2 workers
  resumes on 1 or 4 (FSDP2 DTensors and DDP/plain tensors alike, through get_state_dict/set_state_dict).
- whole (RL's single-process learner): `save_checkpoint` / `load_checkpoint`, the files below.

A whole checkpoint is a directory:
    model.pt            model state_dict (DDP wrapper removed)
    optimizer.pt        optimizer state_dict
    scheduler.pt        LR scheduler state_dict
    rng.pt              Python, NumPy, torch CPU (and CUDA when present) RNG states
    trainer_state.json  {"step": N, ...caller state: data position, elapsed time, metrics}

Usage:
    path = save_checkpoint(root, step, model, optimizer, scheduler, {"epoch": 1, "step_in_epoch": 7}, keep_last=3)
    latest = latest_checkpoint(root)                                   # None before the first save
    state = load_checkpoint(latest, model, optimizer, scheduler)       # restores RNG too; returns trainer_state
    write_checkpoint(tmp_dir, ...)                                      # same files into a given dir (Ray Train)
    save_sharded_checkpoint(root, step, model, optimizer, scheduler, state, keep_last, rank)   # on every rank
    state = load_sharded_checkpoint(latest_checkpoint(root), model, optimizer, scheduler)     # on every rank

Atomicity: everything is written into a hidden temp directory next to the target, fsynced, then renamed to
`step-XXXXXXXX`; a process killed mid-save (kill -9) leaves only a `.tmp-*` directory, which
`latest_checkpoint` ignores and the next save removes. Pruning to `keep_last` happens after the rename, so
the newest complete checkpoint always exists. RNG is captured from the calling process only; trainers that
seed every data-parallel rank the same way (ours) restore the same state on every rank.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The bare model under a DistributedDataParallel wrapper (its state_dict keys have no `module.` prefix)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def capture_rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_fsynced(obj: Any, path: Path) -> None:
    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _write_json_fsynced(obj: Any, path: Path) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(obj, handle, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())


def write_checkpoint(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict[str, Any],
) -> Path:
    """Write the checkpoint files into an existing (empty) `directory`; `state` must be JSON-serialisable."""
    directory = Path(directory)
    _save_fsynced(unwrap_model(model).state_dict(), directory / "model.pt")
    _save_fsynced(optimizer.state_dict(), directory / "optimizer.pt")
    _save_fsynced(scheduler.state_dict(), directory / "scheduler.pt")
    _save_fsynced(capture_rng_state(), directory / "rng.pt")
    _write_json_fsynced(state, directory / STATE_FILE)
    return directory


def write_sharded_checkpoint(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict[str, Any],
    rank: int,
) -> Path:
    """Collective: this rank's shard of model + optimizer into `directory` (DCP); rank 0 adds scheduler, RNG
    and `state`. Ranks may pass different local directories (Ray Train merges the reported ones)."""
    directory = Path(directory)
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory, no_dist=not dist.is_initialized())
    if rank == 0:
        _save_fsynced(scheduler.state_dict(), directory / "scheduler.pt")
        _save_fsynced(capture_rng_state(), directory / "rng.pt")
        _write_json_fsynced(state, directory / STATE_FILE)
    return directory


def checkpoint_dirs(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: Path) -> Path | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


def prune_checkpoints(root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` complete checkpoints, and leftovers of interrupted saves."""
    for stale in checkpoint_dirs(root)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(stale)
    for leftover in Path(root).glob(".tmp-step-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _publish(tmp: Path, target: Path, keep_last: int) -> None:
    """Rename a completely written `tmp` to `target` (replacing an older copy), then prune to `keep_last`."""
    if target.exists():  # re-saving a step after a resume: replace the older copy
        shutil.rmtree(target)
    os.replace(tmp, target)
    _fsync_dir(target.parent)
    prune_checkpoints(target.parent, keep_last)


def save_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict[str, Any],
    keep_last: int,
) -> Path:
    """Atomically write checkpoint `root/step-XXXXXXXX` (state gets `step`), then keep the newest `keep_last`."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"step-{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step-{step:08d}-", dir=root))
    try:
        write_checkpoint(tmp, model, optimizer, scheduler, {**state, "step": step})
        _publish(tmp, target, keep_last)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def save_sharded_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict[str, Any],
    keep_last: int,
    rank: int,
) -> Path:
    """Collective, on a directory every rank sees: write `root/step-XXXXXXXX` atomically, keep the newest K."""
    root = Path(root)
    target = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"  # one name all ranks agree on; rank 0 renames it once all wrote
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    write_sharded_checkpoint(tmp, model, optimizer, scheduler, {**state, "step": step}, rank)
    _barrier()
    if rank == 0:
        _publish(tmp, target, keep_last)
    _barrier()
    return target


def load_sharded_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    """Collective: load a sharded checkpoint into this rank's (possibly differently sharded) model and
    optimizer; restore scheduler and RNG; return trainer_state."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{path}: no {STATE_FILE}; not a checkpoint written by training.checkpointing")
    model_state, optim_state = get_state_dict(model, optimizer)
    loaded = {"model": model_state, "optim": optim_state}
    dcp.load(loaded, checkpoint_id=path, no_dist=not dist.is_initialized())  # fills the tensors in place, each rank reading only its own slices
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    restore_rng_state(torch.load(path / "rng.pt", weights_only=False))  # our own file (see load_checkpoint)
    return json.loads((path / STATE_FILE).read_text())


def load_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint into `model` (and optimizer/scheduler when given); restore RNG; return trainer_state."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{path}: no {STATE_FILE}; not a checkpoint written by training.checkpointing")
    unwrap_model(model).load_state_dict(torch.load(path / "model.pt", map_location="cpu", weights_only=True))
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    if restore_rng:
        # RNG states hold NumPy/Python objects: weights_only loading cannot unpickle them; the file is ours.
        restore_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return json.loads((path / STATE_FILE).read_text())
