"""Synthetic CoA-like lookup trajectories and their search environment, for SFT tests, benchmarks and the
learnability check (not training data for real runs: the platform's data comes from teacher distillation).

Every trajectory invents FRESH names (syllable names, a few BPE tokens each), so the only way to answer is
to copy from the observation: a model cannot memorise a fixed world. 1-hop: "Where was P born?" (search P,
read the city). 2-hop: "In which country was P born?" (search P -> city C, search C -> country).

    trajectories = synthetic_trajectories(200, seed=0)            # valid per models.format.validate_trajectory
    world = synthetic_world(seed)                                   # for evaluating a policy on fresh names
    text = search_observation(world, "Kato Rimu")                   # what the search tool returns
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from models.format import Segment, Trajectory

_SYLLABLES = ("ka", "to", "ri", "mu", "sa", "ne", "lo", "vi", "da", "ke", "po", "zu", "mi", "ra", "te", "no")


def _name(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


@dataclass
class SyntheticWorld:
    """One question's world: a person, their birth city, the city's country, and a distractor person."""

    person: str
    city: str
    country: str
    other_person: str
    other_city: str
    hops: int

    @property
    def question(self) -> str:
        if self.hops == 1:
            return f"Where was {self.person} born?"
        return f"In which country was {self.person} born?"

    @property
    def answer(self) -> str:
        return self.city if self.hops == 1 else self.country


def synthetic_world(seed: int, hops: int | None = None) -> SyntheticWorld:
    rng = random.Random(seed)
    names: list[str] = []  # a list, not a set: set order varies with PYTHONHASHSEED and the data must not
    while len(names) < 5:
        name = _name(rng, rng.choice((2, 3)))
        if name not in names:
            names.append(name)
    person, city, country, other_person, other_city = names
    person = f"{person} {_name(rng, 2)}"
    other_person = f"{other_person} {_name(rng, 2)}"
    return SyntheticWorld(person, city, country, other_person, other_city, hops or rng.choice((1, 2)))


def search_observation(world: SyntheticWorld, query: str) -> str:
    """The search tool: results for the entity named in `query` (exact name match), in AFM's result format."""
    query = query.strip()
    if query == world.person:
        docs = [f"{world.person} was born in {world.city}.", f"{world.other_person} was born in {world.other_city}."]
    elif query == world.city:
        docs = [f"{world.city} is a city in {world.country}.", f"{world.other_city} is a city in {world.city}."]
    else:
        return "Found 0 results."
    lines = [f"Found {len(docs)} results:"] + [f"{i}. {doc}" for i, doc in enumerate(docs, 1)]
    return "\n".join(lines)


def trajectory_for(world: SyntheticWorld, traj_id: str) -> Trajectory:
    """The gold trajectory for `world`: plan, one search per hop with its observation, reflection, answer."""
    segments = [
        Segment("think", f"I need the birthplace of {world.person}."),
        Segment("plan", f"Search {world.person}." if world.hops == 1 else f"Search {world.person}, then the city."),
        Segment("web_search", world.person),
        Segment("observation", search_observation(world, world.person)),
        Segment("reflection", f"{world.person} was born in {world.city}."),
    ]
    if world.hops == 2:
        segments += [
            Segment("web_search", world.city),
            Segment("observation", search_observation(world, world.city)),
            Segment("think", f"{world.city} is in {world.country}."),
        ]
    segments.append(Segment("answer", world.answer))
    return Trajectory(id=traj_id, question=world.question, family="synthetic-lookup", segments=segments, answer=world.answer)


def synthetic_trajectories(n: int, seed: int = 0) -> list[Trajectory]:
    """`n` trajectories over fresh worlds; seeds `seed*1_000_003 + i` so train and eval seeds never collide."""
    return [trajectory_for(synthetic_world(seed * 1_000_003 + i), f"syn-{seed}-{i}") for i in range(n)]


def evaluate_on_fresh_worlds(model, tokenizer, seeds: list[int], max_tool_calls: int = 3, max_new_tokens: int = 64) -> dict[str, float]:
    """Run the policy greedily on fresh worlds with the real search tool loop; share of format-valid episodes
    (parse + validate_trajectory) and of correct answers. Needs a tokenizer whose tags are single tokens."""
    import torch

    from models.format import TrajectoryError, parse_segments, validate_trajectory
    from models.tokenizer import decode, encode_observation, encode_prompt

    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("</web_search>", "</answer>")] + [tokenizer.eos_token_id]
    valid = correct = 0
    model.eval()
    for seed in seeds:
        world = synthetic_world(seed)
        prompt = encode_prompt(tokenizer, world.question)
        response: list[int] = []
        for _ in range(max_tool_calls + 1):
            with torch.no_grad():
                out = model.generate(
                    torch.tensor([prompt + response]), max_new_tokens=max_new_tokens, do_sample=False,
                    eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id,
                )[0, len(prompt) + len(response):].tolist()
            response += out
            if not out or out[-1] != stop_ids[0]:
                break
            query = decode(tokenizer, response).rsplit("<web_search>", 1)[-1].removesuffix("</web_search>")
            response += encode_observation(tokenizer, search_observation(world, query))
        text = decode(tokenizer, [t for t in response if t != tokenizer.eos_token_id])
        try:
            segments = parse_segments(text)
            answer = segments[-1].text if segments else ""
            validate_trajectory(Trajectory("eval", world.question, "synthetic-lookup", segments, answer))
            valid += 1
            correct += answer.strip() == world.answer
        except TrajectoryError:
            pass
    return {"format_valid": valid / len(seeds), "accuracy": correct / len(seeds)}
