"""A seeded world of invented entities, rendered as mini-web HTML pages and a search corpus, plus multi-hop questions.

The world is people, films, cities, countries and companies joined by relations (born_in, directed_by,
founded_by, works_for, located_in, ...). Every entity gets one page: a short templated document, one fact per
sentence. The *lead* sentences (the type sentence plus at most `snippet_facts` facts) are the search corpus
document (what a search result shows); the other facts are only in the page *body*, so a hop on such a fact needs
`crawl_page` after `web_search`.

Why it looks like this: a ~1M-parameter model trained for minutes memorizes a fixed world's names instead of
copying them from observations. So names come from a small syllable inventory (2-3 syllables, a few BPE tokens),
documents are short, and generation is cheap enough to make a FRESH world for every batch/shard (thousands of
small worlds, names practically never repeat; `generate_worlds` guarantees no repeats across the worlds it makes).

Held-out split BY ENTITY: every name is assigned to "train" or "heldout" by a stable hash of the name
(`name_split`), and a world generated for a split only uses names of that split. So held-out problems never
mention a name any train world can contain; `assert_entities_disjoint` is the explicit set-difference check.

Usage:
    world = generate_world(WorldConfig(), seed=3)                       # split="train"
    problems = multihop_problems(world, n=20, split="train", rng_seed=0)
    docs = world_corpus([world])        # [{id, title, url, text, page_text}] for the search index
    write_corpus("corpus.jsonl", docs)  # then: python -m problems.miniweb --corpus corpus.jsonl
    pages = world_html(world)           # {"/wiki/Kato_Rimu": "<html>...", ...} for problems.miniweb.MiniWeb
"""
from __future__ import annotations

import hashlib
import html
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from pydantic import Field

from afm.config import Config
from problems.records import Problem

MINIWEB_HOST = "miniweb.local"
SPLITS = ("train", "heldout")

# Small inventory on purpose: every name is 2-3 of these syllables, so a tiny BPE splits names into few tokens
# and a model must copy them from observations instead of memorizing them.
_CONSONANTS = "bdfkklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = tuple(c + v for c in dict.fromkeys(_CONSONANTS) for v in _VOWELS)
_FILM_NOUNS = ("Night", "River", "Garden", "Storm", "Road", "Song", "Winter", "Mirror")
_COMPANY_SUFFIXES = ("Works", "Labs", "Group", "Motors", "Foods", "Media")
_OCCUPATIONS = ("painter", "engineer", "writer", "actor", "chemist", "pilot", "farmer", "singer")
_GENRES = ("drama", "comedy", "thriller", "western", "musical")
_INDUSTRIES = ("software", "shipping", "textile", "mining", "toy", "glass")
_LANGUAGES = ("Ralic", "Tovan", "Sumic", "Belish", "Danor", "Kipese")

# Relations per kind: (relation, target kind or None for a number). Every fact is one sentence on the source page.
RELATIONS: dict[str, tuple[tuple[str, str | None], ...]] = {
    "person": (("born_in", "city"), ("works_for", "company"), ("birth_year", None)),
    "film": (("directed_by", "person"), ("filmed_in", "city"), ("release_year", None)),
    "company": (("founded_by", "person"), ("based_in", "city"), ("founded_year", None)),
    "city": (("located_in", "country"), ("mayor", "person"), ("population", None)),
    "country": (("capital", "city"),),
}
_SENTENCES = {
    "born_in": "{s} was born in {o}.",
    "works_for": "{s} works for {o}.",
    "birth_year": "{s} was born in the year {o}.",
    "directed_by": "{s} was directed by {o}.",
    "filmed_in": "{s} was filmed in {o}.",
    "release_year": "{s} was released in {o}.",
    "founded_by": "{s} was founded by {o}.",
    "based_in": "{s} is based in {o}.",
    "founded_year": "{s} was founded in the year {o}.",
    "located_in": "{s} is located in {o}.",
    "mayor": "The mayor of {s} is {o}.",
    "population": "{s} has a population of {o}.",
    "capital": "The capital of {s} is {o}.",
}
# Noun phrase naming the relation's target in terms of its source; questions nest these.
_PHRASES = {
    "born_in": "the birthplace of {x}",
    "works_for": "the employer of {x}",
    "birth_year": "the birth year of {x}",
    "directed_by": "the director of {x}",
    "filmed_in": "the city where {x} was filmed",
    "release_year": "the release year of {x}",
    "founded_by": "the founder of {x}",
    "based_in": "the home city of {x}",
    "founded_year": "the founding year of {x}",
    "located_in": "the country of {x}",
    "mayor": "the mayor of {x}",
    "population": "the population of {x}",
    "capital": "the capital of {x}",
}
# Numeric attribute -> (kind that has it, comparison question, whether the smaller value wins).
_COMPARISONS = {
    "birth_year": ("person", "Who was born earlier, {a} or {b}?", True),
    "release_year": ("film", "Which film was released earlier, {a} or {b}?", True),
    "founded_year": ("company", "Which company was founded earlier, {a} or {b}?", True),
    "population": ("city", "Which city has a larger population, {a} or {b}?", False),
}


