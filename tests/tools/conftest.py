"""Fixtures for tool tests: a tiny corpus and a real local HTTP server on 127.0.0.1 (the "mini-web").

The server's routes are plain Python callables `path -> (status, headers, body_iterable)`; it is started on port 0
and shut down in teardown.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterable

import pytest

CORPUS = [
    {"id": "1", "title": "Kato Rimu", "url": "http://miniweb.local/wiki/Kato_Rimu",
     "text": "Kato Rimu is a painter. Kato Rimu was born in Velmora, a harbour city of Ostria."},
    {"id": "2", "title": "Velmora", "url": "http://miniweb.local/wiki/Velmora",
     "text": "Velmora is the largest harbour city of Ostria. Its mayor is Lin Aster."},
    {"id": "3", "title": "Ostria", "url": "http://miniweb.local/wiki/Ostria",
     "text": "Ostria is a country. Its capital is Durn and its currency is the ostrian mark."},
    {"id": "4", "title": "Lin Aster", "url": "http://miniweb.local/wiki/Lin_Aster",
     "text": "Lin Aster is a politician and the mayor of Velmora since 2019."},
    {"id": "5", "title": "Durn", "url": "http://miniweb.local/wiki/Durn",
     "text": "Durn is the capital of Ostria, founded on the river Sel."},
]

Route = Callable[[], tuple[int, dict[str, str], Iterable[bytes]]]


def html_page(title: str, body: str) -> bytes:
    return (f"<html><head><title>{title}</title><script>var secret=1;</script></head><body><nav>Home | About</nav>"
            f"<article><h1>{title}</h1><p>{body}</p></article><footer>(c) miniweb</footer></body></html>").encode()


class LocalServer:
    """ThreadingHTTPServer on 127.0.0.1:0 serving `routes` (path -> Route); records the paths requested."""

    def __init__(self, routes: dict[str, Route]):
        self.routes = routes
        self.requests: list[tuple] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def _serve(self, method: str):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                server.requests.append((method, self.path, body, self.headers))
                route = server.routes.get(self.path.split("?")[0])
                if route is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status, headers, chunks = route(self)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                try:
                    for chunk in chunks:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading (size cap / timeout): expected

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def static(body: bytes, content_type: str = "text/html; charset=utf-8", status: int = 200,
           extra: dict | None = None) -> Route:
    return lambda handler: (status, {"Content-Type": content_type, "Content-Length": str(len(body)), **(extra or {})},
                            [body])


def redirect(location: str) -> Route:
    return lambda handler: (302, {"Location": location, "Content-Length": "0"}, [])


def endless(content_type: str = "text/html") -> Route:
    """A body that never ends (no Content-Length): the size cap must stop the reader."""
    def chunks():
        yield b"<html><body><p>"
        while True:
            yield b"spam " * 2000
    return lambda handler: (200, {"Content-Type": content_type}, chunks())


def slow_drip(delay_s: float = 0.2) -> Route:
    """One byte per `delay_s`, forever: only a whole-fetch deadline stops it."""
    def chunks():
        while True:
            time.sleep(delay_s)
            yield b"x"
    return lambda handler: (200, {"Content-Type": "text/html"}, chunks())


def json_route(payload: dict) -> Route:
    return static(json.dumps(payload).encode(), content_type="application/json")


@pytest.fixture
def corpus_path(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in CORPUS) + "\n")
    return path


@pytest.fixture
def miniweb():
    """Mini-web with each corpus row as an HTML page, plus redirect/size/slow/type edge cases."""
    routes: dict[str, Route] = {}
    for row in CORPUS:
        routes[row["url"].removeprefix("http://miniweb.local")] = static(html_page(row["title"], row["text"]))
    routes["/plain"] = static(b"plain text page about Durn", content_type="text/plain")
    routes["/image.png"] = static(b"\x89PNG\r\n\x1a\n" + b"\0" * 100, content_type="image/png")
    routes["/doc.pdf"] = static(b"%PDF-1.4 ...", content_type="application/pdf")
    routes["/to-durn"] = redirect("/wiki/Durn")
    routes["/loop"] = redirect("/loop")
    routes["/huge"] = endless()
    routes["/slow"] = slow_drip()
    with LocalServer(routes) as server:
        yield server
