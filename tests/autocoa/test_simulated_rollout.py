"""Simulated-environment rollouts (AutoCoA RL stage 1): the policy's engine writes each observation, no tool
ever runs, and the imagined observation tokens are masked (loss mask 0, logprob 0.0).

    .venv/bin/python -m pytest tests/autocoa/test_simulated_rollout.py -q
"""
from __future__ import annotations

from models.engines.base import Generation
from models.format import OBSERVATION_CLOSE, OBSERVATION_OPEN, Segment
from models.tokenizer import decode
from problems.records import Problem
from training.rl_rollout import RolloutConfig, rollout_stats, run_rollouts

IMAGINED = "Zarno was directed by Kell Brin."


class ScriptedEngine:
    """Plays the policy: a search first, an answer once an observation is in context; and, asked to continue
    after an observation's open tag, writes an imagined observation (cut when `cut_observation`)."""

    def __init__(self, tokenizer, cut_observation: bool = False):
        self.tok = tokenizer
        self.cut_observation = cut_observation
        self.open_ids = tokenizer(OBSERVATION_OPEN, add_special_tokens=False)["input_ids"]
        self.calls: list[tuple[int, tuple[str, ...]]] = []

    def _gen(self, text: str, stop: str | None, finish: str = "stop") -> Generation:
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        return Generation(ids, [-0.5] * len(ids), text, finish, stop)

    def generate(self, prompts, *, max_new_tokens, temperature=1.0, top_p=1.0, stop=(), seed=None):
        self.calls.append((len(prompts), tuple(stop)))
        out = []
        for ids in prompts:
            if ids[-len(self.open_ids):] == self.open_ids:
                out.append(self._gen(IMAGINED, None, "length") if self.cut_observation
                           else self._gen(IMAGINED + "\n</observation>", "</observation>"))
            elif "<observation>" in decode(self.tok, ids):
                out.append(self._gen("<answer>Kell Brin</answer>", "</answer>"))
            else:
                out.append(self._gen("<think>Search it.</think><web_search>Zarno</web_search>", "</web_search>"))
        return out


class RefusingToolbox:
    def call(self, tag, argument):
        raise AssertionError(f"a simulated rollout ran the tool {tag}({argument!r})")


PROBLEMS = [Problem(id=f"p{i}", question="Who directed Zarno?", answers=["Kell Brin"], family="multihop")
            for i in range(2)]


def test_simulated_rollout_never_runs_a_tool_and_masks_the_imagined_observation(tokenizer):
    engine = ScriptedEngine(tokenizer)
    cfg = RolloutConfig(group_size=2, simulated_env=True, token_budget=200)
    episodes = run_rollouts(engine, tokenizer, RefusingToolbox(), PROBLEMS, cfg, seed=0)
    # turn 1 (4 episodes) -> their 4 observations in ONE call, stopped at </observation> -> turn 2 answers
    assert engine.calls[1] == (4, ("</observation>",)) and len(engine.calls) == 3
    for ep in episodes:
        assert ep.status == "answered" and [(c.tag, c.argument, c.status) for c in ep.tool_calls] == \
            [("web_search", "Zarno", "simulated")]
        masked = [i for i, m in enumerate(ep.loss_mask) if m == 0]
        assert masked == list(range(masked[0], masked[-1] + 1))  # one contiguous masked run: the observation
        assert decode(tokenizer, [ep.response_ids[i] for i in masked]) == OBSERVATION_OPEN + IMAGINED + OBSERVATION_CLOSE
        assert all(ep.rollout_logprobs[i] == 0.0 for i in masked)
        assert all(lp == -0.5 for lp, m in zip(ep.rollout_logprobs, ep.loss_mask) if m)
        assert IMAGINED not in ep.model_text  # rewards never read the imagined text as the model's answer
        assert Segment("observation", IMAGINED) in ep.segments
    stats = rollout_stats(episodes)
    assert stats.observation_tokens == sum(len(ep.response_ids) - sum(ep.loss_mask) for ep in episodes) > 0


def test_an_observation_cut_by_length_is_closed_and_still_masked(tokenizer):
    cfg = RolloutConfig(group_size=1, simulated_env=True, token_budget=200)
    [ep, _] = run_rollouts(ScriptedEngine(tokenizer, cut_observation=True), tokenizer, RefusingToolbox(), PROBLEMS, cfg, seed=0)
    masked = [t for t, m in zip(ep.response_ids, ep.loss_mask) if m == 0]
    assert decode(tokenizer, masked) == OBSERVATION_OPEN + IMAGINED + OBSERVATION_CLOSE
    assert ep.status == "answered"
