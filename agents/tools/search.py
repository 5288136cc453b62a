"""Search tools: local BM25 over a JSONL corpus, and HTTP adapters for Serper and SearXNG.

All three return the same observation text as the AFM search server:

    Found 2 results:

    1. [Kato Rimu](http://miniweb.local/wiki/Kato_Rimu)
    Kato Rimu was born in ...

`BM25Search` serves both `web_search` and `wiki_search` (pass `name=`). Corpus rows are `{id, title, url, text}`.

    search = BM25Search(read_corpus(Path("corpus.jsonl")), top_k=3, snippet_chars=200)
    print(search.run("where was Kato Rimu born").text)
"""
from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import bm25s

from agents.tools.base import ToolResult

SEARCH_DESCRIPTION = (
    "{tag}: search {where} for a query. Put the query inside <{tag}>...</{tag}>. Returns up to {k} results, "
    "each a [title](url) line followed by a snippet; open a result with crawl_page when the snippet is not enough."
)

_WORD = re.compile(r"\w+")


def read_corpus(path: Path) -> list[dict]:
    """Read a JSONL corpus of `{id, title, url, text}` rows; a bad line raises naming file and line."""
    rows = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{line_no}: not valid JSON ({exc})") from None
        missing = {"id", "title", "url", "text"} - set(row)
        if missing:
            raise ValueError(f"{path}:{line_no}: missing field(s) {sorted(missing)}; each row needs id, title, url, text")
        rows.append(row)
    return rows


def format_results(query: str, hits: list[dict]) -> ToolResult:
    """AFM result text from hits `{title, url, snippet, date?}`; no hits -> status "not_found"."""
    if not hits:
        return ToolResult(f"No results found for '{query}'. Try a different query.", "not_found")
    lines = [f"Found {len(hits)} results:", ""]
    for rank, hit in enumerate(hits, start=1):
        lines.append(f"{rank}. [{hit['title']}]({hit['url']})")
        if hit.get("date"):
            lines.append(f"Date published: {hit['date']}")
        lines.append(hit["snippet"])
        lines.append("")
    return ToolResult("\n".join(lines).rstrip() + "\n", "ok")


def best_snippet(text: str, query: str, snippet_chars: int) -> str:
    """The window of `text` (sentence-aligned start) sharing the most words with `query`."""
    if len(text) <= snippet_chars:
        return text
    query_words = {w.lower() for w in _WORD.findall(query)}
    starts = [0] + [m.end() for m in re.finditer(r"[.!?]\s+", text)]
    best_start, best_score = 0, -1
    for start in starts:
        window = text[start:start + snippet_chars]
        score = sum(1 for w in _WORD.findall(window) if w.lower() in query_words)
        if score > best_score:
            best_start, best_score = start, score
    snippet = text[best_start:best_start + snippet_chars]
    return ("..." if best_start else "") + snippet + "..."


class BM25Search:
    """BM25 (bm25s, English stopwords) over title + text of a local corpus."""

    def __init__(self, corpus: list[dict], top_k: int, snippet_chars: int, name: str = "web_search"):
        if not corpus:
            raise ValueError(f"{name}: the corpus is empty; point corpus_path at a JSONL file with rows")
        self.name = name
        self.top_k = top_k
        self.snippet_chars = snippet_chars
        where = "Wikipedia" if name == "wiki_search" else "the web"
        self.description = SEARCH_DESCRIPTION.format(tag=name, where=where, k=top_k)
        self.corpus = corpus
        self.retriever = bm25s.BM25()
        tokens = bm25s.tokenize([f"{row['title']}\n{row['text']}" for row in corpus], stopwords="en", show_progress=False)
        self.retriever.index(tokens, show_progress=False)

    def run(self, argument: str) -> ToolResult:
        query = argument.strip()
        if not query:
            return ToolResult(f"{self.name}: empty query; write the query inside the tag.", "error")
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:  # only stopwords/punctuation: nothing to match
            return format_results(query, [])
        k = min(self.top_k, len(self.corpus))
        doc_ids, scores = self.retriever.retrieve(tokens, k=k, show_progress=False)
        hits = []
        for doc_id, score in zip(doc_ids[0], scores[0]):
            if score <= 0:  # bm25s pads with zero-score documents that share no term with the query
                continue
            row = self.corpus[int(doc_id)]
            hits.append({"title": row["title"], "url": row["url"],
                         "snippet": best_snippet(row["text"], query, self.snippet_chars)})
        return format_results(query, hits)