class WorldConfig(Config):
    """Size and difficulty of one generated world (defaults: tiny, for a ~1M model trained on CPU)."""

    n_people: int = Field(12, ge=2, description="People (before distractors).")
    n_films: int = Field(4, ge=1, description="Films (before distractors).")
    n_cities: int = Field(5, ge=2, description="Cities (before distractors).")
    n_countries: int = Field(2, ge=1, description="Countries; each city lies in one, each has a capital city.")
    n_companies: int = Field(4, ge=1, description="Companies (before distractors).")
    distractor_rate: float = Field(
        0.25, ge=0.0, le=1.0,
        description="Chance each person/film/company/city gets a near-duplicate entity with a one-part-different "
                    "name and its own (different) facts, so that search results contain plausible wrong pages.",
    )
    crawl_fraction: float = Field(
        0.4, ge=0.0, le=1.0,
        description="Chance each fact sentence is only in the page body (not the search snippet), so the hop "
                    "that needs it takes web_search then crawl_page.",
    )
    snippet_facts: int = Field(
        2, ge=0,
        description="At most this many facts in the lead (the search snippet); short leads stay whole inside a "
                    "search result's snippet window (~200 chars), the rest go to the body.",
    )
    heldout_name_share: float = Field(
        0.125, gt=0.0, lt=1.0,
        description="Share of the name space reserved for held-out worlds (assigned by a stable hash of the name).",
    )


@dataclass
class Entity:
    """One invented entity and its page. `facts` maps relation -> target entity name or a number."""

    name: str
    kind: str
    description: str  # the type sentence, always first and always in the snippet
    facts: dict[str, str | int] = field(default_factory=dict)
    lead: list[str] = field(default_factory=list)  # relations whose sentences are in the snippet (in order)
    body: list[str] = field(default_factory=list)  # relations whose sentences are only on the page

    @property
    def slug(self) -> str:
        return self.name.replace(" ", "_")

    @property
    def path(self) -> str:
        return f"/wiki/{self.slug}"

    @property
    def url(self) -> str:
        return f"http://{MINIWEB_HOST}{self.path}"

    def sentence(self, relation: str) -> str:
        return _SENTENCES[relation].format(s=self.name, o=self.facts[relation])

    @property
    def snippet(self) -> str:
        return " ".join([self.description] + [self.sentence(r) for r in self.lead])

    @property
    def text(self) -> str:
        return " ".join([self.snippet] + [self.sentence(r) for r in self.body])

    @property
    def aliases(self) -> list[str]:
        """Accepted answer spellings: the name, plus the name without the company suffix / film article."""
        if self.kind == "company":
            return [self.name, self.name.rsplit(" ", 1)[0]]
        if self.kind == "film" and self.name.startswith("The "):
            return [self.name, self.name[4:]]
        return [self.name]

    def html(self) -> str:
        """The page: title, lead paragraph, body paragraph; entity mentions link to their pages."""
        esc = html.escape
        lead = " ".join(esc(s) for s in [self.description] + [self.sentence(r) for r in self.lead])
        body = " ".join(esc(self.sentence(r)) for r in self.body)
        links = "".join(
            f'<li><a href="/wiki/{esc(str(v).replace(" ", "_"))}">{esc(str(v))}</a></li>'
            for r, v in self.facts.items() if dict(RELATIONS[self.kind])[r] is not None
        )
        return (
            f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{esc(self.name)}</title></head>\n"
            f"<body><h1>{esc(self.name)}</h1>\n<p>{lead}</p>\n<p>{body}</p>\n"
            f"<h2>See also</h2><ul>{links}</ul>\n</body></html>\n"
        )


