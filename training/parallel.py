"""Data parallelism for SFT: one `parallelize` call turns the loaded HF model into what the loop trains.

    model = parallelize(model, "fsdp", device, world_size, bf16=True, activation_checkpointing=True)
    with grad_sync(model, enabled=is_last_micro_batch): loss.backward()
    base = hf_model(model)      # the save_pretrained-able module under any wrapper

- `ddp`: torch's DistributedDataParallel when world_size > 1 (what Ray Train's prepare_model did), the bare
  model on one worker. Every worker holds the full fp32 model, gradients and AdamW state.
- `fsdp`: FSDP2 (`torch.distributed.fsdp.fully_shard`) on every decoder layer, then on the root (embeddings,
  final norm, LM head). Parameters, gradients and optimizer state are sharded 1/world_size per worker;
  a layer's full weights exist only while it runs. Needs a process group even on one worker (Ray Train makes
  one; `single_process_group` for a plain process). On several workers only rank 0 reads the checkpoint;
  the others build it on the meta device and `fill_from_rank0` broadcasts their shards after sharding. Master weights stay fp32: on GPU with `bf16`, a
  MixedPrecisionPolicy casts them to bf16 for compute and reduces gradients in fp32; on CPU all stays fp32.

Activation checkpointing is transformers' own (each decoder layer's `forward` re-runs in backward, non-reentrant
torch checkpoint). transformers wraps `forward`, not `__call__`, so FSDP2's all-gather hooks stay outside the
checkpoint and are not replayed by the recompute (transformers.modeling_layers.GradientCheckpointingLayer).

The same functions run on 2 CPU cores (gloo) and on an 8-GPU node (NCCL): the config picks, not the code.
"""
from __future__ import annotations

import contextlib
import socket
from typing import Iterator, Literal

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

Parallelism = Literal["ddp", "fsdp"]


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of an HF causal LM (Qwen2/2.5/3, Llama: `model.model.layers`)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no `model.layers`; FSDP needs the decoder blocks to shard them one by one")
    return list(layers)


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer in backward instead of keeping its activations (non-reentrant)."""
    # transformers >= 5.20 renamed the method; the GPU check machine's transformers (5.17) has the old name only.
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable()
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def mixed_precision(device: torch.device, bf16: bool) -> MixedPrecisionPolicy:
    """bf16 compute + fp32 gradient reduction on GPU; fp32 throughout on CPU (bf16 matmuls are slow there)."""
    if bf16 and device.type == "cuda":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def parallelize(
    model: torch.nn.Module, parallelism: Parallelism, device: torch.device, world_size: int, bf16: bool,
    activation_checkpointing: bool,
) -> torch.nn.Module:
    """Wrap a freshly loaded fp32 HF model for training on `world_size` workers (see module doc)."""
    if activation_checkpointing:
        enable_activation_checkpointing(model)
    if parallelism == "ddp":
        model = model.to(device)
        if world_size == 1:
            return model
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    mesh = init_device_mesh(device.type, (world_size,))
    policy = mixed_precision(device, bf16)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    # The root group holds embeddings, final norm and LM head (tied or not); fully_shard moves the local
    # shards to the mesh's device, so the full fp32 model never has to fit on one GPU.
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def fill_from_rank0(model: torch.nn.Module, full_state: dict[str, torch.Tensor], rank: int, device: torch.device) -> None:
    """Collective, after `parallelize(..., "fsdp", ...)`: rank 0 holds the loaded weights (`full_state`, its
    module's state dict from before sharding), the other ranks a meta-device model; every rank gets its shards
    broadcast from rank 0, and its buffers (rotary frequencies, not in the state dict) copied from rank 0.
    One fp32 copy of the model in host memory per job instead of one per worker."""
    if rank != 0:
        model.to_empty(device=device)
    set_model_state_dict(model, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


def hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The HF module under a DDP wrapper (FSDP2 shards the module in place: it is its own HF module)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@contextlib.contextmanager
def grad_sync(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Backward passes inside reduce gradients across workers only when `enabled` (the last micro-batch of a
    step); earlier micro-batches accumulate locally (DDP: unreduced full grads; FSDP2: unsharded grads)."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        yield
    elif isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
    else:
        yield


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm (over all shards and workers); returns the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    # Under FSDP2 the norm of DTensor gradients is a DTensor: its full value needs the cross-shard reduction.
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


@contextlib.contextmanager
def single_process_group(backend: str) -> Iterator[None]:
    """A one-process group (rank 0 of 1) for FSDP outside Ray Train (local runs, the GPU check); destroyed on
    exit if made here. An existing group is used as is."""
    if dist.is_initialized():
        yield
        return
    with socket.socket() as sock:  # a free port: several local jobs may run on one machine
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
