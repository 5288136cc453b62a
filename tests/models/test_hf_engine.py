"""HFEngine: equal to greedy `model.generate`, batch-invariant, stops where asked, logprobs of a forward pass."""
from __future__ import annotations

import pytest
import torch

from models.engines.hf import HFEngine, cache_kwarg, sample_next_tokens
from models.tokenizer import decode, encode_observation, encode_prompt, encode_segments
from tests.models.conftest import SYSTEM_PROMPT, sample_trajectory


def _prompts(tokenizer, n=5):
    return [encode_prompt(tokenizer, f"Question {i}: " + "who founded Acme? " * (i % 3 + 1)) for i in range(n)]


def _forward_logprobs(model, prompt, completion, temperature):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_the_kv_cache_reaches_the_model(tiny_model, tokenizer):
    """transformers renamed forward's `past_key_values` to `cache` in 5.24; under the other name the cache
    would fall into **kwargs unused. The keyword the engine picks must fill the cache on this version."""
    from transformers import DynamicCache

    cache = DynamicCache(config=tiny_model.config)
    ids = torch.tensor([_prompts(tokenizer, 1)[0]])
    with torch.no_grad():
        tiny_model(input_ids=ids, use_cache=True, **{cache_kwarg(tiny_model): cache})
    assert cache.get_seq_length() == ids.shape[1]


