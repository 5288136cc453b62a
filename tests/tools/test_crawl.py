"""crawl_page against the real local mini-web: stable URLs via the resolve map, extraction, caps and statuses."""
from __future__ import annotations

import time

import pytest

from agents.tools.crawl import CrawlPage, html_to_text

pytestmark = pytest.mark.integration


def crawler(server, **kwargs) -> CrawlPage:
    return CrawlPage(allow_hosts={"miniweb.local"}, resolve={"miniweb.local": f"127.0.0.1:{server.port}"}, **kwargs)


def test_stable_url_is_served_through_the_resolve_map(miniweb):
    result = crawler(miniweb).run("http://miniweb.local/wiki/Kato_Rimu")
    assert result.status == "ok"
    assert "born in Velmora" in result.text
    assert "var secret" not in result.text  # scripts never reach the observation
    method, path, _, headers = miniweb.requests[-1]
    assert (method, path, headers["Host"]) == ("GET", "/wiki/Kato_Rimu", "miniweb.local")


def test_several_urls_split_on_pipe(miniweb):
    result = crawler(miniweb).run("http://miniweb.local/wiki/Durn | http://miniweb.local/wiki/Nowhere")
    assert result.status == "ok"
    assert "Page 1: http://miniweb.local/wiki/Durn" in result.text and "river Sel" in result.text
    assert "Page 2: http://miniweb.local/wiki/Nowhere\n[not_found]" in result.text
    assert crawler(miniweb).run(" | ").status == "error"


def test_redirect_within_allowlist_is_followed_and_loops_stop(miniweb):
    assert "river Sel" in crawler(miniweb).run("http://miniweb.local/to-durn").text
    looped = crawler(miniweb).run("http://miniweb.local/loop")
    assert looped.status == "refused" and "more than 3 redirects" in looped.text
    assert sum(1 for r in miniweb.requests if r[1] == "/loop") == 4  # first request + 3 redirects, then stop


def test_oversize_body_is_cut_at_the_cap(miniweb):
    result = crawler(miniweb, max_bytes=50_000, max_chars=500).run("http://miniweb.local/huge")
    assert result.status == "truncated" and "only the first 50000" in result.text
    assert len(result.text) < 700


def test_slow_drip_server_is_bounded_by_the_deadline(miniweb):
    start = time.monotonic()
    result = crawler(miniweb, timeout_s=1.0).run("http://miniweb.local/slow")
    elapsed = time.monotonic() - start
    assert result.status == "timeout" and elapsed < 2.0


def test_non_html_content_is_not_read(miniweb):
    for path, kind in (("/image.png", "image/png"), ("/doc.pdf", "application/pdf")):
        result = crawler(miniweb).run(f"http://miniweb.local{path}")
        assert result.status == "unsupported_type" and kind in result.text
    plain = crawler(miniweb).run("http://miniweb.local/plain")
    assert plain.status == "ok" and plain.text == "plain text page about Durn"


def test_summarize_callback_gets_page_text_and_query(miniweb):
    seen = []

    def summarize(page_text: str, query: str) -> str:
        seen.append((page_text, query))
        return f"summary for {query}: {len(page_text)} chars"

    result = crawler(miniweb, summarize=summarize).run("http://miniweb.local/wiki/Velmora", query="mayor of Velmora")
    assert result.text.startswith("summary for mayor of Velmora:")
    assert "Lin Aster" in seen[0][0] and seen[0][1] == "mayor of Velmora"


def test_allowlisted_name_without_resolve_entry_uses_dns(miniweb):
    result = CrawlPage(allow_hosts={"localhost"}).run(f"http://localhost:{miniweb.port}/wiki/Durn")
    assert result.status == "ok" and "river Sel" in result.text
    assert miniweb.requests[-1][3]["Host"] == f"localhost:{miniweb.port}"


def test_bad_resolve_entry_names_the_field():
    with pytest.raises(ValueError, match=r"crawl_resolve\['miniweb.local'\]"):
        CrawlPage(resolve={"miniweb.local": "8123"})


def test_spaces_and_unicode_in_urls_are_encoded(miniweb):
    result = crawler(miniweb).run("http://miniweb.local/wiki/Kató Rimu?q=a b")
    assert result.status == "not_found"
    assert miniweb.requests[-1][1] == "/wiki/Kat%C3%B3%20Rimu?q=a%20b"


def test_unreachable_port_is_a_clear_error():
    result = CrawlPage(resolve={"miniweb.local": "127.0.0.1:9"}).run("http://miniweb.local/x")
    assert result.status == "error" and "fetch failed" in result.text


def test_tag_strip_fallback_when_trafilatura_finds_nothing():
    assert html_to_text("<html><body><script>x()</script><b>Hi</b> &amp; bye</body></html>") == "Hi & bye"