def _http_json(request: urllib.request.Request, timeout_s: float, name: str) -> tuple[dict | None, ToolResult | None]:
    """Send `request`, parse JSON; on failure return a ToolResult that says why."""
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read().decode("utf-8")), None
    except urllib.error.HTTPError as exc:
        return None, ToolResult(f"{name}: search backend answered HTTP {exc.code}", "error")
    except TimeoutError:
        return None, ToolResult(f"{name}: search backend did not answer within {timeout_s} s", "timeout")
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            return None, ToolResult(f"{name}: search backend did not answer within {timeout_s} s", "timeout")
        return None, ToolResult(f"{name}: search backend unreachable ({exc.reason})", "error")
    except json.JSONDecodeError:
        return None, ToolResult(f"{name}: search backend returned non-JSON", "error")


class SerperSearch:
    """Serper API (POST JSON `{q, num}`, header X-API-KEY; answer `{"organic": [{title, link, snippet, date?}]}`)."""

    def __init__(self, endpoint: str, api_key_env: str, top_k: int = 10, timeout_s: float = 20.0,
                 name: str = "web_search"):
        self.name = name
        self.endpoint = endpoint
        self.api_key_env = api_key_env
        self.top_k = top_k
        self.timeout_s = timeout_s
        self.description = SEARCH_DESCRIPTION.format(tag=name, where="the web", k=top_k)

    def run(self, argument: str) -> ToolResult:
        query = argument.strip()
        if not query:
            return ToolResult(f"{self.name}: empty query; write the query inside the tag.", "error")
        api_key = os.environ.get(self.api_key_env)
        if not api_key:
            return ToolResult(f"{self.name}: environment variable {self.api_key_env} (Serper API key) is not set", "error")
        body = json.dumps({"q": query, "num": self.top_k}).encode()
        request = urllib.request.Request(self.endpoint, data=body, method="POST",
                                         headers={"X-API-KEY": api_key, "Content-Type": "application/json"})
        data, failure = _http_json(request, self.timeout_s, self.name)
        if failure:
            return failure
        hits = [{"title": item.get("title", ""), "url": item.get("link", ""), "snippet": item.get("snippet", ""),
                 "date": item.get("date")} for item in data.get("organic", [])[: self.top_k]]
        return format_results(query, hits)


class SearxngSearch:
    """SearXNG JSON API (GET `{endpoint}/search?q=..&format=json`; answer `{"results": [{url, title, content}]}`)."""

    def __init__(self, endpoint: str, top_k: int = 10, timeout_s: float = 20.0, name: str = "web_search"):
        self.name = name
        self.endpoint = endpoint.rstrip("/")
        self.top_k = top_k
        self.timeout_s = timeout_s
        self.description = SEARCH_DESCRIPTION.format(tag=name, where="the web", k=top_k)

    def run(self, argument: str) -> ToolResult:
        query = argument.strip()
        if not query:
            return ToolResult(f"{self.name}: empty query; write the query inside the tag.", "error")
        url = f"{self.endpoint}/search?" + urllib.parse.urlencode({"q": query, "format": "json"})
        data, failure = _http_json(urllib.request.Request(url), self.timeout_s, self.name)
        if failure:
            return failure
        hits = [{"title": item.get("title", ""), "url": item.get("url", ""), "snippet": item.get("content", ""),
                 "date": item.get("publishedDate")} for item in data.get("results", [])[: self.top_k]]
        return format_results(query, hits)