@dataclass
class World:
    seed: int
    split: str
    entities: dict[str, Entity]  # by name

    def of_kind(self, kind: str) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == kind]

    @property
    def names(self) -> set[str]:
        return set(self.entities)


def name_split(name: str, heldout_share: float = 0.125) -> str:
    """'train' or 'heldout' for a name, by a stable hash: the same name always lands in the same split."""
    digest = int.from_bytes(hashlib.sha1(name.lower().encode()).digest()[:4], "big")
    return "heldout" if digest / 2**32 < heldout_share else "train"


class _NameMaker:
    """Draws fresh names of one split, never repeating a name in `taken`."""

    def __init__(self, rng: random.Random, split: str, heldout_share: float, taken: set[str]):
        self.rng, self.split, self.share, self.taken = rng, split, heldout_share, taken

    def word(self, lo: int = 2, hi: int = 3) -> str:
        return "".join(self.rng.choice(_SYLLABLES) for _ in range(self.rng.randint(lo, hi))).capitalize()

    def draw(self, kind: str) -> str:
        for _ in range(1000):
            name = self._raw(kind)
            if self.accept(name):
                return name
        raise RuntimeError(f"could not draw a fresh {kind} name after 1000 tries; the name space is exhausted")

    def accept(self, name: str) -> bool:
        if name in self.taken or name_split(name, self.share) != self.split:
            return False
        self.taken.add(name)
        return True

    def _raw(self, kind: str) -> str:
        if kind == "person":
            return f"{self.word(2, 2)} {self.word(2, 2)}"
        if kind == "film":
            return f"The {self.word(2, 2)} {self.rng.choice(_FILM_NOUNS)}"
        if kind == "company":
            return f"{self.word(2, 3)} {self.rng.choice(_COMPANY_SUFFIXES)}"
        if kind == "country":
            return self.word(2, 2) + "ria"
        return self.word(2, 3)  # city

    def near_duplicate(self, name: str, kind: str) -> str | None:
        """A name one part away from `name` (a swapped syllable, film noun or company suffix); None if none is free."""
        for _ in range(50):
            if kind == "film":
                cand = name.rsplit(" ", 1)[0] + " " + self.rng.choice(_FILM_NOUNS)
            elif kind == "company":
                cand = name.rsplit(" ", 1)[0] + " " + self.rng.choice(_COMPANY_SUFFIXES)
            elif kind == "person":
                first, last = name.split(" ")
                cand = f"{first} {last[:2]}{self.rng.choice(_SYLLABLES)}"
            else:
                cand = name[:-2] + self.rng.choice(_SYLLABLES)
            if self.accept(cand):
                return cand
        return None


def is_near_duplicate(a: str, b: str) -> bool:
    """True if `b` is one part away from `a` the way `_NameMaker.near_duplicate` makes distractor names."""
    if a == b:
        return False
    if a.startswith("The ") or (" " in a and a.rsplit(" ", 1)[1] in _COMPANY_SUFFIXES):
        return a.rsplit(" ", 1)[0] == b.rsplit(" ", 1)[0]
    return a[:-2] == b[:-2]


def _description(rng: random.Random, kind: str, name: str) -> str:
    if kind == "person":
        return f"{name} is a {rng.choice(_OCCUPATIONS)}."
    if kind == "film":
        return f"{name} is a {rng.choice(_GENRES)} film."
    if kind == "company":
        return f"{name} is a {rng.choice(_INDUSTRIES)} company."
    if kind == "country":
        return f"{name} is a country where people speak {rng.choice(_LANGUAGES)}."
    return f"{name} is a city."


def _number(rng: random.Random, relation: str, used: set[int]) -> int:
    """A value for a numeric attribute, unique within the world so that comparisons never tie."""
    lo, hi = {"birth_year": (1900, 1999), "release_year": (1950, 2020), "founded_year": (1850, 2010),
              "population": (20_000, 3_000_000)}[relation]
    for _ in range(1000):
        value = rng.randint(lo, hi)
        if value not in used:
            used.add(value)
            return value
    raise RuntimeError(f"no unique value left for {relation} in [{lo}, {hi}]")


