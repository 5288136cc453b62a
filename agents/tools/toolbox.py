"""ToolBox: dispatch a CoA tool tag to its tool, cache results on disk, describe the tools for prompts.

    cfg = ToolboxConfig(corpus_path=Path("data/corpus.jsonl"), crawl_resolve={"miniweb.local": "127.0.0.1:8123"})
    toolbox = build_toolbox(cfg)
    toolbox.call("web_search", "Kato Rimu")      # ToolResult(text="Found 3 results: ...", status="ok")
    toolbox.describe()                           # one paragraph per tool, for the system prompt

`call` never raises for tool failures: unknown tags, tool errors and even exceptions a tool raises come back as a
ToolResult with a failure status ("error" for the latter two, with the exception named).
The cache key is sha256(tag, argument, tool config), one JSON file per key, written temp + rename; a re-run with
the same config does not re-query. Timeouts are not cached (they are usually transient: load, a slow server).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Literal

from pydantic import Field

from afm.config import Config
from afm.storage import MANIFEST_NAME, open_store, sha256_file
from agents.tools.base import Tool, ToolResult
from agents.tools.code import CodeTool
from agents.tools.crawl import CrawlPage
from agents.tools.sandbox import SandboxLimits
from agents.tools.search import BM25Search, SearxngSearch, SerperSearch, read_corpus

_UNCACHED_STATUSES = {"timeout"}


class ToolBox:
    def __init__(self, tools: dict[str, Tool], cache_dir: Path | None, config_fingerprint: str = ""):
        for tag, tool in tools.items():
            if tool.name != tag:
                raise ValueError(f"ToolBox: tool registered as '{tag}' has name '{tool.name}'; they must match")
        self.tools = tools
        self.cache_dir = cache_dir
        self.config_fingerprint = config_fingerprint
        if cache_dir is not None:
            cache_dir.mkdir(parents=True, exist_ok=True)

    def cache_key(self, tag: str, argument: str) -> str:
        payload = json.dumps([tag, argument, self.config_fingerprint])
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def call(self, tag: str, argument: str) -> ToolResult:
        tool = self.tools.get(tag)
        if tool is None:
            return ToolResult(f"Unknown tool '{tag}'. Available tools: {', '.join(sorted(self.tools))}.", "error")
        cache_file = self.cache_dir / f"{self.cache_key(tag, argument)}.json" if self.cache_dir else None
        if cache_file is not None and cache_file.exists():
            cached = json.loads(cache_file.read_text(encoding="utf-8"))
            return ToolResult(cached["text"], cached["status"])
        try:
            result = tool.run(argument)
        except Exception as exc:  # a tool bug must cost one observation, not the whole rollout; never cached
            return ToolResult(f"{tag} failed: {exc.__class__.__name__}: {exc}", "error")
        if cache_file is not None and result.status not in _UNCACHED_STATUSES:
            self._write_atomic(cache_file, {"tag": tag, "argument": argument, "text": result.text,
                                            "status": result.status})
        return result

    def _write_atomic(self, path: Path, record: dict) -> None:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        os.replace(tmp, path)

    def describe(self) -> str:
        return "\n".join(f"- {tool.description}" for tool in self.tools.values())


class ToolboxConfig(Config):
    """Which tools exist and their limits. Tags: web_search, wiki_search, crawl_page, code."""

    tools: list[Literal["web_search", "wiki_search", "crawl_page", "code"]] = Field(
        default_factory=lambda: ["web_search", "crawl_page", "code"], description="Tool tags to enable")
    corpus_path: Path | None = Field(None, description="JSONL {id,title,url,text} for the local search backend")
    corpus_uri: str = Field("", description="The same corpus in the artifact store (s3://bucket/.../corpus.jsonl, "
                                            "file:///... or a path): read from there when corpus_path is not on "
                                            "this node (a Ray actor on another node). Empty: corpus_path only")
    search_top_k: int = Field(3, description="Results per search (AFM uses 10; the tiny corpus wants ~3)")
    snippet_chars: int = Field(200, description="Snippet length per search result")
    web_search_backend: Literal["local", "serper", "searxng"] = Field("local", description="Backend of web_search")
    web_search_endpoint: str = Field("", description="Serper/SearXNG endpoint URL (unused for local)")
    web_search_api_key_env: str = Field("SERPER_API_KEY", description="Env var holding the Serper API key")
    crawl_allow_hosts: list[str] = Field(default_factory=lambda: ["miniweb.local"],
                                         description="Hosts crawl_page may fetch (private addresses allowed for them)")
    crawl_resolve: dict[str, str] = Field(default_factory=dict,
                                          description='host -> "127.0.0.1:PORT" where it is served (like curl --resolve)')
    miniweb_bind: str = Field("127.0.0.1", description="Address the mini-web (problems/miniweb.py) listens on. "
                                                        "127.0.0.1: actors on this node only; 0.0.0.0 or this "
                                                        "node's IP: actors on other nodes too (cluster; no TLS/auth, "
                                                        "keep it on a private network)")
    miniweb_advertise: str = Field("", description="Host or IP other nodes use to reach the mini-web (written into "
                                                   "crawl_resolve). Empty: miniweb_bind, or this host's IP "
                                                   "(gethostbyname(gethostname())) when binding 0.0.0.0")
    crawl_allow_public: bool = Field(False, description="Also fetch non-allowlisted hosts with public addresses")
    crawl_max_bytes: int = Field(2_000_000, description="Body size cap per page (status truncated beyond)")
    crawl_timeout_s: float = Field(10.0, description="Whole-fetch time limit per URL, redirects included")
    crawl_max_chars: int = Field(6000, description="Page text kept per URL in the observation")
    code_timeout_s: float = Field(30.0, description="Wall clock limit per code run (AFM: 30 s)")
    code_memory_mb: int = Field(1024, description="Address-space limit per code run, MiB")
    code_max_output_chars: int = Field(1500, description="Observation chars for code output (AFM ~1.5k)")
    cache_dir: Path | None = Field(None, description="Directory for the on-disk result cache; None = no cache")


def fetch_corpus(uri: str, cache_root: Path | None = None) -> Path:
    """A local copy of the corpus file at store URI `uri` (`s3://bucket/prefix/corpus.jsonl`, `file:///...`, a
    path), downloaded once per node under `cache_root` (default: the temp dir) and reused. When the file's
    directory is an artifact with a manifest, the copy is checked against the manifest's sha256."""
    root, _, name = uri.rstrip("/").rpartition("/")
    if not root or not name:
        raise ValueError(f"corpus_uri {uri!r}: expected <store URI>/<file>, e.g. s3://afm/artifacts/stages/"
                         "distill-<key>/corpus.jsonl")
    store = open_store(root)
    cache_root = cache_root or Path(tempfile.gettempdir()) / "afm-corpus"
    target = cache_root / hashlib.sha256(uri.encode()).hexdigest()[:16] / name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{name}.{os.getpid()}.tmp")
    store.download_file(name, tmp)
    manifest = json.loads(store.get_bytes(MANIFEST_NAME)) if store.exists(MANIFEST_NAME) else {}
    expected = manifest.get("files", {}).get(name)
    if expected and sha256_file(tmp) != expected["sha256"]:
        tmp.unlink()
        raise ValueError(f"corpus_uri {uri!r}: the downloaded file does not match its manifest's sha256")
    os.replace(tmp, target)  # several actors on one node may race here: each rename is atomic
    return target


