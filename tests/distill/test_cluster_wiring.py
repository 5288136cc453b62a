"""Cluster wiring of the tools (issue #22): a node without the driver's corpus file reads the corpus from the
artifact store (ToolboxConfig.corpus_uri), and the mini-web binds the configured address
(ToolboxConfig.miniweb_bind, default 127.0.0.1). Servers here stay on 127.0.0.1."""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

import problems.miniweb as miniweb_mod
from afm.storage import open_store
from agents.tools.toolbox import ToolboxConfig, build_toolbox, fetch_corpus, load_corpus
from distill.pipeline import publish_corpus
from problems.miniweb import MiniWeb, advertised_host, serve_corpus

ROWS = [{"id": "a", "title": "Kato Rimu", "url": "http://miniweb.local/wiki/Kato_Rimu",
         "text": "Kato Rimu was born in Velm."},
        {"id": "b", "title": "Velm", "url": "http://miniweb.local/wiki/Velm", "text": "Velm is a city in Oskar."}]
NOT_ON_THIS_NODE = Path("/nonexistent-driver-dir/work/distill-x/corpus.jsonl")


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    path = tmp_path / "driver" / "corpus.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


def _search_on_other_node(corpus_uri: str, cache_dir: Path) -> str:
    """What a rollout actor on another node does: build its ToolBox from the config the driver sent."""
    cfg = ToolboxConfig(tools=["web_search"], corpus_path=NOT_ON_THIS_NODE, corpus_uri=corpus_uri,
                        cache_dir=cache_dir)
    return build_toolbox(cfg).call("web_search", "where was Kato Rimu born").text


def test_actor_loads_corpus_from_s3_store_uri(s3_env, corpus_file, tmp_path):
    s3_env.create_bucket(Bucket="afm-corpus-test")
    uri = publish_corpus(corpus_file, "s3://afm-corpus-test/artifacts")
    assert uri.startswith("s3://afm-corpus-test/artifacts/corpora/") and uri.endswith("/corpus.jsonl")
    text = _search_on_other_node(uri, tmp_path / "cache")
    assert "[Kato Rimu](http://miniweb.local/wiki/Kato_Rimu)" in text
    # published once per content: a second publish writes nothing new and returns the same URI
    assert publish_corpus(corpus_file, "s3://afm-corpus-test/artifacts") == uri


def test_actor_loads_corpus_from_local_store_and_checks_sha(corpus_file, tmp_path):
    uri = publish_corpus(corpus_file, str(tmp_path / "store"))
    assert uri.startswith("file://")
    cfg = ToolboxConfig(corpus_path=NOT_ON_THIS_NODE, corpus_uri=uri)
    assert [r["id"] for r in load_corpus(cfg)] == ["a", "b"]
    # a corrupted stored copy is refused (manifest sha256), not indexed
    store = open_store(uri.rsplit("/", 1)[0])
    store.put_bytes("corpus.jsonl", b'{"id": "x", "title": "t", "url": "u", "text": "tampered"}\n')
    with pytest.raises(ValueError, match="sha256"):
        fetch_corpus(uri, cache_root=tmp_path / "fresh-cache")


def test_local_corpus_path_wins_and_missing_both_says_what_to_set(corpus_file):
    cfg = ToolboxConfig(corpus_path=corpus_file, corpus_uri="s3://never-read/x/corpus.jsonl")
    assert len(load_corpus(cfg)) == 2  # the store is not touched when the file is here
    with pytest.raises(ValueError, match="corpus_uri"):
        load_corpus(ToolboxConfig(corpus_path=NOT_ON_THIS_NODE))


def test_miniweb_bind_field_reaches_the_server(monkeypatch, corpus_file):
    bound = []

    class RecordingServer(miniweb_mod.ThreadingHTTPServer):
        def __init__(self, address, handler):
            bound.append(address)
            super().__init__(("127.0.0.1", address[1]), handler)  # the test itself stays on loopback

    monkeypatch.setattr(miniweb_mod, "ThreadingHTTPServer", RecordingServer)
    cfg = ToolboxConfig(miniweb_bind="0.0.0.0", miniweb_advertise="10.0.0.7")
    with serve_corpus(cfg, corpus_file, corpus_uri="s3://b/p/corpus.jsonl") as served:
        assert bound == [("0.0.0.0", 0)]
        assert served.crawl_resolve["miniweb.local"].startswith("10.0.0.7:")
        assert served.corpus_uri == "s3://b/p/corpus.jsonl"


def test_default_bind_is_loopback_and_serves(corpus_file):
    cfg = ToolboxConfig()
    assert cfg.miniweb_bind == "127.0.0.1"
    with serve_corpus(cfg, corpus_file) as served:
        address = served.crawl_resolve["miniweb.local"]
        assert address.startswith("127.0.0.1:")
        with urllib.request.urlopen(f"http://{address}/wiki/Kato_Rimu", timeout=5) as resp:
            assert b"Kato Rimu was born in Velm." in resp.read()
    with MiniWeb({"/wiki/A": "a"}) as web:
        assert web._server.server_address[0] == "127.0.0.1"


def test_wildcard_bind_advertises_this_hosts_ip(monkeypatch):
    monkeypatch.setattr(miniweb_mod.socket, "gethostname", lambda: "worker-3")
    monkeypatch.setattr(miniweb_mod.socket, "gethostbyname", lambda name: {"worker-3": "10.4.0.12"}[name])
    assert advertised_host("0.0.0.0") == "10.4.0.12"
    assert advertised_host("127.0.0.1") == "127.0.0.1"
    assert advertised_host("0.0.0.0", "afm-driver.afm.svc") == "afm-driver.afm.svc"


def test_new_fields_do_not_change_the_tool_cache_key(corpus_file):
    base = build_toolbox(ToolboxConfig(tools=["web_search"], corpus_path=corpus_file))
    moved = build_toolbox(ToolboxConfig(tools=["web_search"], corpus_path=corpus_file, miniweb_bind="0.0.0.0",
                                        corpus_uri="s3://b/corpus.jsonl"))
    assert base.cache_key("web_search", "q") == moved.cache_key("web_search", "q")
