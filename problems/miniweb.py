"""The mini-web: a local HTTP server for the generated world's pages (`/wiki/<Slug>`), so crawl_page does real HTTP.

Pages use the stable host `miniweb.local` in their URLs; the crawl tool maps that host to this server's real
`HOST:PORT`. Only GET/HEAD of known paths are served; anything else is 404. It binds 127.0.0.1 by default
(`ToolboxConfig.miniweb_bind`: 0.0.0.0 or a node IP lets actors on other nodes of a cluster crawl it) and is
not hardened for untrusted networks (no TLS, no rate limits): keep a non-loopback bind on a private network.

Usage:
    with MiniWeb(world_html(world)) as web:          # port 0: the OS picks a free port
        urllib.request.urlopen(f"http://{web.address}/wiki/Kato_Rimu")
    python -m problems.miniweb --corpus corpus.jsonl --port 8765   # serve a corpus JSONL's pages until Ctrl-C
"""
from __future__ import annotations

import argparse
import html
import json
import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def corpus_pages(path: str | Path) -> dict[str, str]:
    """`{path: html}` from a corpus JSONL (`{title, url, text, page_text?}` rows, as `world_corpus` writes them).
    The page shows `page_text` when present (the whole page), else `text`. A bad row raises naming file and line."""
    pages: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                title, url = row["title"], row["url"]
                body = row.get("page_text") or row["text"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a corpus row with title, url, text ({exc!r}); "
                                 "write the corpus with problems.world.world_corpus") from None
            page_path = urlsplit(url).path
            pages[page_path] = (
                f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title></head>\n"
                f"<body><h1>{html.escape(title)}</h1>\n<p>{html.escape(body)}</p>\n</body></html>\n"
            )
    return pages


def advertised_host(bind: str, advertise: str = "") -> str:
    """The host other processes put in crawl_resolve: `advertise`, else `bind`, else (a wildcard bind) this
    host's IP as its name resolves (in a Kubernetes pod: the pod IP)."""
    if advertise:
        return advertise
    if bind not in ("", "0.0.0.0", "::"):
        return bind
    return socket.gethostbyname(socket.gethostname())


class MiniWeb:
    """A ThreadingHTTPServer on `host` (default 127.0.0.1) serving `pages` (`{"/wiki/<Slug>": html}`); a context
    manager. `address` is `advertise_host:port` (see `advertised_host`)."""

    def __init__(self, pages: dict[str, str], port: int = 0, host: str = "127.0.0.1", advertise_host: str = ""):
        self.pages = dict(pages)
        self.port = port
        self.host = host
        self.advertise_host = advertise_host
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        if self._server is None:
            raise RuntimeError("MiniWeb is not started; call start() or use it as a context manager")
        return f"{advertised_host(self.host, self.advertise_host)}:{self._server.server_address[1]}"

    def start(self) -> "MiniWeb":
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def _respond(self, send_body: bool) -> None:
                page = pages.get(unquote(urlsplit(self.path).path)) if self.path.startswith("/wiki/") else None
                status, body = (200, page) if page is not None else (404, "<html><body>Not found</body></html>")
                data = body.encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if send_body:
                    self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self._respond(send_body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                self._respond(send_body=False)

            def log_message(self, format: str, *args) -> None:  # keep rollout logs quiet
                pass

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="miniweb", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = self._thread = None

    def __enter__(self) -> "MiniWeb":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a corpus JSONL's pages at /wiki/<Slug>.")
    parser.add_argument("--corpus", required=True, help="corpus JSONL written by problems.world.world_corpus")
    parser.add_argument("--port", type=int, default=0, help="port (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: reachable from other nodes)")
    args = parser.parse_args(argv)
    web = MiniWeb(corpus_pages(args.corpus), port=args.port, host=args.host).start()
    print(f"serving {len(web.pages)} pages at http://{web.address}/wiki/", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        web.stop()


if __name__ == "__main__":
    main()


@contextmanager
def serve_corpus(toolbox_cfg, corpus_path: str | Path, corpus_uri: str = ""):
    """Start a mini-web over `corpus_path` (on `toolbox_cfg.miniweb_bind`) and yield `toolbox_cfg` pointed at it
    (search index = the corpus, `miniweb.local` resolved to the server's advertised address). `corpus_uri`, the
    same file in the artifact store, lets tool actors on other nodes load the index from there. Used wherever
    tools run outside distillation (RL, eval, serving)."""
    with MiniWeb(corpus_pages(corpus_path), host=toolbox_cfg.miniweb_bind,
                 advertise_host=toolbox_cfg.miniweb_advertise) as web:
        yield toolbox_cfg.model_copy(update={
            "corpus_path": Path(corpus_path), "corpus_uri": corpus_uri or toolbox_cfg.corpus_uri,
            "crawl_resolve": {**toolbox_cfg.crawl_resolve, "miniweb.local": web.address},
        })
