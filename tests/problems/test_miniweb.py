"""The mini-web serves the world's pages over real HTTP on 127.0.0.1 (library and CLI)."""
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from problems.miniweb import MiniWeb, corpus_pages
from problems.world import WorldConfig, generate_world, world_corpus, world_html, write_corpus

pytestmark = pytest.mark.integration


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_serves_world_pages_and_404s_the_rest():
    world = generate_world(WorldConfig(), seed=3)
    ent = next(iter(world.entities.values()))
    with MiniWeb(world_html(world)) as web:
        assert re.fullmatch(r"127\.0\.0\.1:\d+", web.address)
        status, body = _get(f"http://{web.address}{ent.path}")
        assert status == 200 and f"<h1>{ent.name}</h1>" in body and ent.sentence(next(iter(ent.facts))) in body
        assert _get(f"http://{web.address}/wiki/No_Such_Page")[0] == 404
        assert _get(f"http://{web.address}/etc/passwd")[0] == 404
        address = web.address
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://{address}{ent.path}", timeout=2)


def test_cli_serves_a_corpus_file(tmp_path):
    world = generate_world(WorldConfig(crawl_fraction=1.0), seed=4)
    corpus = tmp_path / "corpus.jsonl"
    assert write_corpus(corpus, world_corpus([world])) == len(world.entities)
    ent = next(e for e in world.entities.values() if e.body)
    assert ent.path in corpus_pages(corpus)
    proc = subprocess.Popen([sys.executable, "-m", "problems.miniweb", "--corpus", str(corpus), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        address = re.search(r"http://(127\.0\.0\.1:\d+)/wiki/", line).group(1)
        status, body = _get(f"http://{address}{ent.path}")
        assert status == 200 and ent.sentence(ent.body[0]) in body  # body-only facts are on the served page
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_bad_corpus_row_names_file_and_line(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"title": "A", "url": "http://miniweb.local/wiki/A", "text": "a"}\n{"title": "B"}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:2:"):
        corpus_pages(corpus)


def test_crawl_tool_reads_body_only_facts_from_the_miniweb():
    from agents.tools.crawl import CrawlPage
    from problems.world import multihop_problems

    world = generate_world(WorldConfig(crawl_fraction=0.7), seed=6)
    with MiniWeb(world_html(world)) as web:
        crawl = CrawlPage(allow_hosts={"miniweb.local"}, resolve={"miniweb.local": web.address})
        steps = [s for p in multihop_problems(world, 15) for s in p.metadata["solution"]["steps"]
                 if s["tool"] == "crawl_page"]
        assert steps
        for step in steps:
            result = crawl.run(step["argument"])
            assert result.status == "ok" and step["finding"] in result.text, (step, result.text)
