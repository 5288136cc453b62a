"""The pretraining corpus: mini-web pages of training worlds only, as `{"text": ...}` documents.

AFM starts from a pretrained base (Qwen); the tiny default starts from random weights and must learn, during
SFT, both the agent format and the skill the format relies on: find a name in a page and copy it. Causal LM on
pages teaches the second cheaply (every page token is a target, pages name their entity several times), so SFT
can spend its steps on the format. The analogue of a base model's pretraining data, with one rule: **no
held-out page, ever**. Held-out worlds' pages sit in the same search corpus (the eval searches them), so they
are dropped by their `heldout-` document id, and the extra worlds generated here draw names from the train
share of the name space only (problems/world.py `name_split`) and avoid every name already in the corpus.

    docs = pretraining_documents(read_corpus(corpus_path), WorldConfig(), extra_worlds=300)  # agents.tools.search
    write_text_jsonl(path, docs)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from problems.world import WorldConfig, generate_world, world_corpus

# Extra worlds use seeds far above any distill run's train and held-out seeds (those start at world_seed,
# default 0), so their rng streams are unrelated to the dataset's worlds.
EXTRA_WORLD_SEED = 1_000_000


def page_text(doc: dict) -> str:
    """What the model reads: the page title, then the whole page (crawl's view, not the search snippet)."""
    return f"{doc['title']}\n{doc.get('page_text') or doc['text']}"


def pretraining_documents(corpus: Iterable[dict], world: WorldConfig, extra_worlds: int) -> list[dict]:
    """`{"text"}` records: every non-held-out corpus page, then the pages of `extra_worlds` fresh train worlds."""
    docs = list(corpus)
    train_docs = [d for d in docs if not str(d.get("id", "")).startswith("heldout-")]
    taken = {d["title"] for d in docs}  # held-out names too: an extra world must not reuse any of them
    extra = [generate_world(world, EXTRA_WORLD_SEED + i, "train", exclude_names=taken) for i in range(extra_worlds)]
    return [{"text": page_text(d)} for d in train_docs + world_corpus(extra)]


def write_text_jsonl(path: str | Path, docs: Iterable[dict]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
            n += 1
    return n
