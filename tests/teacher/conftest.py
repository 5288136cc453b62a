"""Fixtures for teacher tests: a small generated world, its problems, a corpus file, the mini-web and a real
ToolBox (BM25 search, crawl over 127.0.0.1 HTTP, sandboxed code)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.tools.toolbox import ToolBox, ToolboxConfig, build_toolbox
from problems.computation import computation_problems
from problems.miniweb import MiniWeb
from problems.records import Problem
from problems.world import WorldConfig, generate_worlds, multihop_problems, world_corpus, world_html


@dataclass
class WorldSetup:
    problems: list[Problem]
    corpus_path: Path
    pages: dict[str, str]


def make_world_setup(tmp: Path, n_multihop: int = 12, n_computation: int = 4) -> WorldSetup:
    worlds = generate_worlds(WorldConfig(), [0, 1])
    problems = [p for w in worlds for p in multihop_problems(w, n_multihop // 2, hops=(1, 3), rng_seed=0)]
    problems += computation_problems(n_computation, rng_seed=0)
    corpus_path = tmp / "corpus.jsonl"
    corpus_path.write_text("".join(json.dumps(d) + "\n" for d in world_corpus(worlds)))
    pages = {k: v for w in worlds for k, v in world_html(w).items()}
    return WorldSetup(problems, corpus_path, pages)


@pytest.fixture(scope="module")
def world_setup(tmp_path_factory) -> WorldSetup:
    return make_world_setup(tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="module")
def miniweb(world_setup):
    with MiniWeb(world_setup.pages) as web:
        yield web


@pytest.fixture(scope="module")
def toolbox_cfg(world_setup, miniweb, tmp_path_factory) -> ToolboxConfig:
    return ToolboxConfig(corpus_path=world_setup.corpus_path, crawl_resolve={"miniweb.local": miniweb.address},
                         cache_dir=tmp_path_factory.mktemp("tool_cache"))


@pytest.fixture(scope="module")
def toolbox(toolbox_cfg) -> ToolBox:
    return build_toolbox(toolbox_cfg)
