"""In-process generation with a transformers causal LM: batched, KV-cached, per-sequence stop, token logprobs.

`model.generate` cannot give both per-token logprobs under the sampling temperature and per-sequence stop
strings that include the stop token, so this is a small sampling loop over `model.forward` with a
`DynamicCache`: prompts are left-padded into one batch (attention mask + explicit position ids, so padding
changes nothing), then one token per step for every sequence still running; finished sequences leave the
batch and the cache.

Logprobs: `logprobs[i]` is log softmax(logits / temperature)[token_i], the distribution BEFORE top-p truncation,
i.e. exactly what the learner recomputes with one forward pass at the same temperature (the importance ratio
in GRPO compares like with like). At temperature 0 (greedy) the temperature-1 distribution is used.

transformers 5.20-5.25: the cache keyword of `forward` is `past_key_values` before 5.24 and `cache` from 5.24 on
(the old name still works there, deprecated, with a warning); `cache_kwarg` picks the one this model reads.

Usage:
    engine = HFEngine(model, tokenizer)
    gens = engine.generate(prompt_id_lists, max_new_tokens=256, temperature=1.0, seed=0)
"""
from __future__ import annotations

import inspect
from typing import Mapping, Sequence

import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from models.engines.base import Generation
from models.format import STOP_STRINGS
from models.tokenizer import decode


def cache_kwarg(model: torch.nn.Module) -> str:
    """The keyword under which `model.forward` takes its KV cache: `cache` (transformers >= 5.24) or
    `past_key_values` (5.20-5.23). The wrong name is no error on 5.20-5.23: it falls into `**kwargs`, the model
    runs without the cache and every decode step sees only its newest token (the HF engine tests fail there)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return "cache" if Version(transformers.__version__).release >= (5, 24) else "past_key_values"


def sample_next_tokens(
    logits: torch.Tensor, temperature: float, top_p: float,
    generator: torch.Generator | Sequence[torch.Generator] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B], logprobs [B]) from last-position logits [B, V]; see the module docstring for the logprobs.
    `generator`: one for the batch, or one per row (each row's draw then depends on its own generator only)."""
    logits = logits.float()
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1)
    else:
        logprobs = torch.log_softmax(logits / temperature, dim=-1)
        probs = logprobs.exp()
        if top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it already does.
            drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        if isinstance(generator, (list, tuple)):
            tokens = torch.cat([torch.multinomial(row, 1, generator=g) for row, g in zip(probs, generator)])
        else:
            tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


class HFEngine:
    """GenerationEngine over a transformers model held in this process (shared with the learner or not)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_batch_size: int = 64):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.eos_ids = eos_ids | {tokenizer.eos_token_id}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state_dict)

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
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        generator: torch.Generator | list[torch.Generator] | None = None
        if seed is not None and temperature > 0:
            if isinstance(seed, int):
                generator = torch.Generator(device=self.model.device).manual_seed(seed)
            else:
                if len(seed) != len(prompts):
                    raise ValueError(f"{len(seed)} seeds for {len(prompts)} prompts: pass one seed per prompt")
                generator = [torch.Generator(device=self.model.device).manual_seed(s) for s in seed]
        was_training = self.model.training
        self.model.eval()
        try:
            out: list[Generation] = []
            for start in range(0, len(prompts), self.max_batch_size):
                chunk = prompts[start:start + self.max_batch_size]
                gens = generator[start:start + self.max_batch_size] if isinstance(generator, list) else generator
                out += self._generate_batch(chunk, max_new_tokens, temperature, top_p, tuple(stop), gens)
            return out
        finally:
            self.model.train(was_training)

    def _find_stop(self, tails: list[list[int]], stop: tuple[str, ...]) -> list[str | None]:
        """The stop string each token tail contains (it can only end in the newest token), else None."""
        if not stop:
            return [None] * len(tails)
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return [next((s for s in stop if s in text), None) for text in texts]

    @torch.inference_mode()
    def _generate_batch(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop: tuple[str, ...],
        generator: torch.Generator | list[torch.Generator] | None,
    ) -> list[Generation]:
        device = self.model.device
        batch, width = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention[row, width - len(prompt):] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        kv = {cache_kwarg(self.model): cache}
        logits = self.model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, **kv,
            use_cache=True, logits_to_keep=1,
        ).logits[:, -1]
        next_pos = positions[:, -1:] + 1

        # A stop string of n characters spans at most n byte-level tokens; one more covers a partial first token.
        tail_len = max((len(s.encode()) for s in stop), default=0) + 1
        token_ids: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        finish: list[tuple[str, str | None] | None] = [None] * batch
        active = list(range(batch))  # original row of each sequence still in the batch
        for _ in range(max_new_tokens):
            row_generator = [generator[row] for row in active] if isinstance(generator, list) else generator
            tokens, token_logprobs = sample_next_tokens(logits, temperature, top_p, row_generator)
            for row, tok, lp in zip(active, tokens.tolist(), token_logprobs.tolist()):
                token_ids[row].append(tok)
                logprobs[row].append(lp)
                if tok in self.eos_ids:
                    finish[row] = ("stop", None)
            check = [row for row in active if finish[row] is None]
            for row, hit in zip(check, self._find_stop([token_ids[r][-tail_len:] for r in check], stop)):
                if hit is not None:
                    finish[row] = ("stop", hit)
            keep = [pos for pos, row in enumerate(active) if finish[row] is None]
            if not keep:
                break
            if len(keep) < len(active):
                # Drop finished sequences from the batch and the KV cache: rollouts stop at very different steps.
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                tokens, attention, next_pos = tokens[index], attention[index], next_pos[index]
                active = [active[pos] for pos in keep]
            attention = torch.cat([attention, attention.new_ones((len(active), 1))], dim=-1)
            logits = self.model(
                input_ids=tokens[:, None], attention_mask=attention, position_ids=next_pos, **kv,
                use_cache=True,
            ).logits[:, -1]
            next_pos = next_pos + 1
        return [
            Generation(
                token_ids=ids, logprobs=lps, text=decode(self.tokenizer, ids),
                finish_reason=(f or ("length", None))[0], stop=(f or ("length", None))[1],
            )
            for ids, lps, f in zip(token_ids, logprobs, finish)
        ]
