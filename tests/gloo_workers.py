"""Run a function on N spawned CPU processes joined in one gloo process group, without Ray: the harness of the
multi-process SFT and RL-learner tests (FSDP/DDP equivalence).

    spawn_on_gloo(work, world_size, *args)   # each process calls work(rank, world_size, *args)

`work` must be a module-level function (spawn pickles it by name). Each process uses one torch thread, so 2
workers on a 2-core machine do not oversubscribe it.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, work: Callable[..., None], world_size: int, port: int, args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        work(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
    # Done and its result written: leave without the interpreter's teardown. A spawned gloo worker sometimes
    # aborted there ("terminate called without an active exception": a native thread still joinable at exit),
    # after its work had finished correctly, failing the test (1 of 3 full CI runs on 2026-12-05). A failed run
    # raises above and never gets here, so errors still fail the test.
    os._exit(0)


def spawn_on_gloo(work: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run work(rank, world_size, *args) on `world_size` spawned processes in one gloo group; raises if any fails."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_entry, args=(work, world_size, port, args), nprocs=world_size, join=True)