def generate_world(cfg: WorldConfig, seed: int, split: str = "train", exclude_names: set[str] | None = None) -> World:
    """A world from `seed`; the same (cfg, seed, split) gives the same world. Names are drawn only from `split`'s
    share of the name space and never from `exclude_names` (pass a shared set to keep many worlds name-disjoint;
    the set is updated with this world's names)."""
    if split not in SPLITS:
        raise ValueError(f"generate_world: split {split!r} is not one of {SPLITS}")
    if cfg.n_cities < cfg.n_countries:
        raise ValueError(f"WorldConfig: n_cities ({cfg.n_cities}) must be >= n_countries ({cfg.n_countries}); "
                         "every country needs its own capital city")
    # Seeded by (split, seed): train and held-out worlds with the same seed number are unrelated.
    rng = random.Random(f"afm-world:{split}:{seed}")
    taken = exclude_names if exclude_names is not None else set()
    names = _NameMaker(rng, split, cfg.heldout_name_share, taken)
    counts = {"country": cfg.n_countries, "city": cfg.n_cities, "person": cfg.n_people,
              "company": cfg.n_companies, "film": cfg.n_films}
    entities: dict[str, Entity] = {}
    for kind, count in counts.items():
        for _ in range(count):
            name = names.draw(kind)
            entities[name] = Entity(name, kind, _description(rng, kind, name))
            if kind != "country" and rng.random() < cfg.distractor_rate:
                twin = names.near_duplicate(name, kind)
                if twin:
                    entities[twin] = Entity(twin, kind, _description(rng, kind, twin))
    by_kind = {k: [e.name for e in entities.values() if e.kind == k] for k in counts}
    used_numbers: dict[str, set[int]] = {}
    for ent in entities.values():
        for relation, target in RELATIONS[ent.kind]:
            if target is None:
                ent.facts[relation] = _number(rng, relation, used_numbers.setdefault(relation, set()))
            else:
                ent.facts[relation] = rng.choice([n for n in by_kind[target] if n != ent.name])
    # Each country gets its own capital, which must lie in that country, or the world contradicts itself.
    for country, capital in zip(by_kind["country"], rng.sample(by_kind["city"], len(by_kind["country"]))):
        entities[country].facts["capital"] = capital
        entities[capital].facts["located_in"] = country
    for ent in entities.values():
        order = list(ent.facts)
        rng.shuffle(order)
        ent.lead = [r for r in order if rng.random() >= cfg.crawl_fraction][:cfg.snippet_facts]
        ent.body = [r for r in order if r not in ent.lead]
    return World(seed=seed, split=split, entities=entities)


def generate_worlds(cfg: WorldConfig, seeds: Iterable[int], split: str = "train") -> list[World]:
    """Many worlds whose names never repeat across them (one shared exclusion set)."""
    taken: set[str] = set()
    return [generate_world(cfg, seed, split, exclude_names=taken) for seed in seeds]


def assert_entities_disjoint(train_worlds: Iterable[World], heldout_worlds: Iterable[World]) -> None:
    """Raise ValueError naming the shared names if any held-out entity name appears in a train world."""
    train = set().union(*(w.names for w in train_worlds))
    shared = sorted(train & set().union(*(w.names for w in heldout_worlds)))
    if shared:
        raise ValueError(f"held-out worlds share {len(shared)} entity names with train worlds: {shared[:10]}")


def world_corpus(worlds: Iterable[World]) -> list[dict]:
    """Search-index documents `{id, title, url, text, page_text}`, one per entity page. `text` (what the index
    holds and a search result shows) is only the lead, as a search engine's snippet would be; `page_text` is the
    whole page, which only crawl_page reveals. Raises ValueError if two worlds share a URL."""
    docs: dict[str, dict] = {}
    for world in worlds:
        for ent in world.entities.values():
            if ent.url in docs:
                raise ValueError(f"world_corpus: {ent.url} appears in two worlds (seed {world.seed}); "
                                 "generate them with generate_worlds so names do not repeat")
            docs[ent.url] = {"id": f"{world.split}-{world.seed}-{ent.slug}", "title": ent.name, "url": ent.url,
                             "text": ent.snippet, "page_text": ent.text}
    return list(docs.values())


