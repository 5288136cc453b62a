"""The generated world: determinism, held-out entity disjointness, solution steps grounded in pages and search."""
import html
import re
import subprocess
import sys

import pytest

from agents.tools.search import BM25Search
from problems.world import (
    WorldConfig, assert_entities_disjoint, generate_world, generate_worlds, multihop_problems, name_split,
    world_corpus, world_html,
)

CFG = WorldConfig()


def _page_text(page_html: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page_html))


def test_same_seed_same_world_and_problems():
    a, b = generate_world(CFG, seed=7), generate_world(CFG, seed=7)
    assert world_corpus([a]) == world_corpus([b])
    assert [p.to_dict() for p in multihop_problems(a, 15, rng_seed=1)] == \
        [p.to_dict() for p in multihop_problems(b, 15, rng_seed=1)]
    assert generate_world(CFG, seed=8).names != a.names


def test_world_is_consistent():
    world = generate_world(CFG, seed=11)
    for ent in world.entities.values():
        assert 2 <= len(ent.lead) + len(ent.body) + 1 <= 5  # short documents: 3-5 sentences (countries 2)
        assert len(ent.lead) <= CFG.snippet_facts
    for country in world.of_kind("country"):
        capital = world.entities[country.facts["capital"]]
        assert capital.facts["located_in"] == country.name
    # numeric attributes never tie, so comparisons always have one answer
    for attr in ("birth_year", "population", "founded_year", "release_year"):
        values = [e.facts[attr] for e in world.entities.values() if attr in e.facts]
        assert len(values) == len(set(values))


def test_heldout_entities_never_appear_in_train_worlds():
    train = generate_worlds(CFG, range(60), split="train")
    heldout = generate_worlds(CFG, range(60), split="heldout")
    assert_entities_disjoint(train, heldout)
    assert all(name_split(n) == "heldout" for w in heldout for n in w.names)
    # names repeat neither within nor across worlds made together
    all_train = [n for w in train for n in w.names]
    assert len(all_train) == len(set(all_train))
    with pytest.raises(ValueError, match="share"):
        assert_entities_disjoint(train, train[:1])


def test_distractors_exist_at_full_rate():
    world = generate_world(WorldConfig(distractor_rate=1.0), seed=2)
    people = [e.name for e in world.of_kind("person")]
    assert len(people) > CFG.n_people  # near-duplicates were added
    firsts = [n.split(" ")[0] for n in people]
    assert len(set(firsts)) < len(firsts)


def test_solution_findings_are_on_the_named_pages():
    world = generate_world(CFG, seed=5)
    pages = world_html(world)
    problems = multihop_problems(world, 40, split="train", rng_seed=0)
    assert len(problems) == 40
    kinds = {p.metadata["solution"]["kind"] for p in problems}
    assert kinds == {"bridge", "comparison"}
    tools = set()
    for p in problems:
        sol = p.metadata["solution"]
        assert sol["distractors"] and not set(sol["distractors"]) & set(p.answers)
        for step in sol["steps"]:
            tools.add(step["tool"])
            if step["tool"] == "code":
                continue  # comparisons: test_comparison_code_prints_the_answer
            path = step["url"].replace("http://miniweb.local", "")
            assert step["finding"] in _page_text(pages[path])
        assert sol["steps"][-1]["entity"] in p.answers
    assert tools == {"web_search", "crawl_page", "code"}


def test_comparison_code_prints_the_answer():
    """A comparison ends in one code step whose program, run, prints the winner (the first answer), with both
    looked-up values copied from the findings the earlier steps read."""
    world = generate_world(CFG, seed=5)
    comparisons = multihop_problems(world, 60, hops=(2, 4), kinds=("comparison",), rng_seed=1)
    assert len(comparisons) > 10
    for p in comparisons:
        *lookups, compare = p.metadata["solution"]["steps"]
        assert compare["tool"] == "code" and all(s["tool"] != "code" for s in lookups)
        code = compare["argument"].removeprefix("```python\n").removesuffix("\n```")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert out.strip() == p.answers[0] == compare["entity"]
        values = re.findall(r": (\d+)", code)
        assert len(values) == 2 and all(any(v in s["finding"] for s in lookups) for v in values)


def test_hop_counts_favour_short_problems():
    world = generate_world(CFG, seed=9)
    problems = multihop_problems(world, 60, rng_seed=3)
    hops = [p.metadata["solution"]["hops"] for p in problems]
    assert min(hops) >= 1 and max(hops) <= 4
    assert sum(h <= 2 for h in hops) > len(hops) / 2


def test_search_for_entity_name_ranks_its_page_first_and_shows_lead_facts():
    worlds = generate_worlds(WorldConfig(distractor_rate=0.5), range(3))
    search = BM25Search(world_corpus(worlds), top_k=3, snippet_chars=200)
    for world in worlds:
        for ent in world.entities.values():
            first = re.search(r"^1\. \[(.*?)\]\((.*?)\)", search.run(ent.name).text, re.M)
            assert first and first.group(2) == ent.url, ent.name
        for p in multihop_problems(world, 20, rng_seed=0):
            for step in p.metadata["solution"]["steps"]:
                if step["tool"] == "web_search":
                    obs = search.run(step["argument"]).text
                    top = obs.split("\n2. ")[0]
                    assert step["finding"] in top, (step, obs)


def test_body_only_facts_are_not_in_the_search_corpus():
    world = generate_world(WorldConfig(crawl_fraction=1.0), seed=4)
    docs = {d["url"]: d for d in world_corpus([world])}
    for p in multihop_problems(world, 10):
        crawl_steps = [s for s in p.metadata["solution"]["steps"] if s["tool"] == "crawl_page"]
        assert crawl_steps
        for step in crawl_steps:
            assert step["finding"] not in docs[step["url"]]["text"]
            assert step["finding"] in docs[step["url"]]["page_text"]


def test_corpus_rejects_worlds_that_share_names():
    world = generate_world(CFG, seed=1)
    with pytest.raises(ValueError, match="two worlds"):
        world_corpus([world, world])


def test_heldout_problems_need_a_heldout_world():
    with pytest.raises(ValueError, match="heldout"):
        multihop_problems(generate_world(CFG, seed=1), 3, split="heldout")
    problems = multihop_problems(generate_world(CFG, seed=1, split="heldout"), 3, split="heldout")
    assert problems and all(p.split == "heldout" and p.metadata["world_split"] == "heldout" for p in problems)
