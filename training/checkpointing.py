"""Training checkpoints shared by SFT and RL: model + optimizer + scheduler + RNG + caller state, atomic, keep last K.

A checkpoint is a directory:
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
    with open(directory / STATE_FILE, "w", encoding="utf-8") as handle:
        json.dump(state, handle, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
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
        if target.exists():  # re-saving a step after a resume: replace the older copy
            shutil.rmtree(target)
        os.replace(tmp, target)
        _fsync_dir(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    prune_checkpoints(root, keep_last)
    return target


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