def write_corpus(path: str | Path, docs: Iterable[dict]) -> int:
    """Write corpus rows as JSONL via a temp file + rename (a crash never leaves a half corpus); returns the count."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def world_html(world: World) -> dict[str, str]:
    """`{"/wiki/<Slug>": html}` for every entity page."""
    return {ent.path: ent.html() for ent in world.entities.values()}


# ----------------------------------------------------------------------------------------------- multi-hop problems

def _hop_steps(world: World, source: Entity, relation: str, hop: int) -> list[dict]:
    """Tool steps that resolve `relation` of `source`: a search for the name, then a crawl if the fact is body-only."""
    finding = source.sentence(relation)
    value = str(source.facts[relation])
    if relation in source.lead:
        return [{"tool": "web_search", "argument": source.name, "finding": finding, "entity": value,
                 "url": source.url, "hop": hop}]
    return [
        {"tool": "web_search", "argument": source.name, "finding": source.description, "entity": source.name,
         "url": source.url, "hop": hop},
        {"tool": "crawl_page", "argument": source.url, "finding": finding, "entity": value, "url": source.url,
         "hop": hop},
    ]


def _wrong_values(world: World, rng: random.Random, relation: str, right: str, source: Entity) -> list[str]:
    """Plausible wrong answers for one hop: the near-duplicate's value for the same relation, then same-kind names."""
    target_kind = dict(RELATIONS[source.kind])[relation]
    out: list[str] = []
    for other in world.of_kind(source.kind):
        if is_near_duplicate(other.name, source.name):
            out.append(str(other.facts[relation]))  # the near-duplicate page's fact: the classic confusion
    if target_kind is None:
        out.append(str(int(right) + rng.choice([-1, 1]) * rng.randint(1, 9)))
    else:
        pool = [e.name for e in world.of_kind(target_kind) if e.name != right]
        rng.shuffle(pool)
        out.extend(pool[:2])
    return [v for v in dict.fromkeys(out) if v != right]


def _walk(world: World, rng: random.Random, length: int, end_kind: str | None, allow_number: bool):
    """A random chain of `length` relations without revisiting an entity: [(source entity, relation), ...].
    `end_kind` constrains the kind the chain lands on; `allow_number` lets the last relation be numeric."""
    for _ in range(200):
        ent = rng.choice(list(world.entities.values()))
        chain, seen = [], {ent.name}
        for i in range(length):
            options = [(r, t) for r, t in RELATIONS[ent.kind] if t is not None or (allow_number and i == length - 1)]
            relation, target = rng.choice(options)
            if target is None:
                chain.append((ent, relation))
                break
            nxt = world.entities[str(ent.facts[relation])]
            if nxt.name in seen:
                break
            chain.append((ent, relation))
            seen.add(nxt.name)
            ent = nxt
        if len(chain) == length and (end_kind is None or ent.kind == end_kind):
            return chain, ent
    return None


def _chain_phrase(chain) -> str:
    phrase = chain[0][0].name
    for _, relation in chain:
        phrase = _PHRASES[relation].format(x=phrase)
    return phrase


def _bridge(world: World, rng: random.Random, hops: int):
    found = _walk(world, rng, hops, None, allow_number=True)
    if not found:
        return None
    chain, _ = found
    last_source, last_relation = chain[-1]
    answer_value = str(last_source.facts[last_relation])
    phrase = _chain_phrase(chain)
    wh = "Who" if dict(RELATIONS[last_source.kind])[last_relation] == "person" else "What"
    question = f"{wh} is {phrase}?"
    steps = [s for i, (src, rel) in enumerate(chain) for s in _hop_steps(world, src, rel, i)]
    answers = world.entities[answer_value].aliases if answer_value in world.entities else [answer_value]
    distractors = _wrong_values(world, rng, last_relation, answer_value, last_source)
    return question, answers, steps, distractors