def load_corpus(cfg: ToolboxConfig) -> list[dict]:
    """The search corpus: `corpus_path` when this node has it, else `corpus_uri` read from the artifact store."""
    if cfg.corpus_path is not None and Path(cfg.corpus_path).is_file():
        return read_corpus(Path(cfg.corpus_path))
    if cfg.corpus_uri:
        return read_corpus(fetch_corpus(cfg.corpus_uri))
    if cfg.corpus_path is not None:
        raise ValueError(f"ToolboxConfig: corpus_path {str(cfg.corpus_path)!r} is not on this node and corpus_uri is "
                         "empty; set corpus_uri to the corpus in the artifact store (s3://.../corpus.jsonl)")
    raise ValueError("ToolboxConfig: field 'corpus_path' (or 'corpus_uri') is required for the local search backend")


def build_toolbox(cfg: ToolboxConfig,
                  summarize: Callable[[str, str], str] | None = None) -> ToolBox:
    """Build the enabled tools from `cfg`; `summarize` is passed to crawl_page (see crawl.py)."""
    tools: dict[str, Tool] = {}
    corpus = None
    if "web_search" in cfg.tools or "wiki_search" in cfg.tools:
        if cfg.web_search_backend == "local" or "wiki_search" in cfg.tools:
            corpus = load_corpus(cfg)
    if "web_search" in cfg.tools:
        if cfg.web_search_backend == "local":
            tools["web_search"] = BM25Search(corpus, cfg.search_top_k, cfg.snippet_chars, name="web_search")
        elif cfg.web_search_backend == "serper":
            tools["web_search"] = SerperSearch(cfg.web_search_endpoint or "https://google.serper.dev/search",
                                               cfg.web_search_api_key_env, top_k=cfg.search_top_k)
        else:
            if not cfg.web_search_endpoint:
                raise ValueError("ToolboxConfig: field 'web_search_endpoint' is required for the searxng backend")
            tools["web_search"] = SearxngSearch(cfg.web_search_endpoint, top_k=cfg.search_top_k)
    if "wiki_search" in cfg.tools:
        tools["wiki_search"] = BM25Search(corpus, cfg.search_top_k, cfg.snippet_chars, name="wiki_search")
    if "crawl_page" in cfg.tools:
        tools["crawl_page"] = CrawlPage(set(cfg.crawl_allow_hosts), cfg.crawl_resolve, cfg.crawl_allow_public,
                                        cfg.crawl_max_bytes, cfg.crawl_timeout_s, cfg.crawl_max_chars,
                                        summarize=summarize)
    if "code" in cfg.tools:
        limits = SandboxLimits(timeout_s=cfg.code_timeout_s, cpu_s=int(cfg.code_timeout_s) + 1,
                               memory_mb=cfg.code_memory_mb)
        tools["code"] = CodeTool(limits, max_output_chars=cfg.code_max_output_chars)
    # crawl_resolve ports change per run, but the pages behind stable URLs do not: keep them out of the key (so
    # are where the corpus and mini-web live: the same corpus gives the same results)
    fingerprint = cfg.model_dump_json(exclude={"cache_dir", "crawl_resolve", "corpus_uri", "miniweb_bind",
                                               "miniweb_advertise"})
    return ToolBox(tools, cfg.cache_dir, config_fingerprint=fingerprint)
