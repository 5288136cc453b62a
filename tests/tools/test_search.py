"""web_search / wiki_search: BM25 ranking and AFM formatting; Serper and SearXNG over a real local HTTP round trip."""
from __future__ import annotations

import pytest

from agents.tools.search import BM25Search, SearxngSearch, SerperSearch, best_snippet, read_corpus
from tests.tools.conftest import CORPUS, LocalServer, json_route


def test_bm25_ranks_the_right_page_first():
    search = BM25Search(CORPUS, top_k=3, snippet_chars=200)
    result = search.run("Where was Kato Rimu born?")
    assert result.status == "ok"
    lines = result.text.splitlines()
    assert lines[0].startswith("Found ") and lines[0].endswith(" results:")
    assert lines[2] == "1. [Kato Rimu](http://miniweb.local/wiki/Kato_Rimu)"
    assert "born in Velmora" in lines[3]

    top = search.run("capital of Ostria").text.splitlines()[2]
    assert top in ("1. [Durn](http://miniweb.local/wiki/Durn)", "1. [Ostria](http://miniweb.local/wiki/Ostria)")
    assert "1. [Lin Aster]" in search.run("mayor politician Lin Aster").text


def test_bm25_respects_top_k_and_reports_no_match():
    search = BM25Search(CORPUS, top_k=2, snippet_chars=50, name="wiki_search")
    assert search.name == "wiki_search" and "<wiki_search>" in search.description
    assert search.run("Ostria").text.startswith("Found 2 results:")
    missing = search.run("zzzxqv")
    assert missing.status == "not_found" and "No results" in missing.text
    assert search.run("   ").status == "error"
    assert search.run("the of and").status == "not_found"


def test_snippet_is_the_window_matching_the_query():
    text = "Filler sentence one. " * 20 + "The river Sel runs through Durn. " + "More filler here. " * 20
    snippet = best_snippet(text, "river Sel", 60)
    assert "river Sel" in snippet and len(snippet) <= 66


def test_read_corpus_names_the_bad_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "1", "title": "a", "url": "u", "text": "t"}\n{"id": "2"}\n')
    with pytest.raises(ValueError, match=r"c.jsonl:2: missing field"):
        read_corpus(path)


@pytest.mark.integration
def test_serper_adapter_round_trip(monkeypatch):
    payload = {"searchParameters": {"q": "Kato Rimu"}, "organic": [
        {"title": "Kato Rimu - Wikipedia", "link": "https://en.example.org/Kato_Rimu",
         "snippet": "Kato Rimu is a painter.", "date": "Jan 3, 2020", "position": 1},
        {"title": "Velmora", "link": "https://en.example.org/Velmora", "snippet": "Harbour city.", "position": 2}]}
    with LocalServer({"/search": json_route(payload)}) as server:
        monkeypatch.setenv("TEST_SERPER_KEY", "k-123")
        search = SerperSearch(f"http://127.0.0.1:{server.port}/search", "TEST_SERPER_KEY", top_k=5)
        result = search.run("Kato Rimu")
        method, path, body, headers = server.requests[-1]
    assert result.status == "ok"
    assert result.text.splitlines()[:4] == ["Found 2 results:", "",
                                            "1. [Kato Rimu - Wikipedia](https://en.example.org/Kato_Rimu)",
                                            "Date published: Jan 3, 2020"]
    assert method == "POST" and headers["X-API-KEY"] == "k-123" and b'"q": "Kato Rimu"' in body


def test_serper_without_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    result = SerperSearch("http://127.0.0.1:9/search", "NO_SUCH_KEY_VAR").run("x")
    assert result.status == "error" and "NO_SUCH_KEY_VAR" in result.text


@pytest.mark.integration
def test_searxng_adapter_round_trip_and_http_error():
    payload = {"query": "Durn", "number_of_results": 1, "results": [
        {"url": "https://durn.example/", "title": "Durn", "content": "Capital of Ostria.", "engine": "x",
         "publishedDate": None}]}
    with LocalServer({"/search": json_route(payload)}) as server:
        result = SearxngSearch(f"http://127.0.0.1:{server.port}").run("Durn")
        path = server.requests[-1][1]
        broken = SearxngSearch(f"http://127.0.0.1:{server.port}/missing").run("Durn")
    assert result.status == "ok" and "1. [Durn](https://durn.example/)\nCapital of Ostria." in result.text
    assert "format=json" in path and "q=Durn" in path
    assert broken.status == "error" and "HTTP 404" in broken.text
