"""The `crawl_page` tool: fetch one or more URLs (split on `|`), turn HTML into text, optionally summarize.

    crawl = CrawlPage(allow_hosts={"miniweb.local"}, resolve={"miniweb.local": "127.0.0.1:8123"})
    crawl.run("http://miniweb.local/wiki/Kato_Rimu|http://miniweb.local/wiki/Oslo").text

Every URL and every redirect hop (at most `max_redirects`) passes `ssrf.check_url`; the connection goes to the
pinned IP it returns (see ssrf.py for what is and is not covered). The body is streamed and cut at `max_bytes`
(status "truncated"); the whole fetch, slow-drip servers included, is bounded by `timeout_s`. HTML is turned into
text by trafilatura; a plain tag strip is used only when trafilatura extracts nothing (tiny pages). text/plain is
returned as is; other content types are not read (status "unsupported_type").

`summarize(page_text, query) -> str` is an optional plain callable (the teacher passes its LLM); without it the
page text itself (cut to `max_chars`) is the observation. `query` is what `run(argument, query=...)` is given.
"""
from __future__ import annotations

import html
import http.client
import re
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from typing import Callable

import trafilatura

from agents.tools.base import ToolResult, truncate_middle
from agents.tools.ssrf import FetchTarget, UrlRefused, check_url

CRAWL_DESCRIPTION = (
    "crawl_page: read web pages. Put one or more URLs separated by | inside <crawl_page>...</crawl_page>; "
    "each page comes back as text (long pages are cut). Only URLs found in search results can be opened."
)
_HTML_TYPES = ("text/html", "application/xhtml+xml")
_STRIP_BLOCKS = re.compile(r"<(script|style|noscript)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]+>")