def test_greedy_equals_model_generate(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    for prompt in _prompts(tokenizer, 3):
        gen = engine.generate([prompt], max_new_tokens=24, temperature=0, stop=())[0]
        ids = torch.tensor([prompt])
        ref = tiny_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
        assert gen.token_ids == ref[0, len(prompt):].tolist()
        assert gen.text == decode(tokenizer, gen.token_ids)


def test_batched_equals_unbatched(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    prompts = _prompts(tokenizer, 5)  # different lengths: left padding is exercised
    batched = engine.generate(prompts, max_new_tokens=16, temperature=0, stop=())
    for prompt, gen in zip(prompts, batched):
        single = engine.generate([prompt], max_new_tokens=16, temperature=0, stop=())[0]
        assert gen.token_ids == single.token_ids
        assert torch.allclose(torch.tensor(gen.logprobs), torch.tensor(single.logprobs), atol=1e-4)
    chunked = HFEngine(tiny_model, tokenizer, max_batch_size=2).generate(prompts, max_new_tokens=16, temperature=0, stop=())
    assert [g.token_ids for g in chunked] == [g.token_ids for g in batched]


def test_batched_equals_unbatched_when_sequences_finish_at_different_steps(memorized_model, tokenizer):
    """Finished sequences leave the batch and the KV cache; the others must not notice."""
    engine = HFEngine(memorized_model, tokenizer)
    traj = sample_trajectory(0)
    prompts = [encode_prompt(tokenizer, traj.question, SYSTEM_PROMPT)] + _prompts(tokenizer, 3)
    prompts.append(prompts[0] + encode_segments(tokenizer, traj.segments[:1]).input_ids)  # stops sooner
    batched = engine.generate(prompts, max_new_tokens=30, temperature=0)
    assert {g.finish_reason for g in batched} == {"stop", "length"}  # some leave the batch early
    for prompt, gen in zip(prompts, batched):
        single = engine.generate([prompt], max_new_tokens=30, temperature=0)[0]
        assert (gen.token_ids, gen.stop, gen.finish_reason) == (single.token_ids, single.stop, single.finish_reason)
        assert torch.allclose(torch.tensor(gen.logprobs), torch.tensor(single.logprobs), atol=1e-4)


def test_logprobs_equal_a_forward_pass_at_the_temperature(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    prompts = _prompts(tokenizer, 3)
    for temperature, top_p in ((0.7, 1.0), (1.3, 0.9), (0, 1.0)):
        gens = engine.generate(prompts, max_new_tokens=12, temperature=temperature, top_p=top_p, stop=(), seed=3)
        for prompt, gen in zip(prompts, gens):
            ref = _forward_logprobs(tiny_model, prompt, gen.token_ids, temperature or 1.0)
            assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-4)


def test_sampling_is_seeded(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    prompts = _prompts(tokenizer, 4)
    a = engine.generate(prompts, max_new_tokens=10, seed=7, stop=())
    b = engine.generate(prompts, max_new_tokens=10, seed=7, stop=())
    c = engine.generate(prompts, max_new_tokens=10, seed=8, stop=())
    assert [g.token_ids for g in a] == [g.token_ids for g in b] != [g.token_ids for g in c]


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(0)
    seen = {int(sample_next_tokens(logits, 1.0, 0.75, gen)[0]) for _ in range(300)}
    assert seen == {0, 1}
    seen = {int(sample_next_tokens(logits, 1.0, 0.81, gen)[0]) for _ in range(300)}
    assert seen == {0, 1, 2}


def test_stops_at_tool_call_answer_and_eos_per_sequence(memorized_model, tokenizer):
    """The memorized model writes sample_trajectory(0): it must stop right after `</web_search>`, and a
    second sequence in the same batch with a different stop list keeps going independently."""
    engine = HFEngine(memorized_model, tokenizer)
    traj = sample_trajectory(0)
    prompt = encode_prompt(tokenizer, traj.question, SYSTEM_PROMPT)
    first = engine.generate([prompt], max_new_tokens=200, temperature=0)[0]
    assert first.finish_reason == "stop" and first.stop == "</web_search>"
    assert first.token_ids == encode_segments(tokenizer, traj.segments[:3]).input_ids
    assert first.token_ids[-1] == tokenizer.convert_tokens_to_ids("</web_search>")

    plan_only = engine.generate([prompt], max_new_tokens=200, temperature=0, stop=["</plan>"])[0]
    assert plan_only.stop == "</plan>" and plan_only.text.endswith("</plan>")
    # A stop string that is not a token of its own (spans several byte-level tokens) is found in the text.
    words = engine.generate([prompt], max_new_tokens=200, temperature=0, stop=["employer of"])[0]
    assert len(tokenizer.encode("employer of", add_special_tokens=False)) > 1
    assert words.stop == "employer of" and words.text.endswith("employer of")

    truncated = engine.generate([prompt], max_new_tokens=3, temperature=0)[0]
    assert truncated.finish_reason == "length" and truncated.stop is None and len(truncated.token_ids) == 3

    # Continue to the end with observations inserted: the final turn stops at </answer>; with no stop
    # strings at all it runs on to eos.
    ids = list(prompt)
    for seg in traj.segments[:-1]:
        ids += encode_observation(tokenizer, seg.text) if seg.tag == "observation" else encode_segments(tokenizer, [seg]).input_ids
    last = engine.generate([ids], max_new_tokens=50, temperature=0)[0]
    assert last.stop == "</answer>" and last.text == "<answer>Alice Smith</answer>"
    to_eos = engine.generate([ids], max_new_tokens=50, temperature=0, stop=())[0]
    assert to_eos.finish_reason == "stop" and to_eos.stop is None and to_eos.token_ids[-1] == tokenizer.eos_token_id


def test_update_weights_changes_generation(tiny_model, memorized_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    prompt = encode_prompt(tokenizer, sample_trajectory(0).question, SYSTEM_PROMPT)
    before = engine.generate([prompt], max_new_tokens=5, temperature=0, stop=())[0].token_ids
    engine.update_weights(memorized_model.state_dict())
    after = engine.generate([prompt], max_new_tokens=5, temperature=0, stop=())[0].token_ids
    assert after == encode_segments(tokenizer, sample_trajectory(0).segments[:1]).input_ids[:5]
    assert before != after


def test_per_prompt_seeds_make_a_sample_independent_of_its_batch(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    together = engine.generate(prompts, max_new_tokens=12, stop=(), seed=[101, 202, 303])
    alone = [engine.generate([p], max_new_tokens=12, stop=(), seed=[s])[0] for p, s in zip(prompts, [101, 202, 303])]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    chunked = HFEngine(tiny_model, tokenizer, max_batch_size=2).generate(prompts, max_new_tokens=12, stop=(),
                                                                         seed=[101, 202, 303])
    assert [g.token_ids for g in chunked] == [g.token_ids for g in together]
    with pytest.raises(ValueError, match="one seed per prompt"):
        engine.generate(prompts, max_new_tokens=2, seed=[1, 2])
