"""Load and save a policy (causal LM + tokenizer) from a local directory or an artifact store.

The same call loads the tiny default policy and a real checkpoint directory (e.g. a Qwen2.5 download placed
on disk): both are `save_pretrained` directories. Nothing is ever fetched from a model hub
(`local_files_only=True`); `s3://bucket/prefix/name` URIs are artifacts written with
`afm.storage.ArtifactStore.write_artifact` and are downloaded (sha256-verified) before loading.

Usage:
    model, tok = load_policy("runs/sft-v1/policy")            # or "s3://afm/artifacts/policies/sft-v1"
    model, tok = load_policy(path, device="meta")             # shapes only, no weights read
    save_policy(model, tok, "runs/sft-v1/policy")             # atomic: temp dir + rename
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from afm.storage import local_path, open_store
from models.tokenizer import load_tokenizer


def flush_denormals() -> None:
    """Have this thread's CPU float ops, and those of threads it starts later, treat denormals as zero (FTZ/DAZ).

    Why: a trained policy's activations and gradients carry denormals (the sharp softmaxes of a trained attention
    head), and x86 cores compute with them on a slow path. The default's SFT ran 21.8k tokens/s at its start and
    15.8k by its last steps; from its final checkpoint, 15.3-16.4k tokens/s without this and 20.3-21.8k with it,
    as fast as the untrained model (docs/figures.md). The results differ only where a value falls under 1.2e-38.
    The flag is per thread: it holds for this thread and the threads it starts later (torch's OpenMP pool is made
    at the first op large enough to split), NOT for pool threads that already exist; every trainer, rollout and
    eval worker calls it through `load_policy` before its first such op.
    """
    torch.set_flush_denormal(True)


def _load_local(path: Path, dtype: torch.dtype | None, device: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if not path.exists():
        raise FileNotFoundError(f"policy directory {path} does not exist; pass a save_pretrained directory or s3:// URI")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json: not a save_pretrained model directory")
    tokenizer = load_tokenizer(path)
    if device == "meta":  # the architecture without reading its weights: a sharded trainer's other ranks
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path, local_files_only=True),
                                                    dtype=dtype), tokenizer
    # dtype None keeps the checkpoint's own dtype (float32 for the tiny policy, bf16 for most real ones).
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "auto", local_files_only=True)
    return model.to(device), tokenizer


def load_policy(
    path_or_uri: str | Path, dtype: torch.dtype | None = None, device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) from a local save_pretrained directory or an `s3://.../<artifact>` URI.

    Also calls `flush_denormals()`: every process that trains or generates on CPU loads its policy here before
    its first large op (SFT and RL workers, rollout and eval workers, serving). GPU kernels are not affected."""
    flush_denormals()
    text = str(path_or_uri)
    if not text.startswith("s3://"):
        return _load_local(local_path(text), dtype, device)
    # A store rooted at the parent prefix holds the artifact under its last path component; the resulting
    # object keys are the same whichever split of the prefix is chosen.
    root, _, name = text.rstrip("/").rpartition("/")
    store = open_store(root)
    with tempfile.TemporaryDirectory(prefix="afm-policy-") as tmp:
        local = store.fetch_artifact(name, Path(tmp))
        return _load_local(local, dtype, device)


def save_policy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write model (safetensors) + tokenizer to `out_dir` atomically; an existing `out_dir` is replaced.

    `state_dict`: the weights to write instead of the module's own (a sharded trainer's gathered full state
    dict, in the dtype to store); config.json then records that dtype, not the module's fp32 master weights.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, state_dict=state_dict)
        if state_dict:
            config = json.loads((tmp / "config.json").read_text())
            config["dtype"] = str(next(iter(state_dict.values())).dtype).removeprefix("torch.")
            (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        tokenizer.save_pretrained(tmp)
        if out_dir.exists():
            # A non-empty directory cannot be os.replace'd: move the old policy aside, then the new one in.
            # Between the two renames `out_dir` is briefly absent, but it is never half-written.
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "policy")
            os.replace(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out_dir
