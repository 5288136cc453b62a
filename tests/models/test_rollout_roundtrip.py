"""The token round trip on a real multi-turn rollout: generate, insert observations, parse, re-tokenize."""
from __future__ import annotations

import pytest

from models.engines.hf import HFEngine
from models.format import TOOL_TAGS, Trajectory, parse_segments, validate_trajectory
from models.tokenizer import TokenRoundTripError, check_token_roundtrip, decode, encode_observation, encode_prompt
from tests.models.conftest import SYSTEM_PROMPT, sample_trajectory


def _rollout(engine, tokenizer, traj):
    """Greedy agent loop: on a tool-call stop, append that step's observation (from `traj`), until </answer>."""
    observations = iter(s.text for s in traj.segments if s.tag == "observation")
    prompt = encode_prompt(tokenizer, traj.question, SYSTEM_PROMPT)
    response: list[int] = []
    for _ in range(10):
        gen = engine.generate([prompt + response], max_new_tokens=100, temperature=0)[0]
        response += gen.token_ids
        if gen.stop not in {f"</{t}>" for t in TOOL_TAGS}:
            break
        response += encode_observation(tokenizer, next(observations))
    return prompt, response


def test_roundtrip_holds_on_a_generated_rollout(memorized_model, tokenizer):
    reference = sample_trajectory(0)
    prompt, response = _rollout(HFEngine(memorized_model, tokenizer), tokenizer, reference)
    segments = parse_segments(decode(tokenizer, response))
    traj = Trajectory(id="r", question=reference.question, family="multihop", segments=segments,
                      answer=segments[-1].text)
    validate_trajectory(traj)
    assert [s.tag for s in segments] == [s.tag for s in reference.segments]
    check_token_roundtrip(tokenizer, prompt, response, traj, SYSTEM_PROMPT)

    # The same rollout with one generated token re-spelled (same text, other ids) must fail the check.
    think_close = tokenizer.convert_tokens_to_ids("</think>")
    pos = response.index(think_close)
    respelled = response[:pos] + tokenizer.encode("</", add_special_tokens=False, split_special_tokens=True) \
        + tokenizer.encode("think>", add_special_tokens=False, split_special_tokens=True) + response[pos + 1:]
    assert decode(tokenizer, respelled) == decode(tokenizer, response)
    with pytest.raises(TokenRoundTripError, match=f"token {pos} differs.*context before: '.*employer of person 0.'"):
        check_token_roundtrip(tokenizer, prompt, respelled, traj, SYSTEM_PROMPT)