def _comparison(world: World, rng: random.Random, hops: int):
    attribute = rng.choice(list(_COMPARISONS))
    kind, template, smaller_wins = _COMPARISONS[attribute]
    candidates = world.of_kind(kind)
    if len(candidates) < 2:
        return None
    # Each side: a chain of entity relations landing on `kind`, then one lookup of the attribute.
    left_len = max(1, hops // 2) - 1
    right_len = max(1, hops - hops // 2) - 1
    sides = []
    for length in (left_len, right_len):
        if length == 0:
            ent = rng.choice(candidates)
            sides.append(([], ent, ent.name))
        else:
            found = _walk(world, rng, length, kind, allow_number=False)
            if not found:
                return None
            chain, ent = found
            sides.append((chain, ent, _chain_phrase(chain)))
    (lc, le, lp), (rc, re_, rp) = sides
    if le.name == re_.name:
        return None
    a, b = le.facts[attribute], re_.facts[attribute]
    winner, loser = (le, re_) if (a < b) == smaller_wins else (re_, le)
    steps, hop = [], 0
    for chain, ent, _ in sides:
        for src, rel in chain:
            steps += _hop_steps(world, src, rel, hop)
            hop += 1
        steps += _hop_steps(world, ent, attribute, hop)
        hop += 1
    steps.append(_compare_step(le, re_, attribute, "min" if smaller_wins else "max", winner.name, hop))
    twins = [e.name for e in world.of_kind(kind) if is_near_duplicate(e.name, winner.name)]
    return template.format(a=lp, b=rp), winner.aliases, steps, [loser.name] + twins


def _compare_step(left: Entity, right: Entity, attribute: str, pick: str, winner: str, hop: int) -> dict:
    """The code step that decides a comparison: the two looked-up values in a dict, `min`/`max` prints the name.
    Why code: deciding 1970 < 2006 (or between two 7-digit populations) inside the thought is a comparison the
    ~1M student could not learn (1 of 49 held-out comparisons right, docs/quality.md); copying two names and two
    numbers into a dict is the find-then-copy skill it already has, and the sandbox does the arithmetic."""
    code = (f"values = {{{json.dumps(left.name)}: {left.facts[attribute]}, "
            f"{json.dumps(right.name)}: {right.facts[attribute]}}}\nprint({pick}(values, key=values.get))")
    return {"tool": "code", "argument": f"```python\n{code}\n```", "finding": f"The code printed {winner}.",
            "entity": winner, "url": "", "hop": hop}


def _hop_weights(lo: int, hi: int) -> list[float]:
    """Fewer hops are more common (each extra hop halves the weight): 1-2 hop problems dominate the tiny default."""
    return [0.5 ** (h - lo) for h in range(lo, hi + 1)]


def multihop_problems(world: World, n: int, hops: tuple[int, int] = (1, 4),
                      kinds: tuple[str, ...] = ("bridge", "comparison"), split: str = "train",
                      rng_seed: int = 0) -> list[Problem]:
    """Up to `n` distinct HotpotQA-like questions over `world` (fewer only if the world is too small to have `n`).
    metadata["solution"] = {kind, steps: [{tool, argument, finding, entity, url, hop}], distractors}, where each
    hop is a web_search for the hop's entity and, when the fact is body-only, a crawl_page of its URL; a
    comparison ends with a code step that prints the winner (so its teacher needs the `code` tool)."""
    for kind in kinds:
        if kind not in ("bridge", "comparison"):
            raise ValueError(f"multihop_problems: kind {kind!r} is not 'bridge' or 'comparison'")
    if split == "heldout" and world.split != "heldout":
        raise ValueError(f"multihop_problems: split='heldout' needs a world generated with split='heldout' "
                         f"(world seed {world.seed} is a {world.split!r} world, its names may occur in training)")
    lo, hi = hops
    if not 1 <= lo <= hi:
        raise ValueError(f"multihop_problems: hops {hops} must be (lo, hi) with 1 <= lo <= hi")
    rng = random.Random(f"afm-multihop:{world.split}:{world.seed}:{rng_seed}")
    problems: list[Problem] = []
    seen: set[str] = set()
    for _ in range(n * 20):
        if len(problems) == n:
            break
        h = rng.choices(range(lo, hi + 1), weights=_hop_weights(lo, hi))[0]
        kind = rng.choice(kinds)
        if kind == "comparison":
            h = max(h, 2)  # a comparison looks up at least two pages
        made = _comparison(world, rng, h) if kind == "comparison" else _bridge(world, rng, h)
        if made is None or made[0] in seen:
            continue
        question, answers, steps, distractors = made
        seen.add(question)
        problems.append(Problem(
            id=f"mh-{world.split}-{world.seed}-{rng_seed}-{len(problems)}", question=question, answers=answers,
            family="multihop", split=split, source=f"world:{world.split}:{world.seed}",
            metadata={"solution": {"kind": kind, "hops": h, "steps": steps, "distractors": distractors},
                      "world_seed": world.seed, "world_split": world.split},
        ))
    return problems