@dataclass
class PageFetch:
    url: str  # after redirects
    status: str  # ok | truncated | refused | timeout | error | unsupported_type | not_found
    content_type: str
    body: bytes
    message: str  # why, when status is not ok


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP connection whose Host header names `host` but whose socket goes to the pinned IP."""

    def __init__(self, target: FetchTarget, timeout: float):
        super().__init__(target.host, target.port, timeout=timeout)
        self.pinned = (target.connect_ip, target.connect_port)

    def connect(self) -> None:
        self.sock = socket.create_connection(self.pinned, self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to the pinned IP; certificate and SNI are checked against the URL's host name."""

    def __init__(self, target: FetchTarget, timeout: float):
        super().__init__(target.host, target.port, timeout=timeout, context=ssl.create_default_context())
        self.pinned = (target.connect_ip, target.connect_port)

    def connect(self) -> None:
        sock = socket.create_connection(self.pinned, self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def html_to_text(page: str) -> str:
    """Main text by trafilatura; a crude tag strip only when trafilatura finds nothing."""
    text = trafilatura.extract(page, include_comments=False, include_tables=True, favor_recall=True)
    if text and text.strip():
        return text.strip()
    stripped = _TAG.sub(" ", _STRIP_BLOCKS.sub(" ", page))
    return re.sub(r"\s+", " ", html.unescape(stripped)).strip()


class CrawlPage:
    name = "crawl_page"
    description = CRAWL_DESCRIPTION

    def __init__(self, allow_hosts: set[str] = frozenset({"miniweb.local"}), resolve: dict[str, str] | None = None,
                 allow_public: bool = False, max_bytes: int = 2_000_000, timeout_s: float = 10.0,
                 max_chars: int = 6000, max_redirects: int = 3,
                 summarize: Callable[[str, str], str] | None = None):
        self.allow_hosts = {h.lower() for h in allow_hosts}
        self.resolve = {h.lower(): v for h, v in (resolve or {}).items()}
        for host, address in self.resolve.items():
            if not re.fullmatch(r"\[?[0-9a-fA-F.:]+\]?:[0-9]{1,5}", address):
                raise ValueError(f"crawl_resolve['{host}'] = '{address}': expected 'IP:PORT', e.g. '127.0.0.1:8123'")
        self.allow_public = allow_public
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.max_chars = max_chars
        self.max_redirects = max_redirects
        self.summarize = summarize

    def fetch(self, url: str) -> PageFetch:
        """GET `url` with redirects re-checked per hop; never raises."""
        deadline = time.monotonic() + self.timeout_s
        for _hop in range(self.max_redirects + 1):
            try:
                target = check_url(url, self.allow_hosts, self.resolve, self.allow_public)
            except UrlRefused as exc:
                return PageFetch(url, "refused", "", b"", str(exc))
            try:
                fetched = self._fetch_once(target, deadline)
            except (TimeoutError, socket.timeout):
                return PageFetch(url, "timeout", "", b"", f"no complete answer within {self.timeout_s:g} s")
            except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: http.client.InvalidURL
                return PageFetch(url, "error", "", b"", f"fetch failed: {exc.__class__.__name__}: {exc}")
            if isinstance(fetched, str):  # a redirect: the next hop's URL
                url = urllib.parse.urljoin(url, fetched)
                continue
            return fetched
        return PageFetch(url, "refused", "", b"", f"more than {self.max_redirects} redirects")

    def _fetch_once(self, target: FetchTarget, deadline: float) -> PageFetch | str:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        connection_cls = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
        conn = connection_cls(target, timeout=remaining)
        try:
            conn.request("GET", target.request_path, headers={"User-Agent": "afm-crawl/1", "Accept": "text/html"})
            sock = conn.sock  # getresponse() may drop conn.sock (Connection: close); the response still reads it
            response = conn.getresponse()
            if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                return response.getheader("Location")
            if response.status == 404:
                return PageFetch(target.url, "not_found", "", b"", "HTTP 404: page not found")
            if response.status >= 400:
                return PageFetch(target.url, "error", "", b"", f"HTTP {response.status}")
            content_type = (response.getheader("Content-Type") or "").split(";")[0].strip().lower()
            if content_type not in _HTML_TYPES and content_type != "text/plain":
                return PageFetch(target.url, "unsupported_type", content_type, b"",
                                 f"content type '{content_type or 'none'}' is not a web page (HTML or plain text)")
            body = bytearray()
            while len(body) <= self.max_bytes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                # read1 returns what is available, so a slow-drip server cannot hold one read past the deadline
                chunk = response.read1(65536)
                if not chunk:
                    return PageFetch(target.url, "ok", content_type, bytes(body), "")
                body += chunk
            return PageFetch(target.url, "truncated", content_type, bytes(body[: self.max_bytes]),
                             f"body larger than {self.max_bytes} bytes; only the first {self.max_bytes} were read")
        finally:
            conn.close()

    def read_page(self, url: str, query: str) -> ToolResult:
        fetched = self.fetch(url)
        if fetched.status not in ("ok", "truncated"):
            return ToolResult(f"[{fetched.status}] {url}: {fetched.message}", fetched.status)
        raw = fetched.body.decode("utf-8", errors="replace")
        text = raw.strip() if fetched.content_type == "text/plain" else html_to_text(raw)
        if not text:
            return ToolResult(f"[error] {url}: the page has no readable text", "error")
        if self.summarize is not None:
            try:
                text = self.summarize(text, query)
            except Exception as exc:  # an LLM backend failure must not end the rollout: fall back to the page text
                text = f"[summary failed: {exc.__class__.__name__}: {exc}]\n{text}"
        note = f"\n[truncated] {fetched.message}" if fetched.status == "truncated" else ""
        return ToolResult(truncate_middle(text, self.max_chars) + note, fetched.status)

    def run(self, argument: str, query: str = "") -> ToolResult:
        urls = [u.strip() for u in argument.split("|") if u.strip()]
        if not urls:
            return ToolResult("crawl_page: no URL given; write one or more URLs separated by |.", "error")
        pages = [self.read_page(url, query) for url in urls]
        if len(pages) == 1:
            return pages[0]
        text = "\n\n".join(f"Page {i}: {url}\n{page.text}" for i, (url, page) in enumerate(zip(urls, pages), 1))
        ok = [p for p in pages if p.status in ("ok", "truncated")]
        # mixed outcomes: the observation still carries every page's own status line
        return ToolResult(text, "ok" if ok else pages[0].status)
